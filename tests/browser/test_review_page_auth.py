"""Reviewer identity on the review page, in a real headless Chromium (launched as in
:mod:`tests.browser.test_review_page`): behind a trusted auth proxy the page needs no
token and reviews as the proxy's reviewer (the browser sends the proxy's header here,
from 127.0.0.1, a trusted address); with a per-reviewer token the page reviews as the
token's reviewer whatever name was typed; and every verdict records that reviewer."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from playwright.sync_api import Browser

from adapters.review.review_auth import ReviewAuth
from tests.browser.test_review_page import browser, http_get, new_tab, page_server, sign_in
from tests.review.test_review_api import item

__all__ = ["browser"]  # the fixture, used here

ANN = "ann-token-0123456789abcdef"
EMAIL = "X-Auth-Request-Email"


def as_alice(url: str) -> dict[str, object]:
    """What the API answers the proxy's reviewer (alice, from 127.0.0.1)."""
    request = urllib.request.Request(url, headers={EMAIL: "alice@example.com"})
    with urllib.request.urlopen(request, timeout=10) as r:
        answer: dict[str, object] = json.loads(r.read())
    return answer


def test_behind_a_trusted_proxy_the_page_reviews_as_the_proxys_reviewer(
    browser: Browser, tmp_path: Path
) -> None:
    auth = ReviewAuth(mode="proxy")
    items = [item("qa:a"), item("qa:b")]
    with page_server(tmp_path / "relmon.db", items, 60.0, auth=auth) as base:
        page = new_tab(browser)
        page.context.set_extra_http_headers({EMAIL: "alice@example.com"})
        sent: list[dict[str, str]] = []
        page.on("request", lambda r: sent.append(r.headers) if "/api/" in r.url else None)
        page.goto(f"{base}/review")
        page.wait_for_selector("#item[data-item='qa:a']")
        assert page.locator("#login").is_hidden() and page.locator("#logout").is_hidden()
        assert page.locator("#who bdi").text_content() == "alice@example.com"
        page.keyboard.press("1")
        page.keyboard.press("Enter")
        page.wait_for_selector("#item[data-item='qa:b']")
        assert not any("authorization" in h for h in sent)  # no token in proxy mode
        verdict = as_alice(f"{base}/api/reviews/qa:a")["verdict"]
        assert isinstance(verdict, dict) and verdict["reviewer"] == "alice@example.com"

        # The same page opened without the proxy's header: refused, and it says why.
        other = new_tab(browser)
        other.goto(f"{base}/review")
        other.locator("#status", has_text=re.compile(r"\S")).wait_for()  # no eval: CSP
        assert "proxy" in other.locator("#status").inner_text()
        assert other.locator("#login").is_hidden() and other.locator("#item").is_hidden()


def test_a_per_reviewer_token_names_the_reviewer_on_the_page(
    browser: Browser, tmp_path: Path
) -> None:
    auth = ReviewAuth(reviewer_tokens={"ann@example.com": [ANN]})
    with page_server(tmp_path / "relmon.db", [item("qa:a"), item("qa:b")], 60.0, auth=auth) as base:
        page = new_tab(browser)
        sign_in(page, base, ANN, "Someone Else")
        page.wait_for_selector("#item[data-item='qa:a']")
        assert page.locator("#who bdi").text_content() == "ann@example.com"
        page.keyboard.press("2")
        page.keyboard.press("Enter")
        page.wait_for_selector("#item[data-item='qa:b']")
        status, body = http_get(f"{base}/api/reviews/qa:a", ANN)
        verdict = json.loads(body)["verdict"]
        assert status == 200 and verdict["reviewer"] == "ann@example.com"
