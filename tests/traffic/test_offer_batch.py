"""The requests that may be sampled wait for the next ones and are parsed and offered
together (``traffic.offer_batch_s``, adapters/traffic/intake.py): none is lost or offered
twice, they keep their order, a batch never waits longer than its bound, and a flush
(a scrape, a stop, a process data plane's sync) offers the waiting ones at once."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from aiohttp import web

from adapters.traffic.intake import (
    MAX_PENDING_BYTES,
    MAX_PENDING_OFFERS,
    OFFERS_PER_TURN,
    HeaderView,
    Intake,
)
from adapters.traffic.traffic import TrafficServer
from monitor.config.schema import TrafficSettings
from monitor.core.events import TrafficEvent
from monitor.engine.ports import Admission

HEADERS = HeaderView([(b"Host", b"x"), (b"Content-Type", b"application/json")])
PATH = "/v1/chat/completions"


def _body(i: int) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}).encode()


class Sink:
    def __init__(self) -> None:
        self.events: list[TrafficEvent] = []
        self.counted: list[str] = []
        self.arrived = asyncio.Event()

    def __call__(self, event: TrafficEvent, source: str) -> Admission:
        self.events.append(event)
        self.arrived.set()
        return Admission("sampled")


def _intake(sink: Any, batch_s: float) -> Intake:
    return Intake(
        "proxy",
        sink=sink,
        reject=lambda source, reason: pytest.fail(reason),
        task_resolver=lambda headers, path, body: "t",
        skip=None,
        batch_s=batch_s,
    )


def _offer(intake: Intake, sink: Sink, i: int, raw: bytes | None = None) -> None:
    body = _body(i) if raw is None else raw
    intake.offer(sink.counted.append, HEADERS, PATH, body, answer=None, rid=f"r{i}")


def test_relmon_run_batches_by_default() -> None:
    assert TrafficSettings().offer_batch_s == 0.05
    with pytest.raises(ValueError, match="offer_batch_s"):
        TrafficSettings(offer_batch_s=-1)


def test_without_a_batch_each_request_is_offered_at_once() -> None:
    sink = Sink()
    intake = _intake(sink, 0.0)
    _offer(intake, sink, 1)  # no event loop needed
    assert [e.id for e in sink.events] == ["r1"]


async def test_a_batch_is_offered_in_order_once_its_time_is_up() -> None:
    sink = Sink()
    intake = _intake(sink, 0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for i in range(5):
        _offer(intake, sink, i)
        await asyncio.sleep(0.005)
    assert sink.events == []  # the first waits up to 0.05 s, the others with it
    await asyncio.wait_for(sink.arrived.wait(), 5)
    waited = loop.time() - started
    assert 0.045 <= waited < 0.5
    assert [e.id for e in sink.events] == [f"r{i}" for i in range(5)]
    _offer(intake, sink, 5)  # a new batch, with a timer of its own
    await asyncio.sleep(0.1)
    assert [e.id for e in sink.events] == [f"r{i}" for i in range(6)]
    assert sink.counted == []


async def test_a_full_batch_is_offered_at_once() -> None:
    sink = Sink()
    intake = _intake(sink, 10.0)
    for i in range(MAX_PENDING_OFFERS - 1):
        _offer(intake, sink, i)
    assert sink.events == []
    _offer(intake, sink, MAX_PENDING_OFFERS - 1)
    assert len(sink.events) == MAX_PENDING_OFFERS
    assert len({e.id for e in sink.events}) == MAX_PENDING_OFFERS
    # Bodies past the bound of bytes: the batch goes at once too. Not JSON: each is
    # counted rejected, once.
    big = b"x" * (MAX_PENDING_BYTES // 2)
    _offer(intake, sink, 1, big)
    assert sink.counted == []
    _offer(intake, sink, 2, big)
    assert sink.counted == ["invalid JSON", "invalid JSON"]
    await asyncio.sleep(0)


async def test_a_flush_offers_now_and_a_failing_sink_is_counted() -> None:
    def sink(event: TrafficEvent, source: str) -> Admission:
        if event.id == "r1":
            raise RuntimeError("a bug in the sink")
        return Admission("sampled")

    counted: list[str] = []
    intake = _intake(sink, 10.0)
    for i in range(3):
        intake.offer(counted.append, HEADERS, PATH, _body(i), answer=None, rid=f"r{i}")
    intake.flush()
    assert counted == ["internal error: RuntimeError"]
    intake.flush()  # nothing waits: nothing happens
    assert counted == ["internal error: RuntimeError"]


async def _upstream() -> tuple[web.AppRunner, int]:
    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"choices": [{"message": {"content": "42"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    return runner, sock.getsockname()[1]


async def _post(port: int, rid: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = _body(0)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"X-Request-Id: {rid}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    answer = await reader.read()
    writer.close()
    return answer


async def test_the_proxy_offers_a_waiting_batch_on_flush_and_on_stop() -> None:
    runner, up_port = await _upstream()
    sink = Sink()
    server = TrafficServer(
        sink=sink,
        reject=lambda source, reason: pytest.fail(reason),
        task_resolver=lambda headers, path, body: "t",
        mode="proxy",
        port=0,
        upstream_url=f"http://127.0.0.1:{up_port}",
        offer_batch_s=30.0,
    )
    await server.start()
    try:
        assert b"42" in await _post(server.bound_port, "a")
        assert sink.events == []  # answered; its offer waits for the batch
        server.flush_offers()
        assert [(e.id, e.response_text) for e in sink.events] == [("a", "42")]
        assert b"42" in await _post(server.bound_port, "b")
    finally:
        await server.stop()
        await runner.cleanup()
    assert [e.id for e in sink.events] == ["a", "b"]  # stopping offered what waited


async def test_a_due_batch_is_handled_a_few_per_turn_of_the_loop() -> None:
    """Live requests go between two turns: no turn handles more than OFFERS_PER_TURN."""
    loop = asyncio.get_running_loop()
    turns = [0]

    def tick() -> None:
        turns[0] += 1
        if turns[0] < 10_000:
            loop.call_soon(tick)

    seen_at: list[int] = []
    sink = Sink()

    def counting_sink(event: TrafficEvent, source: str) -> Admission:
        seen_at.append(turns[0])
        return sink(event, source)

    intake = _intake(counting_sink, 0.01)
    n = 3 * OFFERS_PER_TURN + 1
    for i in range(n):
        _offer(intake, sink, i)
    loop.call_soon(tick)
    while len(sink.events) < n:
        await asyncio.wait_for(sink.arrived.wait(), 5)
        sink.arrived.clear()
    turns[0] = 10_000  # stop the ticker
    assert [e.id for e in sink.events] == [f"r{i}" for i in range(n)]
    per_turn = [seen_at.count(t) for t in sorted(set(seen_at))]
    assert per_turn == [OFFERS_PER_TURN] * 3 + [1]
