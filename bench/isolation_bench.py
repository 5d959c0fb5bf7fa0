"""What relmon's own work does to the live requests it proxies: ``traffic.data_plane:
inline`` (one process) against ``process`` (the listener in a process of its own), in
the same run.

Processes on 127.0.0.1: the demo's simulated model (arithmetic answers in varied
wordings) twice, once as the proxy's upstream and once as the model relmon re-asks (so
the re-asks' load does not slow the upstream the live requests and the direct calls
share, as a model server on its own machine would not be); two ``relmon run``
in proxy mode in front of it, the same configuration but for ``traffic.data_plane``:
one task with the ``embedding`` canonicalizer (its cache off, so every item embeds its
answers on the CPU; ``--canonicalizer numeric`` for the cheap one), half the traffic
sampled, a budget that refuses none; and this load generator, open loop. A window sends
``--rate`` requests per second for ``--duration`` seconds, alternating between one
relmon and the model directly (the paired baseline); the windows alternate between the
two relmons, ``--repeats`` each. The first window of each relmon is cold (the embedding
model is loaded at start, before traffic, but its first encodes run now).

Reported, for each: the latency it adds to the direct call (p50, p99, the slowest),
cold and warm (the median over the warm windows), and the items it scored.

    .venv/bin/python bench/isolation_bench.py [--repeats 3] [--duration 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib

PLANES = ("inline", "process")


def _config(  # noqa: PLR0917
    path: Path,
    model_port: int,
    upstream_port: int,
    ports: dict[str, int],
    plane: str,
    args: argparse.Namespace,
) -> None:
    canon = args.canonicalizer
    threads = f", threads: {args.embedding_threads}" if args.embedding_threads else ""
    options = f"{{cache_size: 0{threads}}}" if canon == "embedding" else "{}"
    path.write_text(
        f"""tasks:
  - name: arithmetic
    canonicalizer: {canon}
    canonicalizer_options: {options}
    endpoint: {{base_url: "http://127.0.0.1:{model_port}/v1", model: sim-arith-1,
      concurrency: 8, timeout_s: 30}}
    k_max: 10
    k0: 5
    sampling_rate: 0.5
    review_rate: 0.1
traffic: {{mode: proxy, port: {ports["traffic"]}, upstream_url: "http://127.0.0.1:{upstream_port}",
  data_plane: {plane}}}
