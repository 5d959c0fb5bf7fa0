"""Reviewer identity (``review.auth``; docs/security.md, "Reviewer identity"), on a real
ReviewServer and SQLite store with real HTTP clients: per-reviewer tokens
(``review.tokens_file``) and a trusted auth proxy's header name the reviewer, and the
name replaces the self-typed ``reviewer`` of every verdict, on the API and on the
page's routes; a proxy header from an untrusted address is ignored (401); and
``relmon check-config`` names every unusable setting."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.review.review import ReviewServer
from adapters.review.review_auth import ReviewAuth
from adapters.review.review_page import ReviewPage
from adapters.sqlite.store import SqliteStore
from monitor.app.cli import main
from monitor.app.wiring import build_review_auth
from monitor.config import load_settings
from monitor.core.errors import ConfigError
from tests.review.test_review_api import TOKEN, Handler, item

ANN, BOB = "ann-token-0123456789abcdef", "bob-token-fedcba9876543210"
TOKENS_FILE = f"# reviewers of the qa team\nann@example.com:{ANN}\n\nbob:{BOB}\n"
EMAIL = "X-Auth-Request-Email"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


Call = Callable[..., Awaitable[tuple[int, Any]]]


@asynccontextmanager
async def serving(tmp_path: Path, auth: ReviewAuth) -> AsyncIterator[tuple[Call, SqliteStore]]:
    """A review server (page included, no undo window) with ``auth``; yields a caller
    ``call(method, path, headers, body=None) -> (status, json)`` and the store."""
    store = SqliteStore(tmp_path / "relmon.db")
    handler = Handler(store)
    page = ReviewPage(store=store, handler=handler, undo_s=0)
    server = ReviewServer(store=store, handler=handler, auth=auth, port=0, page=page)
    await server.start()
    base = f"http://127.0.0.1:{server.bound_port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def call(
                method: str, path: str, headers: dict[str, str], body: Any = None
            ) -> tuple[int, Any]:
                data = None if body is None else json.dumps(body).encode()
                async with http.request(method, base + path, data=data, headers=headers) as r:
                    text = await r.text()
                    return r.status, json.loads(text) if text else None

            yield call, store
    finally:
        await server.stop()
        await store.aclose()


def settings_with(tmp_path: Path, review: str) -> Any:
    config = tmp_path / "relmon.yaml"
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\nreview: {review}\n"
        "tasks: [{name: qa, endpoint: {base_url: 'http://127.0.0.1:1/v1', model: m}}]\n"
    )
    return config


async def test_per_reviewer_tokens_name_the_reviewer_on_the_api_and_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELMON_REVIEW_TOKEN", raising=False)
    (tmp_path / "tokens").write_text(TOKENS_FILE)
    config = settings_with(tmp_path, f"{{token: {TOKEN}, tokens_file: {tmp_path / 'tokens'}}}")
    auth = build_review_auth(load_settings(config))
    async with serving(tmp_path, auth) as (call, store):
        for n in "abc":
            await store.submit(item(f"qa:{n}"))
        assert await call("GET", "/api/whoami", bearer(ANN)) == (
            200,
            {"auth": "token", "reviewer": "ann@example.com"},
        )
        assert await call("GET", "/api/whoami", bearer(TOKEN)) == (
            200,
            {"auth": "token", "reviewer": None},
        )
        status, body = await call("GET", "/api/whoami", bearer(ANN[:-1] + "x"))
        assert status == 401 and body["auth"] == "token"
        # The token's reviewer wins over the typed name, on the API...
        typed = {"accepted_ranks": [1], "reviewer": "mallory"}
        assert (await call("POST", "/api/reviews/qa:a", bearer(ANN), typed))[0] == 200
        # ... and on the page's routes (lease, hold).
        status, leased = await call("GET", "/api/reviews/next?session=s1", bearer(BOB))
        assert status == 200 and leased["item_id"] == "qa:b"
        held = await call("POST", "/api/review-page/verdicts/qa:b?session=s1", bearer(BOB), typed)
        assert held[0] == 202
        # The shared token keeps the typed name.
        shared = {"none_of_these": True, "reviewer": "Carol"}
        assert (await call("POST", "/api/reviews/qa:c", bearer(TOKEN), shared))[0] == 200
        reviewers = {n: (await store.get_verdict(f"qa:{n}")).reviewer for n in "abc"}  # type: ignore[union-attr]
    assert reviewers == {"a": "ann@example.com", "b": "bob", "c": "Carol"}


async def test_only_the_reviewer_who_held_a_verdict_can_undo_it(tmp_path: Path) -> None:
    auth = ReviewAuth(token=None, reviewer_tokens={"ann": [ANN], "bob": [BOB]})
    store = SqliteStore(tmp_path / "relmon.db")
    handler = Handler(store)
    page = ReviewPage(store=store, handler=handler, undo_s=600)
    server = ReviewServer(store=store, handler=handler, auth=auth, port=0, page=page)
    await server.start()
    base = f"http://127.0.0.1:{server.bound_port}"
    try:
        await store.submit(item("qa:a"))
        url = f"{base}/api/review-page/verdicts/qa:a?session=same"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={"accepted_ranks": [1]}, headers=bearer(ANN)) as r:
                assert r.status == 202
            # Bob knows (or guesses) the session id: the verdict is still Ann's.
            async with http.delete(url, headers=bearer(BOB)) as r:
                assert r.status == 403
            async with http.delete(url, headers=bearer(ANN)) as r:
                assert r.status == 200
    finally:
        await server.stop()
        await store.aclose()


async def test_a_trusted_proxy_names_the_reviewer(tmp_path: Path) -> None:
    auth = ReviewAuth(mode="proxy")  # trusted: 127.0.0.1/32 and ::1/128
    async with serving(tmp_path, auth) as (call, store):
        for n in "abc":
            await store.submit(item(f"qa:{n}"))
        alice = {EMAIL: "alice@example.com"}
        assert await call("GET", "/api/whoami", alice) == (
            200,
            {"auth": "proxy", "reviewer": "alice@example.com"},
        )
        typed = {"accepted_ranks": [1], "reviewer": "mallory"}
        assert (await call("POST", "/api/reviews/qa:a", alice, typed))[0] == 200
        # The second header when the first is absent; the page's routes alike.
        dave = {"X-Forwarded-User": "dave"}
        assert (await call("GET", "/api/review-page/progress", dave))[0] == 200
        assert (await call("GET", "/api/reviews/next?session=s1", dave))[1]["item_id"] == "qa:b"
        held = await call("POST", "/api/review-page/verdicts/qa:b?session=s1", dave, typed)
        assert held[0] == 202
        # No header, a token instead, a name with a bidi override: 401, nothing stored.
        for headers in ({}, bearer(TOKEN), {EMAIL: "eve\u202eevil"}, {EMAIL: "  "}):
            status, body = await call("POST", "/api/reviews/qa:c", headers, typed)
            assert status == 401 and body["auth"] == "proxy", (headers, body)
        # A browser's cross-site request carries the proxy's cookie: refused.
        cross = {**alice, "Sec-Fetch-Site": "cross-site"}
        assert (await call("POST", "/api/reviews/qa:c", cross, typed))[0] == 403
        assert (await call("GET", "/api/whoami", cross))[0] == 200  # reading is harmless
        reviewers = {
            n: getattr(await store.get_verdict(f"qa:{n}"), "reviewer", None) for n in "abc"
        }
    assert reviewers == {"a": "alice@example.com", "b": "dave", "c": None}


async def test_proxy_headers_from_an_untrusted_address_are_ignored(tmp_path: Path) -> None:
    auth = ReviewAuth(mode="proxy", trusted_proxies=["10.0.0.0/8", "fd00::/8"])
    async with serving(tmp_path, auth) as (call, store):
        await store.submit(item("qa:a"))
        headers = {EMAIL: "alice@example.com", "X-Forwarded-User": "alice"}
        for method, path in (("GET", "/api/whoami"), ("GET", "/api/reviews/next")):
            status, body = await call(method, path, headers)
            assert status == 401 and "trusted_proxies" in body["error"]
        status, _ = await call("POST", "/api/reviews/qa:a", headers, {"accepted_ranks": [1]})
        assert status == 401
        assert await store.get_verdict("qa:a") is None


async def test_a_header_named_in_proxy_headers_is_the_one_believed(tmp_path: Path) -> None:
    auth = ReviewAuth(mode="proxy", proxy_headers=["X-Remote-User"])
    async with serving(tmp_path, auth) as (call, _):
        assert (await call("GET", "/api/whoami", {EMAIL: "alice@example.com"}))[0] == 401
        assert await call("GET", "/api/whoami", {"x-remote-user": "alice"}) == (
            200,
            {"auth": "proxy", "reviewer": "alice"},
        )


def test_review_auth_refuses_what_cannot_work() -> None:
    with pytest.raises(ConfigError, match="token"):
        ReviewAuth(token=" ")
    with pytest.raises(ConfigError, match="trusted_proxies"):
        ReviewAuth(mode="proxy", trusted_proxies=["10.0.0.1/8"])
    assert "ann-token" not in repr(ReviewAuth(reviewer_tokens={"ann": [ANN]}))


@pytest.mark.parametrize(
    ("review", "tokens", "expected"),
    [
        ("{tokens_file: TOKENS}", None, "review.tokens_file: cannot read"),
        ("{tokens_file: TOKENS}", "ann\n", "TOKENS:1: expected 'name:token'"),
        ("{tokens_file: TOKENS}", "ann:short\n", "TOKENS:1: the token of 'ann' is shorter"),
        ("{tokens_file: TOKENS}", f"a:{ANN}\nb:{ANN}\n", "TOKENS:2: 'b' has the same token"),
        ("{tokens_file: TOKENS}", f":{ANN}\n", "TOKENS:1: the reviewer's name is empty"),
        ("{tokens_file: TOKENS}", "# nobody\n", "review.tokens_file: TOKENS names no reviewer"),
        ("{auth: proxy, trusted_proxies: ['10.0.0.1/8']}", None, "review.trusted_proxies"),
        ("{auth: proxy, proxy_headers: ['X Email']}", None, "review.proxy_headers"),
        ("{auth: sso}", None, "review.auth"),
        ("{}", None, "review.tokens_file"),  # no token at all: the message names it
    ],
)
def test_check_config_names_the_field(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    capsys: pytest.CaptureFixture[str],
    review: str,
    tokens: str | None,
    expected: str,
) -> None:
    monkeypatch.delenv("RELMON_REVIEW_TOKEN", raising=False)
    path = tmp_path / "tokens"
    if tokens is not None:
        path.write_text(tokens)
    config = settings_with(tmp_path, review.replace("TOKENS", str(path)))
    assert main(["check-config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert expected.replace("TOKENS", str(path)) in err, err
    assert ANN not in err


def test_check_config_accepts_a_proxy_without_a_token_and_tokens_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RELMON_REVIEW_TOKEN", raising=False)
    proxy = "{auth: proxy, trusted_proxies: ['10.1.0.0/16', '::1'], proxy_headers: [X-User]}"
    assert main(["check-config", "--config", str(settings_with(tmp_path, proxy))]) == 0
    (tmp_path / "tokens").write_text(TOKENS_FILE)
    tokens_only = f"{{tokens_file: {tmp_path / 'tokens'}}}"
    assert main(["check-config", "--config", str(settings_with(tmp_path, tokens_only))]) == 0
    assert ANN not in capsys.readouterr().out
