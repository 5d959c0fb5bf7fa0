"""No request stops the mirror or the proxy (DESIGN.md §5, "Sources never die silently"),
through a real aiohttp server on 127.0.0.1: random request bodies are each counted once
(an event or a rejection) and the next event goes; an exception nobody expected while
handling one request is counted once as rejected and answered 500 (or, once the answer
has begun, seen by the client as a cut connection), and the listener goes on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.traffic import exchange as data_plane
from adapters.traffic import intake, messages
from tests.waiting import wait_until

from .conftest import COMPILED, COMPLETION_BYTES, Recorder, StartTraffic, Upstream

plain_python_only = pytest.mark.skipif(
    COMPILED,
    reason="injects a bug by patching the data plane, which compiled code does not see: "
    "tests/traffic/test_plain_python.py runs it on the plain-Python modules",
)

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "What is 6*7?"}]}


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


def spliced(junk: bytes) -> bytes:
    """A valid chat request with ``junk`` raw inside its content string (not escaped)."""
    return json.dumps(CHAT).encode().replace(b"6*7", junk)


BODIES = (
    st.binary(max_size=300)
    | st.binary(min_size=1, max_size=12).map(spliced)
    | st.sampled_from(
        [
            spliced(b"\xff"),
            spliced(b"\\u0000"),
            spliced(b"\\ud800"),
            b"[" * 5000,
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 1e999}',
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "response": 5}',
        ]
    )
)

FUZZ = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


async def one_body_then_a_marker(
    client: aiohttp.ClientSession, url: str, recorder: Recorder, body: bytes, status: int
) -> None:
    """POST ``body``, then a valid event: the marker is handled, and ``body`` was counted
    exactly once (an event or a rejection) before it."""
    before = len(recorder.events) + len(recorder.rejects)
    marker = f"marker-{before}"
    async with client.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        assert r.status == status
        await r.read()
    async with client.post(url, json=CHAT, headers={"X-Request-Id": marker}) as r:
        assert r.status == status
        await r.read()

    def handled() -> bool:
        return len(recorder.events) + len(recorder.rejects) >= before + 2

    await wait_until(handled, what="the body and the marker counted")
    assert recorder.events[-1][0].id == marker
    assert len(recorder.events) + len(recorder.rejects) == before + 2


@pytest.fixture
async def mirror(start_traffic: StartTraffic) -> tuple[str, Recorder]:
    recorder = Recorder()
    server = await start_traffic("mirror", recorder)
    return f"http://127.0.0.1:{server.bound_port}/v1/chat/completions", recorder


@FUZZ
@given(body=BODIES)
async def test_random_mirror_bodies_are_counted_once_and_the_next_event_goes(
    mirror: tuple[str, Recorder], client: aiohttp.ClientSession, body: bytes
) -> None:
    url, recorder = mirror
    await one_body_then_a_marker(client, url, recorder, body, 202)


@pytest.fixture
async def proxy(upstream: Upstream, start_traffic: StartTraffic) -> tuple[str, Recorder]:
    """A proxy to the upstream's echo route: it answers 201 to any body."""
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=upstream.url + "/echo")
    return f"http://127.0.0.1:{server.bound_port}/v1/chat/completions", recorder


@settings(FUZZ, max_examples=30)
@given(body=BODIES)
async def test_random_proxy_bodies_are_counted_once_and_the_next_event_goes(
    proxy: tuple[str, Recorder], client: aiohttp.ClientSession, body: bytes
) -> None:
    url, recorder = proxy
    await one_body_then_a_marker(client, url, recorder, body, 201)


async def test_an_escaped_nul_is_valid_input_on_the_mirror(
    mirror: tuple[str, Recorder], client: aiohttp.ClientSession
) -> None:
    url, recorder = mirror
    async with client.post(url, data=spliced(b"a\\u0000b")) as r:
        assert r.status == 202
    await wait_until(lambda: len(recorder.events) == 1, what="the event at the sink")
    assert recorder.events[0][0].request["messages"][0]["content"] == "What is a\x00b?"
    assert recorder.rejects == []


