"""Overload soak: the whole service for ``--seconds`` (default 10 minutes) with mirrored
traffic whose sampled share needs ``--budget-factor`` (default 5) times the model-call
budget. Not a test and not in CI: ``make soak`` (``make soak SOAK_SECONDS=120`` for a
shorter run).

Processes on 127.0.0.1: a simulated model (the demo's arithmetic model, each call
taking ``--model-latency-ms``), ``relmon run`` (mirror, one task, budget
``--calls-per-minute``, default ``max_in_flight`` 8 and ``queue_size`` 64), a bare
aiohttp handler answering 202 (the baseline: one request in ten is also sent to it, so
the machine's own stalls show in its latency too), and this load generator (aiohttp,
open loop: requests start on a fixed schedule whatever the latency; like a mirroring
proxy's connection pool it opens a new connection when every open one is busy, up to
``--max-connections``, 256; past it a request waits for a free one, and its latency
counts the wait). The request rate is
chosen so that the sampled events would need ``budget-factor x calls-per-minute`` calls
at the fewest samples an item can take (8, unanimous answers), so the real overload is
at least that.

Every ``--scrape-every`` seconds it reads relmon's /metrics and the process's RSS. At
the end it checks what must hold under overload and reports it:

- relmon's RSS at start (after start-up, before load), after the first minute, its
  maximum and at the end; the bare handler's beside it;
- queue bounds held: items admitted but not finished (sampled - scored - abandoned)
  never above ``queue_size + max_in_flight``; after the first minute (the bucket starts
  full) the model saw no more calls a minute on average than the budget allows (a single
  minute may also hold the calls of items admitted before it began);
- drops counted: every request sent was answered 202, and every 202 counted once, as
  sampled, skipped, dropped or rejected;
- the mirror's latency: p50/p99 per interval and over the whole run, beside the bare
  handler's; requests over 1 s; connections opened; the kernel's count of connections
  dropped from a full listen queue during the run (machine-wide).

    .venv/bin/python bench/soak.py [--seconds 600] [--json FILE]
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

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib

FEWEST_SAMPLES = 8  # the default rule's fewest samples per item (unanimous answers)
QUEUE_SIZE, MAX_IN_FLIGHT = 64, 8
DECISIONS = ("sampled", "skipped", "dropped", "rejected")  # one of them counts each event
CONTROL_EVERY = 10  # one request in ten also goes to a bare 202 handler, the baseline


async def _serve_model(latency_s: float) -> None:
    from aiohttp import web

    from monitor.app.demo.model import QuestionBank, SimulatedModel

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    class SlowModel(SimulatedModel):
        async def _completions(self, request: web.Request) -> web.Response:
            await asyncio.sleep(latency_s)
            return await super()._completions(request)

    model = SlowModel(drift_after_s=None, bank=QuestionBank(size=400, seed=7), seed=5)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"calls": model.calls})

    await model.start()
    # A second tiny app for the call counter (the model's own app is already frozen).
    app = web.Application()
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"STATS {runner.addresses[0][1]}", flush=True)
    print(f"PORT {model.bound_port}", flush=True)
    await stop.wait()
    await runner.cleanup()
    await model.stop()


def _spawn_model(latency_ms: float) -> tuple[subprocess.Popen[bytes], int, int]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-model", str(latency_ms)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    stats_port = None
    for raw in proc.stdout:
        line = raw.decode()
        if line.startswith("STATS "):
            stats_port = int(line.split()[1])
        if line.startswith("PORT ") and stats_port is not None:
            return proc, int(line.split()[1]), stats_port
    benchlib.stop(proc)
    raise RuntimeError("the model exited during start")


async def _get(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
        return await resp.text()


def _counts(text: str) -> dict[str, float]:
    out = {
        d: benchlib.metric_sum(text, "relmon_traffic_events_total", source="mirror", decision=d)
        for d in DECISIONS
    }
    for outcome in ("scored", "abandoned"):
        out[outcome] = benchlib.metric_sum(text, "relmon_items_total", outcome=outcome)
    out["review_queue_depth"] = benchlib.metric_sum(text, "relmon_review_queue_depth")
    out["budget_utilization"] = benchlib.metric_sum(text, "relmon_budget_utilization")
    out["samples_sum"] = benchlib.metric_sum(text, "relmon_samples_per_item_sum")
    out["samples_count"] = benchlib.metric_sum(text, "relmon_samples_per_item_count")
    return out


async def _soak(
    *,
    mirror_url: str,
    control_url: str,
    control_every: int,
    metrics_url: str,
    stats_url: str,
    pid: int,
    bare_pid: int,
    max_connections: int,
    rate: float,
    seconds: float,
    scrape_every: float,
) -> dict[str, Any]:
    from monitor.app.demo.model import QuestionBank

    questions = [q for q, _ in QuestionBank(size=400, seed=7).questions]
    headers = {"Content-Type": "application/json", "Authorization": "Bearer app-key"}
    bodies = [
        json.dumps({"model": "bench-model", "messages": [{"role": "user", "content": q}]}).encode()
        for q in questions
    ]
    latencies: list[tuple[float, float]] = []  # (seconds since start, latency)
    control_latencies: list[float] = []
    statuses: dict[str, int] = {}
    timeline: list[dict[str, Any]] = []
    # Like a mirroring proxy's pool: up to max_connections, a new one when all are busy
    # (0: no limit at all; then a stall of the machine ends in a burst of new connections).
    connector = aiohttp.TCPConnector(limit=max_connections)
    opened = [0]
    scrape_errors: dict[str, int] = {}
    bare_rss = [benchlib.rss_kb(bare_pid)]

    async def on_connection(*_: Any) -> None:
        opened[0] += 1

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(on_connection)
    overflows_start = benchlib.listen_overflows()
    async with (
        aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as session,
        aiohttp.ClientSession() as scrape_session,  # its own connections: never queued
    ):
        rss_start = benchlib.rss_kb(pid)
        calls_start = json.loads(await _get(scrape_session, stats_url))["calls"]
        t0 = time.perf_counter() + 0.2

        async def one(body: bytes) -> None:
            start = time.perf_counter()
            try:
                async with session.post(mirror_url, data=body, headers=headers) as r:
                    await r.read()
                    key = str(r.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                key = type(exc).__name__
            latencies.append((start - t0, time.perf_counter() - start))
            statuses[key] = statuses.get(key, 0) + 1

        async def control(body: bytes) -> None:
            """The same request to the bare 202 handler: the machine's own stalls."""
            start = time.perf_counter()
            try:
                async with session.post(control_url, data=body, headers=headers) as r:
                    await r.read()
            except (aiohttp.ClientError, TimeoutError):
                pass
            control_latencies.append(time.perf_counter() - start)

        async def scraper() -> None:
            next_at = t0 + scrape_every
            seen = seen_control = 0
            while True:
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                next_at += scrape_every
                try:
                    text = await _get(scrape_session, metrics_url)
                    calls = json.loads(await _get(scrape_session, stats_url))["calls"]
                except (aiohttp.ClientError, TimeoutError) as exc:
                    name = type(exc).__name__
                    scrape_errors[name] = scrape_errors.get(name, 0) + 1
                    continue
                calls -= calls_start
                bare_rss.append(benchlib.rss_kb(bare_pid))
                row = {"t": round(time.perf_counter() - t0, 1), "rss_kb": benchlib.rss_kb(pid)}
                row["bare_rss_kb"] = bare_rss[-1]
                row |= _counts(text) | {"model_calls": calls}
                row["in_system"] = row["sampled"] - row["scored"] - row["abandoned"]
                recent = [x[1] for x in latencies[seen:]]
                seen = len(latencies)
                row["mirror_p99_ms"] = float(np.percentile(recent, 99) * 1000) if recent else None
                recent = control_latencies[seen_control:]
                seen_control = len(control_latencies)
                row["bare_p99_ms"] = float(np.percentile(recent, 99) * 1000) if recent else None
                row["connections_opened"] = opened[0]
                row["listen_overflows"] = _delta(benchlib.listen_overflows(), overflows_start)
                timeline.append(row)
                print(
                    f"  t={row['t']:6.0f}s rss={row['rss_kb'] / 1024:6.1f} MB "
                    f"sampled={row['sampled']:.0f} dropped={row['dropped']:.0f} "
                    f"in system={row['in_system']:.0f} calls={calls} "
                    f"review queue={row['review_queue_depth']:.0f} "
                    f"p99={row['mirror_p99_ms'] or 0:.1f} ms (bare {row['bare_p99_ms'] or 0:.1f}) "
                    f"connections={opened[0]} "
                    f"listen overflows={row['listen_overflows']}",
                    file=sys.stderr,
                    flush=True,
                )

        scrape_task = asyncio.create_task(scraper())
        tasks: set[asyncio.Task[None]] = set()
        n = int(rate * seconds)
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(bodies[i % len(bodies)]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if i % control_every == 0:
                task = asyncio.create_task(control(bodies[i % len(bodies)]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        await asyncio.gather(*list(tasks))
        sent_for = time.perf_counter() - t0
        scrape_task.cancel()
        await asyncio.gather(scrape_task, return_exceptions=True)
        # The mirror counts an event just after its 202: wait (up to 60 s, an overloaded
        # machine may lag) until every answered request is counted, then 1 s more so a
        # request counted twice would show.
        answered = statuses.get("202", 0)
        for _ in range(600):
            final = _counts(await _get(scrape_session, metrics_url))
            if sum(final[d] for d in DECISIONS) >= answered:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        final = _counts(await _get(scrape_session, metrics_url))
        final_calls = json.loads(await _get(scrape_session, stats_url))["calls"] - calls_start
        rss_end = benchlib.rss_kb(pid)
        bare_rss.append(benchlib.rss_kb(bare_pid))
    return {
        "scrape_errors": scrape_errors,
        "bare_rss_kb": bare_rss,
        "connections_opened": opened[0],
        "listen_overflows": _delta(benchlib.listen_overflows(), overflows_start),
        "sent": n,
        "sent_for_s": sent_for,
        "statuses": statuses,
        "latencies": latencies,
        "control_latencies": control_latencies,
        "timeline": timeline,
        "final": final,
        "model_calls": final_calls,
        "rss_start_kb": rss_start,
        "rss_end_kb": rss_end,
    }


def _delta(now: int | None, start: int | None) -> int | None:
    return None if now is None or start is None else now - start


def _calls_per_minute_max(timeline: list[dict[str, Any]], after_s: float) -> float | None:
    """The most model calls in any 60 s between scrapes, counting only windows after ``after_s``."""
    best = None
    for i, a in enumerate(timeline):
        if a["t"] < after_s:
            continue
        for b in timeline[i + 1 :]:
            span = b["t"] - a["t"]
            if span >= 59.0:
                per_min = (b["model_calls"] - a["model_calls"]) * 60.0 / span
                best = per_min if best is None else max(best, per_min)
                break
    return best


def run(args: argparse.Namespace) -> dict[str, Any]:
    start_machine = benchlib.machine()
    rate = args.budget_factor * args.calls_per_minute / 60.0 / (args.sampling_rate * FEWEST_SAMPLES)
    with tempfile.TemporaryDirectory(prefix="relmon-soak-") as tmp_name:
        tmp = Path(tmp_name)
        model, model_port, stats_port = _spawn_model(args.model_latency_ms)
        bare_cmd = [sys.executable, str(Path(__file__).resolve().parent / "mirror_bench.py")]
        bare, bare_port = benchlib.spawn_with_port([*bare_cmd, "--serve", "bare"], "bare server")
        relmon = None
        try:
            relmon, ports = benchlib.start_relmon_service(
                tmp,
                f"http://127.0.0.1:{model_port}/v1",
                sampling_rate=args.sampling_rate,
                calls_per_minute=args.calls_per_minute,
                max_in_flight=MAX_IN_FLIGHT,
                queue_size=QUEUE_SIZE,
            )
            print(
                f"soak: {rate:.0f} req/s for {args.seconds:g} s, sampling {args.sampling_rate:g}, "
                f"budget {args.calls_per_minute} calls/min (x{args.budget_factor:g} offered)",
                file=sys.stderr,
                flush=True,
            )
            out = asyncio.run(
                _soak(
                    mirror_url=f"http://127.0.0.1:{ports['traffic']}/v1/chat/completions",
                    control_url=f"http://127.0.0.1:{bare_port}/v1/chat/completions",
                    control_every=CONTROL_EVERY,
                    metrics_url=f"http://127.0.0.1:{ports['metrics']}/metrics",
                    stats_url=f"http://127.0.0.1:{stats_port}/stats",
                    pid=relmon.pid,
                    bare_pid=bare.pid,
                    max_connections=args.max_connections,
                    rate=rate,
                    seconds=args.seconds,
                    scrape_every=args.scrape_every,
                )
            )
            alive = relmon.poll() is None
        finally:
            if relmon is not None:
                benchlib.stop(relmon)
            benchlib.stop(model)
            benchlib.stop(bare)
    control_lat = np.array(out.pop("control_latencies") or [0.0]) * 1000
    lat = np.array([x[1] for x in out.pop("latencies")] or [0.0]) * 1000
    timeline = out["timeline"]
    final = out["final"]
    counted = sum(final[d] for d in DECISIONS)
    offered_items = final["sampled"] + final["dropped"]
    mean_samples = final["samples_sum"] / final["samples_count"] if final["samples_count"] else 0.0
    minutes = out["sent_for_s"] / 60.0
    rss_minute = next((r["rss_kb"] for r in timeline if r["t"] >= 60.0), None)
    bound = QUEUE_SIZE + MAX_IN_FLIGHT
    max_in_system = max((r["in_system"] for r in timeline), default=0.0)
    calls_max = _calls_per_minute_max(timeline, 60.0)
    after = [r for r in timeline if r["t"] >= 60.0]
    calls_mean = (
        (after[-1]["model_calls"] - after[0]["model_calls"])
        * 60.0
        / (after[-1]["t"] - after[0]["t"])
        if len(after) >= 2 and after[-1]["t"] - after[0]["t"] >= 30.0
        else None
    )
    return {
        "benchmark": "soak",
        "machine": start_machine,
        "load_generator": "aiohttp client, open loop, its own process",
        "seconds": args.seconds,
        "rate_per_s": rate,
        "sampling_rate": args.sampling_rate,
        "calls_per_minute_budget": args.calls_per_minute,
        "budget_factor_asked": args.budget_factor,
        "model_latency_ms": args.model_latency_ms,
        "offered_factor_measured": (
            offered_items * mean_samples / minutes / args.calls_per_minute if minutes else 0.0
        ),
        "mean_samples_per_item": mean_samples,
        "sent": out["sent"],
        "statuses": out["statuses"],
        "counted": counted,
        "all_answered": out["statuses"].get("202", 0) == out["sent"],
        "all_counted_once": counted == out["statuses"].get("202", 0),
        "scrape_errors": out["scrape_errors"],
        "max_connections": args.max_connections,
        "bare_rss_start_mb": out["bare_rss_kb"][0] / 1024,
        "bare_rss_max_mb": max(out["bare_rss_kb"]) / 1024,
        "bare_rss_end_mb": out["bare_rss_kb"][-1] / 1024,
        "final": final,
        "dropped_share_of_sampled": final["dropped"] / offered_items if offered_items else 0.0,
        "rss_start_mb": out["rss_start_kb"] / 1024,
        "rss_after_1min_mb": rss_minute / 1024 if rss_minute else None,
        "rss_end_mb": out["rss_end_kb"] / 1024,
        "rss_max_mb": max([out["rss_end_kb"], *(r["rss_kb"] for r in timeline)]) / 1024,
        "in_system_max": max_in_system,
        "in_system_bound": bound,
        "queue_bound_held": max_in_system <= bound,
        "model_calls": out["model_calls"],
        "model_calls_per_minute_mean_after_1min": calls_mean,
        "model_calls_per_minute_max_after_1min": calls_max,
        # The bucket bounds reservations: a minute's calls may exceed it by the calls of
        # items admitted (reserved) before that minute began; the mean may not.
        "budget_held": calls_mean is None or calls_mean <= args.calls_per_minute * 1.02,
        "mirror_p50_ms": float(np.percentile(lat, 50)),
        "mirror_p99_ms": float(np.percentile(lat, 99)),
        "mirror_max_ms": float(lat.max()),
        "mirror_over_1s": int((lat > 1000).sum()),
        "bare_requests": int(control_lat.size),
        "bare_p50_ms": float(np.percentile(control_lat, 50)),
        "bare_p99_ms": float(np.percentile(control_lat, 99)),
        "bare_max_ms": float(control_lat.max()),
        "bare_over_1s": int((control_lat > 1000).sum()),
        "mirror_p99_ratio_to_bare": float(np.percentile(lat, 99) / np.percentile(control_lat, 99)),
        "connections_opened": out["connections_opened"],
        "listen_overflows_machine_wide": out["listen_overflows"],
        "relmon_alive_at_end": alive,
        "timeline": timeline,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--budget-factor", type=float, default=5.0)
    parser.add_argument("--calls-per-minute", type=int, default=600)
    parser.add_argument("--sampling-rate", type=float, default=0.02)
    parser.add_argument("--model-latency-ms", type=float, default=100.0)
    parser.add_argument("--scrape-every", type=float, default=10.0)
    parser.add_argument(
        "--max-connections",
        type=int,
        default=256,
        help="the load generator's connection pool (0: unbounded, a new connection whenever "
        "all are busy)",
    )
    parser.add_argument("--quick", action="store_true", help="4 s (a smoke test)")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--serve-model", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_model is not None:
        asyncio.run(_serve_model(args.serve_model / 1000.0))
        return
    if args.quick:
        args.seconds, args.scrape_every = 4.0, 1.0
    report = run(args)
    if args.json:
        benchlib.write_json(report, args.json)
    summary = {k: v for k, v in report.items() if k not in ("timeline", "machine")}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
