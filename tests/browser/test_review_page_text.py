"""Text from users and models on the review page, in a real headless Chromium: a query,
candidates, a model name, an item id and a reviewer's name holding a right-to-left
override (U+202E) are each shown isolated (a ``<bdi>``, or an element with
``dir="auto"``), exactly as given, and cannot reorder the page's own words around them;
and the "measured with" list shows how the re-asks differed from the production request
(``reask_changes``), isolated too.

Launched as in :mod:`tests.browser.test_review_page` (Playwright, ``/usr/bin/chromium``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser

from tests.browser.test_review_page import TOKEN, browser, new_tab, page_server, sign_in
from tests.review.test_review_api import item

__all__ = ["browser"]  # the fixture, used here

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: reverses what follows it up to the paragraph end
HOSTILE = replace(
    item(f"qa:x{RLO}1"),
    model=f"m{RLO}odel",
    query=f"What is {RLO}6*7? (reads backwards)",
    candidates=((f"{RLO}42 sdrawkcab", 6), (f"41{RLO}", 3), ("40", 1)),
    reask_changes={
        "temperature": {"from": 0.0, "to": 0.5},
        "seed": {"from": 42},
        "top_k": {"to": 40},
        "metadata": {"from": "<object, 2 keys>"},
        "model": {"from": f"gpt{RLO}-4o", "to": "gpt-4o-mini"},
        "tools": {"unrecorded": True},
        "stop": {"to": "<list, 1 items>", "unrecorded": True},
    },
)
REVIEWER = f"Ada{RLO} Lovelace"

ISOLATED_JS = """() => {
  const isolated = (el) => el !== null && (el.tagName === "BDI" || el.dir === "auto");
  const texts = (sel) => Array.from(document.querySelectorAll(sel), (e) => e.textContent);
  const answers = Array.from(document.querySelectorAll("#candidates li"), (li) => {
    const el = li.querySelector(".answer");
    return {rank: li.dataset.rank, isolated: isolated(el), text: el && el.textContent};
  });
  // The left edge of every piece of the meta line, in reading order: isolation keeps
  // the page's own words ("model", "item") in their places around the model's text.
  const meta = document.getElementById("meta");
  const lefts = Array.from(meta.childNodes).filter((n) => n.textContent.trim()).map((n) => {
    const range = document.createRange();
    range.selectNodeContents(n);
    return range.getBoundingClientRect().left;
  });
  return {
    query: {isolated: isolated(document.getElementById("query")),
            text: document.getElementById("query").textContent},
    answers,
    meta: texts("#meta bdi"),
    metaText: meta.textContent,
    lefts,
    who: texts("#who bdi"),
    progress: texts("#progress td bdi"),
    reask: Array.from(document.querySelectorAll("#reask li"), (li) => ({
      text: li.textContent,
      parts: Array.from(li.querySelectorAll("bdi"), (b) => b.textContent),
    })),
    reaskHidden: document.getElementById("reask-box").hidden,
    inputs: ["correct-answer", "login-reviewer"].map((id) => document.getElementById(id).dir),
  };
}"""


def test_user_and_model_text_is_isolated_and_reask_changes_are_shown(
    browser: Browser, tmp_path: Path
) -> None:
    plain = item("qa:plain")
    with page_server(tmp_path / "relmon.db", [HOSTILE, plain], 60.0) as base:
        page = new_tab(browser)
        sign_in(page, base, TOKEN, REVIEWER)
        page.wait_for_selector(f"#item[data-item='{HOSTILE.item_id}']")
        page.wait_for_selector("#progress td bdi")
        shown: dict[str, Any] = page.evaluate(ISOLATED_JS)

        assert shown["query"] == {"isolated": True, "text": HOSTILE.query}
        answers = {a["rank"]: a for a in shown["answers"]}
        for rank, (answer, _) in enumerate(HOSTILE.candidates, start=1):
            assert answers[str(rank)] == {"rank": str(rank), "isolated": True, "text": answer}
        assert shown["meta"] == ["qa", HOSTILE.model, "openai.chat", HOSTILE.item_id]
        assert shown["metaText"] == (
            f"Task qa · model {HOSTILE.model} · API openai.chat · item {HOSTILE.item_id}"
        )
        assert shown["lefts"] == sorted(shown["lefts"]), shown["lefts"]
        assert shown["who"] == [REVIEWER]
        assert HOSTILE.model in shown["progress"]
        assert shown["inputs"] == ["auto", "auto"]

        assert not shown["reaskHidden"]
        assert [r["text"] for r in shown["reask"]] == [
            "temperature: 0 → 0.5",
            "seed: 42 → dropped",
            "top_k: not sent → 40",
            "metadata: <object, 2 keys> → dropped",
            f"model: gpt{RLO}-4o → gpt-4o-mini",
            "unrecorded: tools",
            "unrecorded: stop (re-asked with <list, 1 items>)",
        ]
        assert shown["reask"][4]["parts"] == ["model", f"gpt{RLO}-4o", "gpt-4o-mini"]
        assert shown["reask"][5]["parts"] == ["tools"]

        # The next item has no reask_changes: the list is hidden.
        page.keyboard.press("1")
        page.keyboard.press("Enter")
        page.wait_for_selector("#item[data-item='qa:plain']")
        assert page.evaluate(ISOLATED_JS)["reaskHidden"] is True