metrics: {{port: {ports["metrics"]}}}
review: {{port: {ports["review"]}}}
budget: {{calls_per_minute: 1000000, max_in_flight: 16, queue_size: 256}}
state_dir: "{path.parent / "state"}"
log_format: json
"""
    )


async def _serve_model() -> None:
    sys.path.insert(0, str(benchlib.ROOT))
    from monitor.app.demo.model import QuestionBank, SimulatedModel

    model = SimulatedModel(drift_after_s=None, bank=QuestionBank(size=50, seed=1))
    await model.start()
    print(f"PORT {model.bound_port}", flush=True)
    await asyncio.Event().wait()


async def _window(url: str, direct: str, rate: float, seconds: float, tag: str) -> dict[str, Any]:
    """Open loop: request i starts at i / rate, to relmon (even i) or the model (odd i)."""
    latencies: dict[str, list[float]] = {"relmon": [], "direct": []}
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            nonlocal errors
            target = "relmon" if i % 2 == 0 else "direct"
            body = {
                "model": "sim-arith-1",
                "messages": [{"role": "user", "content": f"What is {i % 50} + {i % 7}?"}],
            }
            headers = {"X-Request-Id": f"{tag}-{i}"}
            start = time.perf_counter()
            try:
                async with session.post(
                    url if target == "relmon" else direct, json=body, headers=headers
                ) as resp:
                    await resp.read()
                    ok = resp.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                latencies[target].append(time.perf_counter() - start)
            else:
                errors += 1

        tasks = []
        t0 = time.perf_counter() + 0.05
        for i in range(int(rate * seconds)):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    r, d = (np.array(latencies[k]) * 1000 for k in ("relmon", "direct"))
    return {
        "added_p50_ms": float(np.percentile(r, 50) - np.percentile(d, 50)),
        "added_p99_ms": float(np.percentile(r, 99) - np.percentile(d, 99)),
        "max_ms": float(r.max()),
        "direct_max_ms": float(d.max()),
        "requests": len(r),
        "errors": errors,
    }


def _scored(metrics_port: int) -> float:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("relmon_items_total{") and 'outcome="scored"' in line
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    start_machine = benchlib.machine()
    windows: dict[str, list[dict[str, Any]]] = {p: [] for p in PLANES}
    scored: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="relmon-isolation-") as tmp_name:
        tmp = Path(tmp_name)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-model"]
        model, model_port = benchlib.spawn_with_port(cmd, "model")
        upstream, upstream_port = benchlib.spawn_with_port(cmd, "upstream")
        relmons: dict[str, tuple[Any, dict[str, int]]] = {}
        try:
            for plane in PLANES:
                ports = {k: benchlib.free_port() for k in ("metrics", "review", "traffic")}
                (tmp / plane).mkdir()
                config = tmp / plane / "relmon.yaml"
                _config(config, model_port, upstream_port, ports, plane, args)
                proc = benchlib.start_relmon(config, tmp / plane / "relmon.log", ports["metrics"])
                relmons[plane] = (proc, ports)
                benchlib.wait_port(ports["traffic"], proc)
            direct = f"http://127.0.0.1:{upstream_port}/v1/chat/completions"
            for r in range(args.repeats):
                order = PLANES if r % 2 == 0 else PLANES[::-1]
                for plane in order:
                    url = f"http://127.0.0.1:{relmons[plane][1]['traffic']}/v1/chat/completions"
                    result = asyncio.run(
                        _window(url, direct, args.rate, args.duration, f"{plane}{r}")
                    )
                    windows[plane].append(result)
                    print(
                        f"  {plane:>7} window {r + 1}: added p50 {result['added_p50_ms']:.3f} "
                        f"p99 {result['added_p99_ms']:.3f} ms, slowest {result['max_ms']:.1f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
                    time.sleep(args.settle)  # the items of the window finish
            for plane, (_, ports) in relmons.items():
                scored[plane] = _scored(ports["metrics"])
        finally:
            for proc, _ in relmons.values():
                benchlib.stop(proc)
            benchlib.stop(upstream)
            benchlib.stop(model)

    def warm(plane: str, key: str) -> float | None:
        values = [w[key] for w in windows[plane][1:]]
        return benchlib.median(values) if values else None

    report: dict[str, Any] = {
        "benchmark": "isolation",
        "load_generator": "aiohttp client, open loop, its own process",
        "canonicalizer": args.canonicalizer,
        "embedding_threads": args.embedding_threads,
        "rate_per_s": args.rate,
        "duration_s": args.duration,
        "repeats": args.repeats,
        "machine": start_machine,
        "windows": windows,
        "items_scored": scored,
    }
    for plane in PLANES:
        report[plane] = {
            "cold": {k: windows[plane][0][k] for k in ("added_p50_ms", "added_p99_ms", "max_ms")},
            "warm": {k: warm(plane, k) for k in ("added_p50_ms", "added_p99_ms", "max_ms")},
            "errors": sum(w["errors"] for w in windows[plane]),
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds a window")
    parser.add_argument("--repeats", type=int, default=3, help="windows for each relmon")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between windows")
    parser.add_argument("--canonicalizer", default="embedding", choices=["embedding", "numeric"])
    parser.add_argument(
        "--embedding-threads", type=int, help="the embedding canonicalizer's threads option"
    )
    parser.add_argument("--quick", action="store_true", help="2 windows of 2 s (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--serve-model", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_model:
        asyncio.run(_serve_model())
        return
    if args.quick:
        args.duration, args.repeats, args.rate, args.settle = 2.0, 2, 50.0, 1.0
    report = run(args)
    if args.json:
        benchlib.write_json(report, args.json)
    for plane in PLANES:
        for phase in ("cold", "warm"):
            v = report[plane][phase]
            if v["added_p50_ms"] is None:
                continue
            print(
                f"{plane:>7} {phase}: added p50 {v['added_p50_ms']:.3f} ms, "
                f"p99 {v['added_p99_ms']:.3f} ms, slowest {v['max_ms']:.1f} ms"
            )
        print(f"{plane:>7}: {report['items_scored'][plane]:.0f} items scored")


if __name__ == "__main__":
    main()
