"""The Python the proxy's data plane runs per request, with no socket and no other process:
the steadiest figure for a change to the hot path (wrk's saturation runs move by 10% and
more between runs on a shared machine; this moves by a few).

In one process: relmon's :class:`~adapters.traffic.traffic.TrafficServer` in proxy mode,
with ``relmon run``'s fast path (one task hash-sampling 1%, the sampled requests handed
to nothing) and ``bench/lean_proxy.py``'s protocols, each fed the bytes of a chat request
as wrk sends it and then the bytes of nginx's answer, through transports that only count
what is written. Every request goes the whole way: parsed, forwarded to the (pretend)
upstream, its answer parsed and relayed, the sampling decided. Reported: microseconds
per request, median of ``--repeats``, for

- ``relmon``: a request without ``X-Request-Id`` (the draw; most of a sidecar's traffic);
- ``relmon_with_id``: the same request with an ``X-Request-Id`` (hashed with the task);
- ``relmon_not_event``: a ``POST`` to another path (relayed, no sampling at all);
- ``lean``: ``bench/lean_proxy.py`` (the floor: no relmon code).

    .venv/bin/python bench/dataplane_cpu_bench.py [--requests 50000] [--repeats 7] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib
import lean_proxy
from proxy_saturation_bench import COMPLETION, HEADERS, REQUEST, fast_path_server

from adapters.traffic.wire import ServerConnection
from adapters.upstream.pool import UpstreamConnection

ANSWER = COMPLETION.encode()
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Fri, 27 Nov 2026 00:00:00 GMT\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n"
    % len(ANSWER)
) + ANSWER


def request(path: str, extra: dict[str, str] | None = None) -> bytes:
    """A chat request as wrk sends it (``bench/proxy_saturation_bench.py``'s)."""
    headers = {"Host": "127.0.0.1:8080", **HEADERS, **(extra or {})}
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"Content-Length: %d\r\n\r\n" % len(REQUEST) + REQUEST


class CountingTransport:
    """A transport that counts writes and keeps the last one."""

    def __init__(self) -> None:
        self.writes = 0
        self.last = b""
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.last = data

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


Step = tuple[Callable[[], None], CountingTransport]
"""A request's whole way (a call) and the client's transport it is answered on."""


def relmon_step(request_bytes: bytes) -> Step:
    """One request through relmon's data plane (``relmon run``'s fast path, 1% sampled)."""
    server = fast_path_server("http://127.0.0.1:9")
    handler, fast = server._handler()  # the listener's own, without a socket
    pool = server._pools[0]
    assert pool is not None
    upstream = UpstreamConnection(pool)
    upstream.connection_made(CountingTransport())  # type: ignore[arg-type]
    pool._idle.append(upstream)
    client = ServerConnection(handler, set(), fast)
    transport = CountingTransport()
    client.connection_made(transport)  # type: ignore[arg-type]

    def step() -> None:
        client.data_received(request_bytes)
        upstream.data_received(RESPONSE)

    return step, transport


def lean_step() -> Step:
    """One request through ``bench/lean_proxy.py``'s protocols."""
    pool: list[lean_proxy.Upstream] = []
    upstream = lean_proxy.Upstream(pool)
    upstream.connection_made(CountingTransport())  # type: ignore[arg-type]
    pool.append(upstream)
    client = lean_proxy.Client(pool, ("127.0.0.1", 9), b"127.0.0.1:9")
    transport = CountingTransport()
    client.connection_made(transport)  # type: ignore[arg-type]
    request_bytes = request("/v1/chat/completions")

    def step() -> None:
        client.data_received(request_bytes)
        upstream.data_received(RESPONSE)

    return step, transport


def per_request_us(
    build: Callable[[], tuple[Callable[[], None], CountingTransport]], n: int
) -> float:
    """Microseconds per request over ``n``, after 2,000 to warm up; every answer checked."""
    step, transport = build()
    for _ in range(2000):
        step()
    if not transport.last.endswith(ANSWER):
        raise RuntimeError(f"not relayed: {transport.last[:200]!r}")
    transport.writes = 0
    started = time.perf_counter()
    for _ in range(n):
        step()
    elapsed = time.perf_counter() - started
    if transport.writes != n:
        raise RuntimeError(f"{transport.writes} answers for {n} requests")
    return elapsed / n * 1e6


TARGETS: dict[str, Callable[[], Step]] = {
    "relmon": lambda: relmon_step(request("/v1/chat/completions")),
    "relmon_with_id": lambda: relmon_step(
        request("/v1/chat/completions", {"X-Request-Id": "7f3c2a9e-5b1d-4e8a-9c0f-2d6b8e1a4c37"})
    ),
    "relmon_not_event": lambda: relmon_step(request("/v1/other")),
    "lean": lean_step,
}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[float]] = {name: [] for name in TARGETS}
    for _ in range(args.repeats):  # the targets interleaved: drift hits them alike
        for name, build in TARGETS.items():
            runs[name].append(per_request_us(build, args.requests))
    us = {name: benchlib.median(values) for name, values in runs.items()}
    return {
        "benchmark": "dataplane_cpu",
        "requests": args.requests,
        "repeats": args.repeats,
        "compiled": benchlib.compiled(),
        "machine": benchlib.machine(),
        "us_per_request": us,
        "runs": runs,
        "vs_lean": {name: us[name] / us["lean"] for name in TARGETS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000, help="requests per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="2,000 requests, 1 repeat")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.repeats = 2000, 1
    report = uvloop.run(measure(args))
    if args.json is not None:
        benchlib.write_json(report, args.json)
    for name, us in report["us_per_request"].items():
        print(f"{name:>17}: {us:6.2f} us per request, x{report['vs_lean'][name]:.2f} lean's")


if __name__ == "__main__":
    main()