async def test_a_bug_after_the_mirror_answered_is_counted_once_and_the_listener_goes_on(
    mirror: tuple[str, Recorder], client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, recorder = mirror

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug with the prompt 6*7 in its message")

    with monkeypatch.context() as patch:
        patch.setattr(intake.Intake, "offer", broken)
        async with client.post(url, json=CHAT) as r:
            assert r.status == 202  # the answer went before the bug
        await wait_until(lambda: len(recorder.rejects) == 1, what="the rejection counted")
    assert recorder.rejects == [("mirror", "internal error: RuntimeError")]
    await one_body_then_a_marker(client, url, recorder, b"{}", 202)
    assert len(recorder.rejects) == 2  # {} is no event: rejected, once


@plain_python_only
async def test_a_bug_before_the_proxy_answered_is_a_500_counted_once(
    proxy: tuple[str, Recorder], client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, recorder = proxy

    def broken(*args: object) -> None:
        raise KeyError("a bug")

    with monkeypatch.context() as patch:
        patch.setattr(data_plane, "request_head", broken)
        async with client.post(url, json=CHAT) as r:
            assert r.status == 500
            error = (await r.json())["error"]
        assert "internal error: KeyError" in error["message"]
        assert recorder.rejects == [("proxy", "internal error: KeyError")]
        # A request that is no event fails alike, but is not counted.
        base = url.removesuffix("/v1/chat/completions")
        async with client.get(base + "/v1/models") as r:
            assert r.status == 500
    assert recorder.rejects == [("proxy", "internal error: KeyError")]
    await one_body_then_a_marker(client, url, recorder, json.dumps(CHAT).encode(), 201)


@plain_python_only
async def test_a_bug_while_sending_upstream_closes_the_connection_it_took(
    upstream: Upstream,
    start_traffic: StartTraffic,
    client: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connection a failed request took from the pool is closed, not left taken: a
    pool whose every connection leaked would make every later request wait."""
    server = await start_traffic("proxy", Recorder(), upstream_url=upstream.url + "/echo")
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"
    pool = server._pools[0]
    assert pool is not None

    def broken(*args: object) -> None:
        raise KeyError("a bug")

    with monkeypatch.context() as patch:
        patch.setattr(data_plane, "request_head", broken)
        for _ in range(3):
            async with client.post(url, json=CHAT) as r:
                assert r.status == 500
    await wait_until(
        lambda: pool._open == len(pool._idle),
        what="no upstream connection left taken",
        detail=lambda: f"open {pool._open}, idle {len(pool._idle)}",
    )
    async with client.post(url, json=CHAT) as r:
        assert r.status == 201


@plain_python_only
async def test_a_bug_on_the_fast_path_is_a_500_counted_once_and_the_body_still_whole(
    proxy: tuple[str, Recorder], client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, recorder = proxy
    body = json.dumps(CHAT).encode()
    async with client.post(url, data=body) as r:  # pools an upstream connection
        assert r.status == 201
    calls: list[bytes] = []

    def broken_once(req: object, fwd: object, body: bytes = b"") -> bytes:
        calls.append(b"")
        if len(calls) == 1:  # the fast path's try: it declines, the handler goes on
            raise KeyError("a bug")
        return original(req, fwd, body)  # type: ignore[arg-type]

    original = data_plane.request_head
    with monkeypatch.context() as patch:
        patch.setattr(data_plane, "request_head", broken_once)
        async with client.post(url, data=body) as r:
            assert r.status == 201  # the handler sent it, its body whole
            assert (await r.json())["size"] == len(body)
    assert len(calls) == 2 and recorder.rejects == []


@plain_python_only
async def test_a_bug_after_the_proxy_relayed_the_answer_is_counted_once(
    upstream: Upstream,
    start_traffic: StartTraffic,
    client: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder()
    server = await start_traffic("proxy", recorder, upstream_url=upstream.url)
    url = f"http://127.0.0.1:{server.bound_port}/v1/chat/completions"

    def broken(*args: object) -> None:
        raise ValueError("a bug reading the answer")

    with monkeypatch.context() as patch:
        patch.setattr(messages, "answer_text", broken)
        async with client.post(url, json=CHAT) as r:
            assert (r.status, await r.read()) == (200, COMPLETION_BYTES)  # untouched
        await wait_until(lambda: len(recorder.rejects) == 1, what="the rejection counted")
    assert recorder.rejects == [("proxy", "internal error: ValueError")]
    async with client.post(url, json=CHAT, headers={"X-Request-Id": "after"}) as r:
        assert r.status == 200
    await wait_until(lambda: len(recorder.events) == 1, what="the next event at the sink")
    assert recorder.events[0][0].id == "after"
