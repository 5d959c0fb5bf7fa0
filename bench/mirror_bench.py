"""Mirror ingest: requests/s and latency of relmon's mirror against a bare aiohttp handler
that reads the body and answers 202, with the same load generator in the same run.

Processes on 127.0.0.1: the bare handler, a simulated model, ``relmon run`` (the whole
service: mirror on, one task, default sampling rate 1% and budget 600 calls/min, so the
sampled events are re-asked, scored and, past the budget, dropped and counted) and the
load generator, Debian's ``wrk`` (C, one thread, closed loop: each connection sends its
next request when the previous answer arrives). Each repeat runs wrk against both
targets in alternating order (ABBA), at ``--connections`` connections (saturation: the
requests/s a single process sustains) and at one connection (latency without queueing).
Reported: medians over the repeats and the ratios relmon/bare. After the runs the
service's own counters are read to check every request was counted once.

    .venv/bin/python bench/mirror_bench.py [--seconds 5] [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib

REQUEST = json.dumps(
    {
        "model": "bench-model",
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "You are a calculator. Reply with the result."},
            {"role": "user", "content": "What is 17 + 25?"},
        ],
    }
).encode()
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer app-key"}


async def _serve(role: str) -> None:
    from aiohttp import web

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if role == "model":
        from monitor.app.demo.model import SimulatedModel

        model = SimulatedModel(drift_after_s=None, seed=3)
        url = await model.start()
        print(f"PORT {model.bound_port}", flush=True)
        print(f"URL {url}", flush=True)
        await stop.wait()
        await model.stop()
        return

    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=202)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", accept)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    await stop.wait()
    await runner.cleanup()


def _spawn(role: str) -> tuple[subprocess.Popen[bytes], int]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", role]
    return benchlib.spawn_with_port(cmd, f"{role} server")


def _counted(metrics_text: str) -> dict[str, float]:
    """relmon's mirror events by decision (each event is counted under exactly one)."""
    return {
        d: benchlib.metric_sum(
            metrics_text, "relmon_traffic_events_total", source="mirror", decision=d
        )
        for d in ("sampled", "skipped", "dropped", "rejected")
    }


def run(seconds: float, repeats: int, connections: int) -> dict[str, Any]:
    start_machine = benchlib.machine()
    with tempfile.TemporaryDirectory(prefix="relmon-mirror-bench-") as tmp_name:
        tmp = Path(tmp_name)
        script = benchlib.wrk_script(tmp / "post.lua", REQUEST, HEADERS)
        bare, bare_port = _spawn("bare")
        model, model_port = _spawn("model")
        relmon = None
        try:
            relmon, ports = benchlib.start_relmon_service(tmp, f"http://127.0.0.1:{model_port}/v1")
            urls = {
                "bare": f"http://127.0.0.1:{bare_port}/v1/chat/completions",
                "relmon": f"http://127.0.0.1:{ports['traffic']}/v1/chat/completions",
            }
            runs: dict[str, dict[str, list[dict[str, float]]]] = {
                load: {"bare": [], "relmon": []} for load in ("saturation", "one_connection")
            }
            sent = 0.0
            for target in ("bare", "relmon"):  # warm-up, not reported
                sent += (target == "relmon") * benchlib.wrk(
                    urls[target], script, connections=connections, seconds=1
                )["requests"]
            for r in range(repeats):
                order = ["bare", "relmon"] if r % 2 == 0 else ["relmon", "bare"]
                for load, conns in (("saturation", connections), ("one_connection", 1)):
                    for target in order:
                        res = benchlib.wrk(urls[target], script, connections=conns, seconds=seconds)
                        runs[load][target].append(res)
                        if target == "relmon":
                            sent += res["requests"]
                        print(
                            f"  run {r + 1} {load:14s} {target:6s} "
                            f"{res['requests_per_s']:9,.0f} req/s  p50 {res['p50_ms']:.2f} ms  "
                            f"p99 {res['p99_ms']:.2f} ms",
                            file=sys.stderr,
                            flush=True,
                        )
            # relmon counts each event just after its 202: wait (up to 60 s on a loaded
            # machine) until it has counted at least what wrk saw answered.
            for _ in range(600):
                counted = _counted(
                    benchlib.http_get(f"http://127.0.0.1:{ports['metrics']}/metrics")
                )
                if sum(counted.values()) >= sent:
                    break
                time.sleep(0.1)
        finally:
            if relmon is not None:
                benchlib.stop(relmon)
            benchlib.stop(model)
            benchlib.stop(bare)
    report: dict[str, Any] = {
        "benchmark": "mirror",
        "load_generator": "wrk 1 thread, closed loop, its own process",
        "seconds": seconds,
        "repeats": repeats,
        "connections": connections,
        "machine": start_machine,
        "requests_sent_to_relmon": sent,
        "relmon_events_counted": counted,
    }
    for load, by_target in runs.items():
        summary: dict[str, Any] = {}
        for target, results in by_target.items():
            summary[target] = {
                key: benchlib.median([x[key] for x in results])
                for key in ("requests_per_s", "p50_ms", "p90_ms", "p99_ms")
            } | {
                "errors": sum(x["non_2xx"] + x["socket_errors"] for x in results),
                "p99_ms_min": min(x["p99_ms"] for x in results),
                "p99_ms_max": max(x["p99_ms"] for x in results),
            }
        b, m = summary["bare"], summary["relmon"]
        summary["ratio"] = {
            "requests_per_s": m["requests_per_s"] / b["requests_per_s"],
            "p50": m["p50_ms"] / b["p50_ms"],
            "p99": m["p99_ms"] / b["p99_ms"],
        }
        report[load] = summary
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument(
        "--before",
        type=Path,
        action="append",
        default=[],
        help="an earlier run's JSON to show beside this one (repeatable)",
    )
    parser.add_argument(
        "--before-label", action="append", default=[], help="the label of each --before run"
    )
    parser.add_argument("--quick", action="store_true", help="1 s runs, 1 repeat (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--serve", choices=["bare", "model"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return
    if args.quick:
        args.seconds, args.repeats, args.connections = 1.0, 1, 4
    report = run(args.seconds, args.repeats, args.connections)
    report["before"] = [
        {k: v for k, v in json.loads(path.read_text()).items() if k != "before"} | {"label": label}
        for path, label in zip(args.before, args.before_label, strict=True)
    ]
    if args.json:
        benchlib.write_json(report, args.json)
    for load in ("saturation", "one_connection"):
        s = report[load]
        print(
            f"{load}: bare {s['bare']['requests_per_s']:,.0f} req/s p99 "
            f"{s['bare']['p99_ms']:.2f} ms | relmon {s['relmon']['requests_per_s']:,.0f} req/s "
            f"p99 {s['relmon']['p99_ms']:.2f} ms | ratio req/s {s['ratio']['requests_per_s']:.2f} "
            f"p99 x{s['ratio']['p99']:.2f}"
        )
    sent = report["requests_sent_to_relmon"]
    print(f"relmon counted {report['relmon_events_counted']} of {sent:.0f} requests")


if __name__ == "__main__":
    main()
