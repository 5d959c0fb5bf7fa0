"""Where the live path waits on relmon's own work: the event-loop callbacks of a whole
``relmon run`` that hold the loop longer than ``--threshold-us`` (100 µs), by what ran,
while wrk keeps ``--connections`` (8) proxied requests in flight.

With the listener inline, every live request waits while any callback runs: a data-plane
callback costs a few µs, so a long one is mostly relmon's own work (parsing and offering
a sampled request, a worker's step of an item, the store, a refresh); the rest are
data-plane callbacks the machine paused (another process ran, a garbage collection),
about as many with nothing sampled. Each holds the
requests then in flight; many of them make the proxy's added p99 (76 per 10k requests
when every sampled request was parsed and offered on its own), a few do not (a task
holding the loop for 200 µs eight times every 0.6 s left the added p99 where it was).
On a shared machine this count moves
between repeats too, but a change in relmon's own work stands out of that spread where
wrk's p99 often cannot: in one run 15.2-17.8 against 59-89 long callbacks per 10k
requests, where the same two checkouts' p99 differed by 0.14 ms, less than wrk's p99 of
one checkout moves between runs.

``relmon run`` in proxy mode (one task, 1% of the traffic sampled and re-asked, budget
600 calls a minute) in front of nginx answering a fixed chat completion, on asyncio's own
loop (``traffic.uvloop: false``: its callbacks can be timed from Python, uvloop's
cannot), every callback timed (``asyncio.Handle._run``). ``--baseline-tree PATH``: the
same from another checkout (``git worktree add PATH COMMIT``, compiled as this one), run
alternately with this one: before/after figures from one run.

Reported per tree, medians over ``--repeats``: requests, long callbacks and the time
they held the loop per 10,000 requests, wrk's p99; and the long callbacks by what ran,
summed over the repeats.

    .venv/bin/python bench/loop_stall_bench.py [--seconds 10] [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
from proxy_saturation_bench import HEADERS, REQUEST, start_static_upstream

SERVE = Path(__file__).with_name("loop_stall_serve.py")


def _one(
    tree: Path, tmp: Path, up_port: int, script: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One ``relmon run`` from ``tree``, one wrk run against it, its long callbacks."""
    tmp.mkdir(parents=True, exist_ok=True)
    ports = {k: benchlib.free_port() for k in ("metrics", "review", "traffic")}
    config = tmp / "relmon.yaml"
    benchlib.relmon_config(
        config,
        model_url=f"http://127.0.0.1:{up_port}/v1",
        state_dir=tmp / "state",
        ports=ports,
        traffic_mode="proxy",
        upstream_url=f"http://127.0.0.1:{up_port}",
        traffic_extra="uvloop: false",
    )
    out = tmp / "stalls.json"
    env = {
        **os.environ,
        "RELMON_REVIEW_TOKEN": benchlib.REVIEW_TOKEN,
        "PYTHONPATH": str(tree),
        "RELMON_LOOP_STALLS_OUT": str(out),
        "RELMON_LOOP_STALL_US": str(args.threshold_us),
    }
    cmd = [sys.executable, str(SERVE), "run", "--config", str(config)]
    with (tmp / "relmon.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        benchlib.wait_http(f"http://127.0.0.1:{ports['metrics']}/readyz", proc)
        benchlib.wait_port(ports["traffic"], proc)
        url = f"http://127.0.0.1:{ports['traffic']}/v1/chat/completions"
        benchlib.wrk(url, script, connections=args.connections, seconds=1)  # warm-up
        proc.send_signal(signal.SIGUSR1)  # from here on: the start's are not counted
        time.sleep(0.2)
        res = benchlib.wrk(url, script, connections=args.connections, seconds=args.seconds)
    finally:
        benchlib.stop(proc)
    stalls = json.loads(out.read_text())
    per_10k = 10_000 / max(res["requests"], 1)
    return {
        "requests": res["requests"],
        "requests_per_s": res["requests_per_s"],
        "p50_ms": res["p50_ms"],
        "p99_ms": res["p99_ms"],
        "errors": res["non_2xx"] + res["socket_errors"],
        "long_callbacks_per_10k": sum(s["count"] for s in stalls.values()) * per_10k,
        "held_ms_per_10k": sum(s["ms"] for s in stalls.values()) * per_10k,
        "by_callback": stalls,
    }


def _commit(tree: Path) -> str | None:
    """The checkout's commit, short (None when it is no git checkout)."""
    out = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or None


def run(args: argparse.Namespace) -> dict[str, Any]:
    start_machine = benchlib.machine()
    trees = {"relmon": benchlib.ROOT}
    if args.baseline_tree is not None:
        trees["before"] = args.baseline_tree
    reps: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="relmon-loop-stalls-") as tmp_name:
        tmp = Path(tmp_name)
        script = benchlib.wrk_script(tmp / "post.lua", REQUEST, HEADERS)
        up_port = benchlib.free_port()
        upstream = start_static_upstream(tmp / "upstream", up_port)
        try:
            names = list(trees)
            for r in range(args.repeats):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    rep = _one(trees[name], tmp / f"{name}-{r}", up_port, script, args)
                    reps[name].append(rep)
                    print(
                        f"  repeat {r + 1} {name}: {rep['requests_per_s']:,.0f} req/s, p99 "
                        f"{rep['p99_ms']:.3f} ms, {rep['long_callbacks_per_10k']:.1f} long "
                        f"callbacks and {rep['held_ms_per_10k']:.2f} ms held per 10k requests",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            benchlib.stop(upstream)
    summary: dict[str, Any] = {}
    for name, rs in reps.items():
        by: dict[str, dict[str, float]] = {}
        for rep in rs:
            for cb, s in rep["by_callback"].items():
                b = by.setdefault(cb, {"count": 0, "ms": 0.0})
                b["count"] += s["count"]
                b["ms"] += s["ms"]
        top = sorted(by.items(), key=lambda kv: -kv[1]["ms"])[: args.top]
        summary[name] = {
            key: statistics.median(r[key] for r in rs)
            for key in (
                "requests",
                "requests_per_s",
                "p50_ms",
                "p99_ms",
                "long_callbacks_per_10k",
                "held_ms_per_10k",
            )
        } | {
            "errors": sum(r["errors"] for r in rs),
            "by_callback": [{"callback": cb, **s} for cb, s in top],
        }
    return {
        "benchmark": "loop_stall",
        "seconds": args.seconds,
        "repeats": args.repeats,
        "connections": args.connections,
        "threshold_us": args.threshold_us,
        "baseline_tree": str(args.baseline_tree) if args.baseline_tree else None,
        "baseline_commit": _commit(args.baseline_tree) if args.baseline_tree else None,
        "compiled": {
            "relmon": benchlib.compiled(),
            "before": benchlib.compiled(args.baseline_tree) if args.baseline_tree else None,
        },
        "machine": start_machine,
        "repeat_results": reps,
        "trees": summary,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of wrk a repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--threshold-us", type=float, default=100.0)
    parser.add_argument("--top", type=int, default=8, help="callbacks listed per tree")
    parser.add_argument("--baseline-tree", type=Path, help="another checkout, run alternately")
    parser.add_argument("--quick", action="store_true", help="2 s, 1 repeat (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.repeats = 2.0, 1
    report = run(args)
    if args.json is not None:
        benchlib.write_json(report, args.json)
    for name, s in report["trees"].items():
        print(
            f"{name:>7}: {s['long_callbacks_per_10k']:6.1f} callbacks over "
            f"{args.threshold_us:g} us, {s['held_ms_per_10k']:6.2f} ms held per 10k requests "
            f"| p99 {s['p99_ms']:.3f} ms | {s['requests_per_s']:,.0f} req/s"
        )
        for cb in s["by_callback"][:5]:
            print(f"          {cb['count']:6d} {cb['ms']:8.1f} ms  {cb['callback']}")


if __name__ == "__main__":
    main()
