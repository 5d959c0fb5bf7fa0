"""Latency the inline proxy adds, against calling the upstream directly, in the same run.

Three processes on 127.0.0.1: a small upstream (aiohttp, a fixed chat-completion JSON,
no artificial delay), the relmon ``TrafficServer`` in proxy mode in front of it (its
sink skips everything, so event parsing is included), and this load generator. The
load is open-loop: requests start on a fixed schedule (``--rate`` per second for
``--duration`` seconds) whatever the latency, alternating direct and proxied calls in
a random order within each pair, so both see the same machine at the same moments.
Latency is measured from the moment a request is started; the scheduler's own lag is
reported separately. The first ``--warmup`` seconds are dropped.

    .venv/bin/python bench/proxy_latency_bench.py [--rate 200] [--duration 10] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
REQUEST = {
    "model": "bench-model",
    "messages": [
        {"role": "system", "content": "You answer with a number."},
        {"role": "user", "content": "What is 6 times 7?"},
    ],
    "temperature": 0,
}
COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": "bench-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "42"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21},
    }
).encode()


# -- the server processes -----------------------------------------------------------------


async def _serve(role: str, upstream_url: str | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if role == "upstream":

        async def completions(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=COMPLETION, content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", completions)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        print(f"PORT {port}", flush=True)
        await stop.wait()
        await runner.cleanup()
        return

    sys.path.insert(0, str(ROOT))
    from adapters.http_traffic import TrafficServer
    from monitor.events import TrafficEvent
    from monitor.ports import Admission

    def skip(event: TrafficEvent, source: str) -> Admission:
        return Admission("skipped")

    server = TrafficServer(
        sink=skip,
        reject=lambda source, reason: None,
        task_resolver=lambda headers, path, body: None,
        mode="proxy",
        port=0,
        upstream_url=upstream_url,
    )
    await server.start()
    print(f"PORT {server.bound_port}", flush=True)
    await stop.wait()
    await server.stop()


def _spawn(role: str, upstream_url: str | None = None) -> tuple[subprocess.Popen[bytes], int]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", role]
    if upstream_url:
        cmd += ["--upstream", upstream_url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert proc.stdout is not None
    for raw in proc.stdout:  # log lines may come first
        line = raw.decode()
        if line.startswith("PORT "):
            return proc, int(line.split()[1])
    _stop(proc)
    raise RuntimeError(f"the {role} server exited during start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# -- the load generator ---------------------------------------------------------------------


async def _load(
    direct_url: str, proxy_url: str, rate: float, duration: float, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    n = int(rate * duration)
    targets: list[str] = []
    for _ in range((n + 1) // 2):
        pair = ["direct", "proxy"]
        rng.shuffle(pair)
        targets += pair
    # (target, pair index, scheduled time from start, latency, scheduler lag, ok)
    results: list[tuple[str, int, float, float, float, bool]] = []
    body = json.dumps(REQUEST).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench"}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(target: str, pair: int, scheduled: float, t0: float) -> None:
            url = direct_url if target == "direct" else proxy_url
            start = time.perf_counter()
            ok = False
            try:
                async with session.post(url, data=body, headers=headers) as r:
                    ok = r.status == 200 and await r.read() == COMPLETION
            except aiohttp.ClientError:
                ok = False
            end = time.perf_counter()
            results.append((target, pair, scheduled - t0, end - start, start - scheduled, ok))

        tasks = []
        t0 = time.perf_counter() + 0.1
        for i in range(n):
            scheduled = t0 + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(targets[i], i // 2, scheduled, t0)))
        await asyncio.gather(*tasks)
    return {"results": results}


def _summary(values: np.ndarray) -> dict[str, float]:
    ms = values * 1000
    return {
        "n": len(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second, total")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds dropped at start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve", choices=["upstream", "proxy"], help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve, args.upstream))
        return

    upstream, up_port = _spawn("upstream")
    try:
        proxy, px_port = _spawn("proxy", f"http://127.0.0.1:{up_port}")
        try:
            out = asyncio.run(
                _load(
                    f"http://127.0.0.1:{up_port}/v1/chat/completions",
                    f"http://127.0.0.1:{px_port}/v1/chat/completions",
                    args.rate,
                    args.duration,
                    args.seed,
                )
            )
        finally:
            _stop(proxy)
    finally:
        _stop(upstream)

    rows = [r for r in out["results"] if r[2] >= args.warmup]
    report: dict[str, Any] = {
        "rate_per_s": args.rate,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "cpus": os.cpu_count(),
    }
    for target in ("direct", "proxy"):
        mine = [r for r in rows if r[0] == target]
        ok = np.array([r[3] for r in mine if r[5]])
        report[target] = _summary(ok) | {"errors": sum(not r[5] for r in mine)}
    d, p = report["direct"], report["proxy"]
    report["added"] = {
        "p50_ms": p["p50_ms"] - d["p50_ms"],
        "p99_ms": p["p99_ms"] - d["p99_ms"],
        "p50_ratio": p["p50_ms"] / d["p50_ms"],
        "p99_ratio": p["p99_ms"] / d["p99_ms"],
    }
    # Each pair ran ~1/rate apart, so machine-wide stalls hit both of its calls: the
    # median of the paired differences is the steadiest estimate on a busy machine.
    by_pair: dict[int, dict[str, float]] = {}
    for target, pair, _, latency, _, ok_ in rows:
        if ok_:
            by_pair.setdefault(pair, {})[target] = latency
    diffs = np.array([v["proxy"] - v["direct"] for v in by_pair.values() if len(v) == 2])
    report["paired_added_ms"] = {
        "n": len(diffs),
        "median": float(np.median(diffs) * 1000),
        "p90": float(np.percentile(diffs, 90) * 1000),
    }
    report["scheduler_lag"] = _summary(np.array([r[4] for r in rows]))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"open loop: {args.rate:g} req/s for {args.duration:g} s (first {args.warmup:g} s dropped)"
    )
    for target in ("direct", "proxy"):
        s = report[target]
        print(
            f"{target:>7}: n={s['n']:5d} errors={s['errors']} p50={s['p50_ms']:.3f} ms "
            f"p90={s['p90_ms']:.3f} ms p99={s['p99_ms']:.3f} ms max={s['max_ms']:.3f} ms"
        )
    a = report["added"]
    print(
        f"  added: p50 +{a['p50_ms']:.3f} ms (x{a['p50_ratio']:.2f}), "
        f"p99 +{a['p99_ms']:.3f} ms (x{a['p99_ratio']:.2f})"
    )
    pa = report["paired_added_ms"]
    print(
        f"  paired (proxy - direct, same moment): median {pa['median']:.3f} ms, "
        f"p90 {pa['p90']:.3f} ms"
    )
    lag = report["scheduler_lag"]
    print(f"scheduler lag: p50={lag['p50_ms']:.3f} ms p99={lag['p99_ms']:.3f} ms")


if __name__ == "__main__":
    main()
