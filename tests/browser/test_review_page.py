"""The review page in a real headless Chromium (Debian ``chromium``, driven by
Playwright) against a real ``relmon demo --no-auto-review``.

The browser runs at 200% zoom (a 640 CSS-pixel wide viewport at device scale 2, what a
1280-pixel window shows zoomed to 200%). A reviewer opens the page through a reverse
proxy that serves relmon under ``/relmon/`` (it strips the prefix, as a site's proxy
would), signs in, shows and hides the keys (``?``), skips an item (``s``), and reviews 20
items with the keyboard only (several answers accepted once, "none of these" on some,
one verdict undone and given again) while a second tab, straight on relmon's port,
holds its own item; then the skipped item is checked to be back in the queue without a
verdict, and the verdicts are
checked through the review API and /metrics (reviews counted, the calibration window
grown by 20, the reliability level equal to an independent computation from the
verdicts), a screenshot is saved (test-artifacts/review-page.png) and checked not to be
blank, and an export/import round trip is checked to restore the same thresholds. The
figures (review time, levels, thresholds, screenshot) go to
test-artifacts/review-page-run.json, since ``make test`` does not show a passing test's
output.

A second, short test serves the page against a seeded store with a 3-second lease:
an item with a single candidate shows the correct/incorrect layout, and the tab keeps
its leases (the item shown and the one prefetched) by renewing them, well past the
lease, until the verdict is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from aiohttp import ClientSession, ClientTimeout, web
from PIL import Image
from playwright.sync_api import Browser, Page, Request, sync_playwright
from prometheus_client.parser import text_string_to_metric_families

from adapters.review.review import ReviewServer
from adapters.review.review_auth import ReviewAuth
from adapters.review.review_page import ReviewPage
from adapters.sqlite.store import SqliteStore
from monitor.app.demo import MODEL, TASK
from monitor.core.review import ReviewItem
from monitor.core.window import CalibrationWindow
from tests.ports import free_port
from tests.review.test_review_api import Handler, item
from tests.waiting import wait_until_sync

TOKEN = "browser-test-token-7c1f"
HALF_LIFE_S = 30.0  # the demo's task settings
REVIEW_RATE = 0.5
ALPHAS = (0.05, 0.1, 0.2)
ARTIFACTS = Path(os.environ.get("RELMON_TEST_ARTIFACTS", "test-artifacts"))
RUN_FILE = "review-page-run.json"
_T = TypeVar("_T")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def http_get(url: str, token: str | None = TOKEN) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        with exc:  # its socket closed even if reading the body fails
            return exc.code, exc.read()


@dataclass
class Demo:
    proc: subprocess.Popen[bytes]
    state_dir: Path
    metrics: str
    review: str

    def get(self, url: str, token: str | None = TOKEN) -> tuple[int, bytes]:
        return http_get(url, token)

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        status, body = self.get(f"{self.metrics}/metrics", None)
        assert status == 200
        out = {}
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                if s.labels.get("task", TASK) == TASK:
                    out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def value(self, name: str, **labels: str) -> float:
        key = frozenset({"model": MODEL, "task": TASK, **labels}.items())
        return self.samples().get((name, key), math.nan)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_demo(state_dir: Path, log: Path) -> Demo:
    ports = [free_port() for _ in range(3)]
    env = {**os.environ, "RELMON_REVIEW_TOKEN": TOKEN}
    cmd = [
        sys.executable,
        "-m",
        "monitor",
        "demo",
        "--no-auto-review",
        "--state-dir",
        str(state_dir),
        "--drift-after",
        "100000",
        "--metrics-port",
        str(ports[0]),
        "--review-port",
        str(ports[1]),
        "--traffic-port",
        str(ports[2]),
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    demo = Demo(proc, state_dir, f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}")
    wait_until_sync(
        lambda: demo.get(f"{demo.metrics}/readyz", None)[0] == 200,
        timeout_s=120,
        what="the demo to be ready",
        interval_s=0.2,
        alive=proc,
        ignore=(OSError,),
        detail=lambda: log.read_text()[-3000:],
    )
    return demo


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    d = start_demo(tmp_path / "state", tmp_path / "demo.log")
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def proxy(demo: Demo) -> Iterator[Proxy]:
    with prefix_proxy(demo.review) as p:
        yield p


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def new_tab(browser: Browser) -> Page:
    context = browser.new_context(viewport={"width": 640, "height": 900}, device_scale_factor=2)
    page = context.new_page()
    page.set_default_timeout(30_000)
    return page


def sign_in(page: Page, base: str, token: str, name: str, path: str = "review") -> None:
    page.goto(f"{base}/{path}")
    page.locator("#token").focus()
    page.keyboard.type(token)
    page.keyboard.press("Tab")
    page.keyboard.type(name)
    page.keyboard.press("Enter")


PREFIX = "/relmon/"
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
    "trailer",
    "host",
    "content-length",
}


@dataclass
class Proxy:
    base: str  # where relmon appears: http://127.0.0.1:PORT/relmon
    forwarded: list[str]  # the paths sent on to relmon
    refused: list[str]  # the paths outside the prefix (answered 404 here)


@contextlib.contextmanager
def background_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on its own thread: Playwright's sync API runs one in this
    thread, so the servers the browser talks to run there (see :func:`run_in`)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-servers", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
        loop.close()


def run_in(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(60)


@contextlib.contextmanager
def prefix_proxy(target: str) -> Iterator[Proxy]:
    """A reverse proxy on its own thread and event loop that serves ``target`` under
    ``/relmon/`` (``/relmon/x`` -> ``target/x``) and answers anything else 404, as a
    site's proxy mounting relmon on a sub-path does. Headers and bodies pass unchanged
    (a ``Location`` too: relmon's redirects must be relative to work behind it)."""
    forwarded: list[str] = []
    refused: list[str] = []
    state: dict[str, Any] = {}

    async def forward(request: web.Request) -> web.StreamResponse:
        if not request.path.startswith(PREFIX):
            refused.append(request.path_qs)
            return web.Response(status=404, text="not under the prefix")
        path_qs = request.raw_path[len(PREFIX) - 1 :]
        forwarded.append(path_qs)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        session: ClientSession = state["session"]
        async with session.request(
            request.method,
            target + path_qs,
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
        ) as r:
            body = await r.read()
            out = {k: v for k, v in r.headers.items() if k.lower() not in _HOP_BY_HOP}
            return web.Response(status=r.status, body=body, headers=out)

    async def start() -> int:
        state["session"] = ClientSession(timeout=ClientTimeout(total=60), auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        return int(runner.addresses[0][1])

    async def stop() -> None:
        if "runner" in state:
            await state["runner"].cleanup()
        if "session" in state:
            await state["session"].close()

    with background_loop() as loop:
        try:
            port = run_in(loop, start())
            yield Proxy(f"http://127.0.0.1:{port}{PREFIX.rstrip('/')}", forwarded, refused)
        finally:
            run_in(loop, stop())


@contextlib.contextmanager
def page_server(
    path: Path, items: Sequence[ReviewItem], lease_s: float, auth: ReviewAuth | None = None
) -> Iterator[str]:
    """The review API and page (no undo window) over a SQLite store holding ``items``,
    on a background loop, with the token ``TOKEN`` or ``auth``; yields its address."""
    closers: list[Callable[[], Awaitable[None]]] = []

    async def start() -> int:
        store = await SqliteStore.open(path)
        closers.append(store.aclose)
        for it in items:
            await store.submit(it)
        handler = Handler(store)
        page = ReviewPage(store=store, handler=handler, lease_s=lease_s, undo_s=0)
        server = ReviewServer(
            store=store, handler=handler, token=TOKEN, auth=auth, port=0, page=page
        )
        await server.start()
        closers.append(server.stop)
        return server.bound_port

    async def stop() -> None:
        for close in reversed(closers):
            await close()

    with background_loop() as loop:
        try:
            yield f"http://127.0.0.1:{run_in(loop, start())}"
        finally:
            run_in(loop, stop())


def test_a_wrong_token_is_refused(demo: Demo, browser: Browser) -> None:
    page = new_tab(browser)
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    sign_in(page, demo.review, "not-the-token", "Eve")
    # #login is shown from the start, so wait for the refusal itself: the page says so
    # once /whoami has answered 401 (checking at once raced it, and failed in CI). A
    # locator waits by selector: a JavaScript predicate would be refused by the page's
    # CSP (no 'unsafe-eval') as soon as it is polled rather than true at once
    page.locator("#status", has_text="not accepted").wait_for()
    assert page.locator("#login").is_visible()
    assert page.locator("#review").is_hidden()
    assert page.evaluate("sessionStorage.getItem('relmon-token')") is None
    assert urls and not any("not-the-token" in u or TOKEN in u for u in urls)
    assert demo.get(f"{demo.review}/api/reviews/next", "not-the-token")[0] == 401
    assert demo.get(f"{demo.review}/api/review-page/progress", None)[0] == 401


def expected_level(sampled_at: dict[str, float], good: set[str], now: float) -> float:
    """The weighted reliability level, computed here from the verdicts: weights
    2^(-age/h)/pi for the items, 1/pi for the test point (pi equal for all)."""
    w = {i: math.pow(2.0, -(now - t) / HALF_LIFE_S) for i, t in sampled_at.items()}
    return sum(w[i] for i in good) / (sum(w.values()) + 1.0)


def load_records(path: Path) -> list[Any]:
    async def load() -> list[Any]:
        store = await SqliteStore.open(path)
        try:
            return list(await store.load_records())
        finally:
            await store.aclose()

    # Playwright's sync API runs an event loop in this thread: load in another one.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, load()).result()


SHOWN_JS = """() => ({
  ranks: Array.from(document.querySelectorAll('#candidates li'), (e) => e.dataset.rank),
  texts: Array.from(document.querySelectorAll('#candidates li'), (e) => e.textContent),
  none_label: document.getElementById('none-label').textContent,
})"""
"""What the page shows of an item: each candidate's rank and whole text, "none" label."""


def check_shown(shown: dict[str, Any], item_json: dict[str, Any]) -> None:
    """Each candidate shows its key and its answer exactly (no count, nothing else); a
    single candidate reads "Correct: <answer>" and "none of these" reads "Incorrect"."""
    answers = {str(c["rank"]): c["answer"] for c in item_json["candidates"]}
    single = len(answers) == 1
    prefix = "Correct: " if single else ""
    expected = [f"{i}{prefix}{answers[r]}" for i, r in enumerate(shown["ranks"], start=1)]
    assert shown["texts"] == expected, (shown, answers)
    assert sorted(shown["ranks"]) == sorted(answers)
    assert shown["none_label"] == ("Incorrect" if single else "None of these")


def save_run(run: dict[str, Any]) -> Path:
    """The browser run's figures, next to the screenshot (``make test`` hides output)."""
    path = ARTIFACTS / RUN_FILE
    path.write_text(json.dumps(run, indent=2) + "\n")
    return path


def json_thresholds(thresholds: dict[float, float]) -> dict[str, float | str]:
    return {str(a): "inf" if math.isinf(t) else t for a, t in thresholds.items()}


def window_from(records: Any) -> CalibrationWindow:
    window = CalibrationWindow(
        alphas=ALPHAS,
        max_items=1000,
        half_life_s=HALF_LIFE_S,
        min_inclusion_probability=REVIEW_RATE,
    )
    for r in records:
        window.add(r.item_id, r.score, r.inclusion_probability, r.sampled_at)
    return window


@pytest.mark.timeout(900)  # its own deadlines add up to more than the default 300 s
def test_keyboard_review_of_20_items_with_undo(
    demo: Demo, proxy: Proxy, browser: Browser, tmp_path: Path
) -> None:
    wait_until_sync(
        lambda: demo.value("relmon_review_queue_depth") >= 25,
        timeout_s=120,
        what="25 items waiting for review",
        interval_s=0.2,
    )
    # Before the first verdict there is no level at all (no estimate, not a 0).
    assert math.isnan(demo.value("relmon_reliability_level"))
    assert demo.value("relmon_calibration_items") == 0
    level_before = 0.0

    other = new_tab(browser)
    sign_in(other, demo.review, TOKEN, "Bob")
    other.wait_for_selector("#item[data-item]")
    held_by_other = other.locator("#item").get_attribute("data-item")
    assert held_by_other
    page = new_tab(browser)
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    # Through the proxy's sub-path, by the address with a trailing slash (redirected).
    sign_in(page, proxy.base, TOKEN, "Ada", path="review/")
    page.wait_for_selector("#item[data-item]")
    assert page.url == f"{proxy.base}/review"
    assert "Ada" in page.locator("#who").inner_text()
    # Progress: the task, how many wait, and the minimum for the target (alpha 0.2 -> 4).
    row = page.locator("#progress tr[data-task='arithmetic']")
    assert "more needed" in row.inner_text()
    assert (row.locator("td").nth(4).inner_text()).startswith("4")

    # ? shows the keys and hides them again.
    keys = page.locator("#help")
    assert keys.is_hidden()
    page.keyboard.press("?")
    keys.wait_for(state="visible")
    assert keys.locator("dt").all_inner_texts() == ["1\u20139", "0", "Enter", "s", "u", "?"]
    assert "skip" in keys.inner_text() and "undo" in keys.inner_text()
    page.keyboard.press("?")
    keys.wait_for(state="hidden")

    # s skips: another item appears; the skipped one gets no verdict and goes back to
    # the queue for someone else (this tab does not show it again).
    skipped = page.locator("#item").get_attribute("data-item")
    assert skipped
    page.keyboard.press("s")
    page.locator(f"#item[data-item]:not([data-item={json.dumps(skipped)}])").wait_for()
    assert page.locator("#status").inner_text() == "Skipped."

    expected: dict[str, float] = {}  # item -> score
    positions_seen: list[list[str]] = []
    shown: dict[str, dict[str, Any]] = {}  # item -> what the page showed (checked below)
    undone = ""
    started = time.monotonic()
    for j in range(20):
        item_id = page.locator("#item").get_attribute("data-item")
        assert item_id and item_id not in (held_by_other, skipped) and item_id not in expected
        shown[item_id] = page.evaluate(SHOWN_JS)
        ranks = shown[item_id]["ranks"]
        positions_seen.append(ranks)
        if j == 14:  # none of these, with a correct answer no candidate has
            page.keyboard.press("0")
            page.keyboard.type("12345")
            expected[item_id] = math.inf
        elif j in (4, 19) and len(ranks) > 1:  # the runner-up is the right answer
            page.keyboard.press(str(ranks.index("2") + 1))
            expected[item_id] = 2.0
        else:
            page.keyboard.press(str(ranks.index("1") + 1))
            if j == 3 and len(ranks) > 1:
                page.keyboard.press(str(ranks.index("2") + 1))  # several accepted
            expected[item_id] = 1.0
        page.keyboard.press("Enter")
        page.wait_for_selector(f"body[data-done='{j + 1}']")
        if j == 9:  # undo this one and judge it again, differently
            undone = item_id
            page.keyboard.press("u")
            page.wait_for_selector(f"body[data-undone='{item_id}']")
            assert page.locator("#item").get_attribute("data-item") == item_id
            page.keyboard.press("0")
            page.keyboard.press("Enter")
            page.wait_for_selector(f"body[data-done='{j + 1}']")
            expected[item_id] = math.inf
    seconds = time.monotonic() - started
    print(f"\n20-item keyboard review (incl. one undo): {seconds:.1f} s")

    # The page at 200% zoom: nothing wider than the window, and not blank.
    page.wait_for_selector("#item[data-item]")
    width = page.evaluate("document.documentElement.clientWidth")
    assert width == 640
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    controls = ["#candidates li", "#none-box .choice", "#submit", "#skip", "#undo", "#keys"]
    for selector in controls:  # every answer and button within the window's width
        for control in page.locator(selector).all():
            box = control.bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= width, (selector, box)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "review-page.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot.resolve()}")
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape[1] == 1280 and pixels.std() > 10, pixels.std()
    run: dict[str, Any] = {
        "review_seconds": round(seconds, 2),
        "items": len(expected),
        "undone": undone,
        "single_candidate_items": sum(len(r) == 1 for r in positions_seen),
        "screenshot": str(shot.resolve()),
    }
    print(f"figures: {save_run(run).resolve()}")
    # Random order: over 20 items with several candidates, not always rank order.
    multi = [r for r in positions_seen if len(r) > 1]
    if len(multi) >= 12:  # all in rank order by chance: probability <= 2^-12
        assert any(r != sorted(r, key=int) for r in multi)

    # The verdicts land once their undo window (10 s) has passed.
    wait_until_sync(
        lambda: demo.value("relmon_calibration_items") == 20,
        timeout_s=90,
        what="20 verdicts in the calibration window",
        interval_s=0.2,
    )
    sampled_at = {}
    for item_id, score in expected.items():
        status, body = demo.get(f"{demo.review}/api/reviews/{urllib.parse.quote(item_id)}")
        assert status == 200
        got = json.loads(body)
        check_shown(shown[item_id], got)  # the answers exactly, no counts
        assert got["verdict"] is not None and got["verdict"]["reviewer"] == "Ada"
        assert got["verdict"]["none_of_these"] == math.isinf(score)
        sampled_at[item_id] = got["sampled_at"]
    status, body = demo.get(f"{demo.review}/api/reviews/{urllib.parse.quote(held_by_other)}")
    assert json.loads(body)["verdict"] is None  # the other tab's item was left alone
    status, body = demo.get(f"{demo.review}/api/reviews/{urllib.parse.quote(skipped)}")
    assert status == 200 and json.loads(body)["verdict"] is None
    # The skipped item is back in the queue, and near its front: it was the oldest free
    # item when it was shown, so a new reviewer asking for items gets it first, or after
    # the other tab's two (current and prefetched) if their leases ran out meanwhile.
    given: list[str] = []
    for _ in range(3):
        query = "".join(f"&exclude={urllib.parse.quote(i)}" for i in given)
        status, body = demo.get(f"{demo.review}/api/reviews/next?session=probe{query}")
        assert status == 200
        given.append(json.loads(body)["item_id"])
        if given[-1] == skipped:
            break
    assert skipped in given, given
    # Everything went through the proxy's sub-path: the page asked for nothing outside it.
    assert requested and all(u.startswith(f"{proxy.base}/") for u in requested), requested
    assert any("/api/review-page/verdicts/" in p for p in proxy.forwarded)
    assert set(proxy.refused) <= {"/favicon.ico"}, proxy.refused
    nones = sum(math.isinf(s) for s in expected.values())
    assert demo.value("relmon_reviews_total", verdict="none") == nones
    assert demo.value("relmon_reviews_total", verdict="accepted") == 20 - nones
    good = {i for i, s in expected.items() if s <= 1}
    t0 = time.time()
    level = demo.value("relmon_reliability_level")
    t1 = time.time()
    low, high = expected_level(sampled_at, good, t1), expected_level(sampled_at, good, t0)
    assert low - 1e-9 <= level <= high + 1e-9, (low, level, high)
    assert level > level_before
    print(f"reliability level {level_before} -> {level:.4f} (independent: {low:.4f}..{high:.4f})")
    run |= {"level_before": level_before, "level_after": level, "level_independent": [low, high]}
    save_run(run)

    # Export, import into a fresh state directory: the same thresholds.
    other.close()
    demo.stop()
    export = tmp_path / "verdicts.jsonl"
    env = {**os.environ}
    for args in (
        ["export", "--state-dir", str(demo.state_dir), "-o", str(export)],
        ["import", "--state-dir", str(tmp_path / "moved"), str(export)],
    ):
        done = subprocess.run(  # noqa: PLW1510 (the return code is asserted)
            [sys.executable, "-m", "monitor", "verdicts", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    assert len(export.read_text().splitlines()) == 20
    records = [
        load_records(demo.state_dir / "relmon.sqlite3"),
        load_records(tmp_path / "moved" / "relmon.sqlite3"),
    ]
    assert records[0] == records[1] and len(records[0]) == 20
    now = time.time()
    before, after = (window_from(r).snapshot(now) for r in records)
    assert before == after
    print(f"export/import round trip: thresholds {before.thresholds} == {after.thresholds}")
    run["thresholds_round_trip"] = {
        "exported_verdicts": 20,
        "before": json_thresholds(before.thresholds),
        "after": json_thresholds(after.thresholds),
    }
    save_run(run)

    # relmon started on the imported state serves the same calibration.
    moved = start_demo(tmp_path / "moved", tmp_path / "moved.log")
    try:
        assert moved.value("relmon_calibration_items") == 20
        t0 = time.time()
        level = moved.value("relmon_reliability_level")
        t1 = time.time()
        low, high = expected_level(sampled_at, good, t1), expected_level(sampled_at, good, t0)
        assert low - 1e-9 <= level <= high + 1e-9
    finally:
        moved.stop()


def test_single_candidate_layout_and_leases_renewed_past_their_length(
    browser: Browser, tmp_path: Path
) -> None:
    lease_s = 3.0
    solo = replace(item("qa:solo"), candidates=(("42", 10),))
    with page_server(tmp_path / "relmon.db", [solo, item("qa:next")], lease_s) as base:
        page = new_tab(browser)
        renewed: list[str] = []  # the item ids of the lease renewals

        def on_request(request: Request) -> None:
            path = urllib.parse.urlsplit(request.url).path
            if path.startswith("/api/review-page/lease/"):
                renewed.append(urllib.parse.unquote(path.rsplit("/", 1)[-1]))

        page.on("request", on_request)
        sign_in(page, base, TOKEN, "Ada")
        page.wait_for_selector("#item[data-item='qa:solo']")
        shown = page.evaluate(SHOWN_JS)
        check_shown(shown, solo.to_json())
        assert shown["texts"] == ["1Correct: 42"]
        assert "1 = correct, 0 = incorrect" in page.locator("#hint").inner_text()

        # Three leases long: the tab renews the item shown and the prefetched one. It
        # renews every lease/3 and never sooner, so ten renewals of each item are at least
        # three leases after it was first leased (Playwright delivers the request events
        # only inside its own calls: the pause between checks is the page's).
        wait_until_sync(
            lambda: min(renewed.count("qa:solo"), renewed.count("qa:next")) >= 10,
            timeout_s=120,
            what="ten lease renewals of each item (three leases long)",
            interval_s=0.2,
            sleep=lambda s: page.wait_for_timeout(s * 1000),
            detail=lambda: f"renewals: {renewed}",
        )
        assert http_get(f"{base}/api/reviews/next?session=probe")[0] == 204
        assert set(renewed) == {"qa:solo", "qa:next"}, renewed

        page.keyboard.press("1")
        page.keyboard.press("Enter")
        page.wait_for_selector("#item[data-item='qa:next']")
        status, body = http_get(f"{base}/api/reviews/qa:solo")
        verdict = json.loads(body)["verdict"]
        assert status == 200 and verdict["accepted_ranks"] == [1] and verdict["reviewer"] == "Ada"
