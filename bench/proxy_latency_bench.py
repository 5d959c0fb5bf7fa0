"""Latency relmon's inline proxy adds, against calling the upstream directly and against
nginx ``proxy_pass`` to the same upstream, all in the same run.

Processes on 127.0.0.1: a small upstream (aiohttp, a fixed chat-completion JSON, no
artificial delay); ``relmon run`` in proxy mode in front of it (the whole service: one
task, 1% of the traffic sampled and re-asked of the same upstream); nginx (Debian, one
worker, keep-alive connections to the upstream) in front of the same upstream; and this
load generator. The load is open-loop: requests start on a fixed schedule (``--rate``
per second in total for ``--duration`` seconds) whatever the latency, cycling through
direct, relmon and nginx calls in a random order within each triple, so all three see
the same machine at the same moments. Latency is measured from the moment a request is
started; the scheduler's own lag is reported separately. The first ``--warmup``
seconds of each repeat are dropped. Reported: medians over ``--repeats`` repeats.

    .venv/bin/python bench/proxy_latency_bench.py [--rate 300] [--duration 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

TARGETS = ("direct", "relmon", "nginx")
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


# -- the servers ---------------------------------------------------------------------------


async def _serve_upstream() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=COMPLETION, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    await stop.wait()
    await runner.cleanup()


def nginx_config(prefix: Path, port: int, upstream_port: int) -> Path:
    """One worker, keep-alive to the upstream, no access log: a lean reverse proxy."""
    for d in ("logs", "tmp"):
        (prefix / d).mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(
        f"""daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    upstream llm {{ server 127.0.0.1:{upstream_port}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://llm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""
    )
    return conf


def start_nginx(
    prefix: Path, port: int, upstream_port: int, conf: Path | None = None
) -> subprocess.Popen[bytes]:
    """nginx on ``port`` with ``conf`` (default: :func:`nginx_config` to ``upstream_port``)."""
    conf = conf or nginx_config(prefix, port, upstream_port)
    log = prefix / "logs" / "error.log"
    proc = subprocess.Popen(
        ["nginx", "-p", str(prefix), "-c", str(conf), "-e", str(log)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        benchlib.wait_port(port, proc, deadline_s=30)
    except RuntimeError:
        benchlib.stop(proc)
        raise RuntimeError(
            f"nginx did not start: {log.read_text() if log.exists() else ''}"
        ) from None
    return proc


# -- the load generator ---------------------------------------------------------------------


async def _load(urls: dict[str, str], rate: float, duration: float, seed: int) -> list[Any]:
    rng = random.Random(seed)
    n = int(rate * duration)
    targets: list[str] = []
    while len(targets) < n:
        group = list(TARGETS)
        rng.shuffle(group)
        targets += group
    # (target, group index, scheduled time from start, latency, scheduler lag, ok)
    results: list[tuple[str, int, float, float, float, bool]] = []
    body = json.dumps(REQUEST).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench"}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(target: str, group: int, scheduled: float, t0: float) -> None:
            start = time.perf_counter()
            ok = False
            try:
                async with session.post(urls[target], data=body, headers=headers) as r:
                    ok = r.status == 200 and await r.read() == COMPLETION
            except aiohttp.ClientError:
                ok = False
            end = time.perf_counter()
            results.append((target, group, scheduled - t0, end - start, start - scheduled, ok))

        tasks = []
        t0 = time.perf_counter() + 0.1
        for i in range(n):
            scheduled = t0 + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(targets[i], i // len(TARGETS), scheduled, t0)))
        await asyncio.gather(*tasks)
    return results


def _summary(values: np.ndarray) -> dict[str, float]:
    ms = values * 1000
    return {
        "n": len(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


def _one_repeat(rows: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target in TARGETS:
        mine = [r for r in rows if r[0] == target]
        ok = np.array([r[3] for r in mine if r[5]])
        out[target] = _summary(ok) | {"errors": sum(not r[5] for r in mine)}
    # A group's calls ran ~1/rate apart, so machine-wide stalls hit all of them: the
    # paired differences are the steadiest estimates on a busy machine.
    by_group: dict[int, dict[str, float]] = {}
    for target, group, _, latency, _, ok_ in rows:
        if ok_:
            by_group.setdefault(group, {})[target] = latency
    for target in ("relmon", "nginx"):
        diffs = np.array([g[target] - g["direct"] for g in by_group.values() if len(g) == 3])
        out[f"{target}_paired_added_ms"] = float(np.median(diffs) * 1000)
        out[f"{target}_paired_added_p99_ms"] = float(np.percentile(diffs, 99) * 1000)
    out["scheduler_lag"] = _summary(np.array([r[4] for r in rows]))
    return out


def run(rate: float, duration: float, warmup: float, repeats: int, seed: int) -> dict[str, Any]:
    start_machine = benchlib.machine()
    with tempfile.TemporaryDirectory(prefix="relmon-proxy-bench-") as tmp_name:
        tmp = Path(tmp_name)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-upstream"]
        upstream, up_port = benchlib.spawn_with_port(cmd, "upstream")
        relmon = nginx = None
        try:
            relmon, ports = benchlib.start_relmon_service(
                tmp,
                f"http://127.0.0.1:{up_port}/v1",
                traffic_mode="proxy",
                upstream_url=f"http://127.0.0.1:{up_port}",
            )
            nginx_port = benchlib.free_port()
            nginx = start_nginx(tmp / "nginx", nginx_port, up_port)
            urls = {
                "direct": f"http://127.0.0.1:{up_port}/v1/chat/completions",
                "relmon": f"http://127.0.0.1:{ports['traffic']}/v1/chat/completions",
                "nginx": f"http://127.0.0.1:{nginx_port}/v1/chat/completions",
            }
            repeats_out = []
            for r in range(repeats):
                rows = asyncio.run(_load(urls, rate, duration, seed + r))
                one = _one_repeat([x for x in rows if x[2] >= warmup])
                repeats_out.append(one)
                print(
                    f"  repeat {r + 1}: "
                    + "  ".join(
                        f"{t} p50 {one[t]['p50_ms']:.2f} p99 {one[t]['p99_ms']:.2f} ms"
                        for t in TARGETS
                    ),
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            if nginx is not None:
                benchlib.stop(nginx)
            if relmon is not None:
                benchlib.stop(relmon)
            benchlib.stop(upstream)

    def med(path: tuple[str, ...]) -> float:
        values = []
        for rep in repeats_out:
            v: Any = rep
            for key in path:
                v = v[key]
            values.append(float(v))
        return benchlib.median(values)

    report: dict[str, Any] = {
        "benchmark": "proxy",
        "load_generator": "aiohttp client, open loop, its own process",
        "rate_per_s": rate,
        "duration_s": duration,
        "warmup_s": warmup,
        "repeats": repeats,
        "machine": start_machine,
        "repeat_results": repeats_out,
    }
    for target in TARGETS:
        report[target] = {k: med((target, k)) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")} | {
            "errors": sum(rep[target]["errors"] for rep in repeats_out)
        }
    d = report["direct"]
    for target in ("relmon", "nginx"):
        t = report[target]
        report[f"{target}_added"] = {
            "p50_ms": t["p50_ms"] - d["p50_ms"],
            "p99_ms": t["p99_ms"] - d["p99_ms"],
            "paired_median_ms": med((f"{target}_paired_added_ms",)),
            "paired_p99_ms": med((f"{target}_paired_added_p99_ms",)),
            "p50_ratio_to_direct": t["p50_ms"] / d["p50_ms"],
            "p99_ratio_to_direct": t["p99_ms"] / d["p99_ms"],
        }
    ra, na = report["relmon_added"], report["nginx_added"]
    report["relmon_vs_nginx"] = {
        "p50_ratio": report["relmon"]["p50_ms"] / report["nginx"]["p50_ms"],
        "p99_ratio": report["relmon"]["p99_ms"] / report["nginx"]["p99_ms"],
        "added_p50_ratio": ra["p50_ms"] / na["p50_ms"] if na["p50_ms"] > 0 else None,
        "added_p99_ratio": ra["p99_ms"] / na["p99_ms"] if na["p99_ms"] > 0 else None,
    }
    report["scheduler_lag_p99_ms"] = med(("scheduler_lag", "p99_ms"))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=300.0, help="requests per second, total")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load a repeat")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds dropped at start")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 s, 1 repeat (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        asyncio.run(_serve_upstream())
        return
    if args.quick:
        args.rate, args.duration, args.warmup, args.repeats = 150.0, 2.0, 0.5, 1
    report = run(args.rate, args.duration, args.warmup, args.repeats, args.seed)
    if args.json:
        benchlib.write_json(report, args.json)
    print(
        f"open loop: {args.rate:g} req/s for {args.duration:g} s x {args.repeats} "
        f"(first {args.warmup:g} s dropped); medians over the repeats"
    )
    for target in TARGETS:
        s = report[target]
        print(
            f"{target:>7}: errors={s['errors']} p50={s['p50_ms']:.3f} ms "
            f"p90={s['p90_ms']:.3f} ms p99={s['p99_ms']:.3f} ms"
        )
    for target in ("relmon", "nginx"):
        a = report[f"{target}_added"]
        print(
            f"{target} added: p50 +{a['p50_ms']:.3f} ms, p99 +{a['p99_ms']:.3f} ms, "
            f"paired median +{a['paired_median_ms']:.3f} ms"
        )
    v = report["relmon_vs_nginx"]
    print(f"relmon/nginx: p50 x{v['p50_ratio']:.2f}, p99 x{v['p99_ratio']:.2f}")


if __name__ == "__main__":
    main()
