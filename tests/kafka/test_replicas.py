"""Real ``relmon run`` processes on a real Tansu broker: readiness while the broker is
gone and back, and three replicas in one consumer group with one calibration."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from monitor.app.demo.model import QuestionBank, SimulatedModel, truth_of
from monitor.core.canon import get_canonicalizer
from monitor.core.sampler import sampled
from tests.kafka import committed, free_port, http_get, new_topic, produce, unique
from tests.kafka.conftest import _wait_ready, spawn_broker, stop_broker
from tests.waiting import hold_still, wait_until

pytestmark = pytest.mark.timeout(600)  # ~40 s unloaded: room for a machine 10x slower

TASK = "arithmetic"
MODEL = "sim-arith-1"
LABELS = (("model", MODEL), ("task", TASK))
ALPHAS = (0.1, 0.2, 0.3)
SAMPLING = 0.7
BARRIER = b"barrier"
"""The key of the test's own marker records on the review topic (not review items)."""


def write_config(
    path: Path,
    model_url: str,
    bootstrap: str,
    *,
    topics: dict[str, str],
    group: str,
    port: int,
) -> None:
    path.write_text(
        f"""
tasks:
  - name: {TASK}
    canonicalizer: numeric
    endpoint: {{base_url: "{model_url}", model: {MODEL}, concurrency: 4, timeout_s: 5}}
    k_max: 10
    sampling_rate: {SAMPLING}
    review_rate: 1.0
    half_life_s: null
    alphas: [{", ".join(f"{a:g}" for a in ALPHAS)}]
metrics: {{port: {port}}}
traffic: {{mode: "off"}}
review: {{backend: kafka}}
budget: {{calls_per_minute: 1000000, max_in_flight: 8, queue_size: 256}}
kafka:
  enabled: true
  bootstrap_servers: "{bootstrap}"
  traffic_topic: {topics["traffic"]}
  review_topic: {topics["review"]}
  verdict_topic: {topics["verdict"]}
  dead_letter_topic: {topics["dlq"]}
  group_id: {group}
log_format: json
"""
    )


class Replica:
    """One ``relmon run`` subprocess with its metrics port and log."""

    def __init__(self, name: str, cfg: Path, port: int, log: Path) -> None:
        self.name, self.cfg, self.port, self.log = name, cfg, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "monitor", "run", "--config", str(self.cfg)],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=dict(os.environ),
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        return f"--- {self.name}\n" + self.log.read_text(errors="replace")[-3000:]

    async def get(self, path: str) -> tuple[int, str]:
        return await http_get(self.port, path, timeout_s=10)

    async def status(self, path: str = "/readyz") -> int:
        try:
            return (await self.get(path))[0]
        except (aiohttp.ClientError, TimeoutError):
            return 0

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        try:
            _, text = await self.get("/metrics")
        except (aiohttp.ClientError, TimeoutError):
            return {}
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


def value(m: dict[Any, float], name: str, **labels: str) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def threshold_key(alpha: float) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("relmon_conformal_threshold", tuple(sorted((*LABELS, ("alpha", f"{alpha:g}")))))


def events_of(bank: QuestionBank, prefix: str) -> list[tuple[str, bytes]]:
    return [
        (
            f"{prefix}{i}",
            json.dumps(
                {
                    "id": f"{prefix}{i}",
                    "model": MODEL,
                    "task": TASK,
                    "request": {"model": MODEL, "messages": [{"role": "user", "content": q}]},
                }
            ).encode(),
        )
        for i, (q, _) in enumerate(bank.questions)
    ]


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    made: list[Replica] = []
    yield made
    for r in made:
        r.stop()


async def test_readyz_is_503_while_the_broker_is_gone_and_recovers(
    private_kafka: tuple[str, subprocess.Popen[bytes]],
    tmp_path: Path,
    replicas: list[Replica],
) -> None:
    bootstrap, broker = private_kafka
    port = int(bootstrap.rsplit(":", 1)[1])
    topics = {k: await new_topic(bootstrap, k) for k in ("traffic", "review", "verdict", "dlq")}
    bank = QuestionBank(size=20, seed=3)
    model = SimulatedModel(quality=0.8, drift_after_s=None, bank=bank, seed=1)
    url = await model.start()
    cfg, metrics_port = tmp_path / "relmon.yaml", free_port()
    write_config(cfg, url, bootstrap, topics=topics, group=unique("g"), port=metrics_port)
    relmon = Replica("relmon", cfg, metrics_port, tmp_path / "log")
    replicas.append(relmon)
    events = [v for _, v in events_of(bank, "r")]
    relmon.start()
    second: subprocess.Popen[bytes] | None = None
    try:
        await wait_until(_is(relmon, 200), timeout_s=60, what="relmon ready (/readyz 200)")
        await produce(bootstrap, topics["traffic"], events[:5])
        await wait_until(_processed(relmon, 5), timeout_s=60, what="5 events processed")

        await asyncio.to_thread(stop_broker, broker)
        gone = time.monotonic()
        await wait_until(_is(relmon, 503), timeout_s=30, what="/readyz 503 with the broker gone")
        took = time.monotonic() - gone
        status, body = await relmon.get("/readyz")
        assert status == 503
        reasons = json.loads(body)["reasons"]
        assert any("Kafka broker not reachable" in r and topics["traffic"] in r for r in reasons)
        assert relmon.alive(), relmon.tail()
        assert await relmon.status("/healthz") == 200
        # Still up and still saying why, a while into the outage: relmon does nothing
        # observable meanwhile (no log line, no metric moves), so time itself is the test.
        await hold_still(3, why="an outage that lasts: relmon must neither exit nor recover")
        assert relmon.alive() and await relmon.status() == 503, relmon.tail()

        second = spawn_broker(port, tmp_path)
        await _wait_ready(bootstrap, second)
        await wait_until(_is(relmon, 200), timeout_s=90, what="/readyz 200 with the broker back")
        # The new broker is empty (Tansu keeps its log in memory): the topic comes back
        # with the first event, and relmon's old position may lie past its end for a
        # while, so events are produced until one comes through the whole path.
        before = await relmon.metrics()
        flowed = _processed(relmon, 1, since=before, decisions=("sampled",))
        sent = 0

        async def one_came_through() -> bool:
            """Did an event come through? If not, produce one more."""
            nonlocal sent
            if await flowed():
                return True
            more = events_of(QuestionBank(size=1, seed=100 + sent), f"again{sent}-")
            await produce(bootstrap, topics["traffic"], [more[0][1]])
            sent += 1
            return False

        await wait_until(
            one_came_through,
            timeout_s=120,
            what="an event through the whole path on the new broker",
            interval_s=0.5,
            alive=relmon.proc,
            detail=relmon.tail,
        )
        # ... scored, and its review item acknowledged by the new broker.
        scored = ("relmon_items_total", tuple(sorted((*LABELS, ("outcome", "scored")))))
        await wait_until(
            lambda: _gt(relmon, scored, before.get(scored, 0.0)),
            timeout_s=60,
            what="an item scored through the new broker",
        )
        assert relmon.alive()
        print(f"readiness went 503 {took:.2f} s after the broker stopped")
    finally:
        relmon.stop()
        if second is not None:
            await asyncio.to_thread(stop_broker, second)
        await model.stop()


async def _gt(replica: Replica, key: Any, floor: float) -> bool:
    return (await replica.metrics()).get(key, 0.0) > floor


def _is(replica: Replica, code: int) -> Any:
    async def check() -> bool:
        return await replica.status() == code

    return check


def _processed(
    replica: Replica,
    n: int,
    since: dict[Any, float] | None = None,
    decisions: tuple[str, ...] = ("sampled", "skipped"),
) -> Any:
    def total(m: dict[Any, float]) -> float:
        return sum(
            value(m, "relmon_traffic_events_total", source="kafka", decision=d) for d in decisions
        )

    async def check() -> bool:
        return total(await replica.metrics()) - total(since or {}) >= n

    return check


async def test_three_replicas_one_calibration_through_a_kill_9(
    kafka_bootstrap: str, tmp_path: Path, replicas: list[Replica]
) -> None:
    """Three replicas in one group split a 6-partition traffic topic; a reviewer answers
    on the verdict topic; replica b is killed with -9 mid-stream and restarted.

    Every event is processed at least once (the group's offsets reach the log end; every
    hash-sampled event has a review item, no other event has one) and scored at most
    once (one review item per item id); every verdict is applied exactly once on every
    replica; all replicas export the level and thresholds computed from the verdicts.
    """
    topics = {
        "traffic": await new_topic(kafka_bootstrap, "traffic", partitions=6),
        "review": await new_topic(kafka_bootstrap, "review", partitions=2),
        "verdict": await new_topic(kafka_bootstrap, "verdict", partitions=3),
        "dlq": await new_topic(kafka_bootstrap, "dlq"),
    }
    group = unique("relmon")
    bank = QuestionBank(size=120, seed=11)
    model = SimulatedModel(quality=0.75, drift_after_s=None, bank=bank, seed=5)
    url = await model.start()
    events = events_of(bank, "e")
    expected_sampled = {f"{TASK}:{eid}" for eid, _ in events if sampled(TASK, eid, SAMPLING)}
    assert 0 < len(expected_sampled) < len(events)
    for name in "abc":
        cfg = tmp_path / f"{name}.yaml"
        port = free_port()
        write_config(cfg, url, kafka_bootstrap, topics=topics, group=group, port=port)
        replicas.append(Replica(name, cfg, port, tmp_path / f"{name}.log"))
    a, b, c = replicas
    canon = get_canonicalizer("numeric")
    review_items: Counter[str] = Counter()
    scores: dict[str, float] = {}
    duplicates_sent: list[str] = []
    barriers_seen: set[int] = set()  # the review partitions whose barrier the reviewer read
    stop_reviewer = asyncio.Event()

    async def reviewer() -> None:
        """Reads review items as they come; one verdict per item (and, for every fifth
        item, the same verdict again: verdicts are idempotent by item id)."""
        consumer = AIOKafkaConsumer(
            topics["review"], bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
        )
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await consumer.start()
        await producer.start()
        try:
            while not stop_reviewer.is_set():
                batch = await consumer.getmany(timeout_ms=200)
                for record in (r for rs in batch.values() for r in rs):
                    if record.key == BARRIER:
                        barriers_seen.add(record.partition)
                        continue
                    item = json.loads(record.value)
                    item_id = item["item_id"]
                    review_items[item_id] += 1
                    if item_id in scores:
                        continue
                    truth = canon.canonicalize(str(truth_of(item["query"])))
                    ranks = [c["rank"] for c in item["candidates"] if c["answer"] == truth]
                    body: dict[str, Any] = {"item_id": item_id, "reviewer": "test"}
                    body |= {"accepted_ranks": ranks} if ranks else {"none_of_these": True}
                    scores[item_id] = float(min(ranks)) if ranks else math.inf
                    copies = 2 if len(scores) % 5 == 0 else 1
                    for _ in range(copies):
                        await producer.send_and_wait(
                            topics["verdict"], json.dumps(body).encode(), key=item_id.encode()
                        )
                    if copies == 2:
                        duplicates_sent.append(item_id)
        finally:
            await consumer.stop()
            await producer.stop()

    async def traffic(batch: list[tuple[str, bytes]], per_s: float) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for eid, payload in batch:
                await producer.send_and_wait(topics["traffic"], payload, key=eid.encode())
                await asyncio.sleep(1 / per_s)  # the traffic generator's pace
        finally:
            await producer.stop()

    reviewing = asyncio.create_task(reviewer())
    try:
        for r in replicas:
            r.start()
        for r in replicas:
            await wait_until(_is(r, 200), timeout_s=90, what=f"replica {r.name} ready")
        first_wave = asyncio.create_task(traffic(events[:60], per_s=30))
        # Mid-stream: b has processed traffic and verdicts are flowing; kill it.
        await wait_until(_processed(b, 3), timeout_s=90, what="replica b to process 3 events")
        await wait_until(lambda: len(scores) >= 10, timeout_s=90, what="10 verdicts given")
        b.kill9()  # returns once the process is gone (its port free)
        await first_wave
        b.start()  # joins while its old member's session has not expired yet
        await traffic(events[60:], per_s=30)
        await wait_until(
            _is(b, 200), timeout_s=90, what="replica b ready again", alive=b.proc, detail=b.tail
        )

        # Done when every partition's committed offset is at its log end and every
        # sampled event's verdict is in every replica's window.
        tps = [TopicPartition(topics["traffic"], p) for p in range(6)]
        end_offsets = await _end_offsets(kafka_bootstrap, tps)
        assert sum(end_offsets.values()) == len(events)

        async def all_committed() -> bool:
            return await committed(kafka_bootstrap, group, tps) == [end_offsets[tp] for tp in tps]

        await wait_until(
            all_committed,
            timeout_s=120,
            what="the group committed to the log end of every partition",
        )
        await wait_until(
            lambda: set(scores) >= expected_sampled,
            timeout_s=60,
            what="a verdict for every sampled event",
        )

        seen: dict[str, dict[str, float]] = {}

        async def windows_full() -> bool:
            for r in replicas:
                m = await r.metrics()
                seen[r.name] = {
                    "window": value(m, "relmon_calibration_items", model=MODEL, task=TASK),
                    "unknown": value(m, "relmon_verdicts_rejected_total", reason="unknown"),
                }
            return all(v["window"] >= len(scores) for v in seen.values())

        await wait_until(
            windows_full,
            timeout_s=60,
            what="every verdict in every replica's window",
            detail=lambda: f"verdicts {len(scores)}, replicas {seen}",
        )
        # Lag: every replica exports the review and verdict partitions it follows, each
        # traffic partition is exported by the replica that owns it (once the last
        # rebalance settled and the next measurement ran), and all are caught up.
        followed = {(topics["review"], str(p)) for p in range(2)}
        followed |= {(topics["verdict"], str(p)) for p in range(3)}
        traffic_tps = {(topics["traffic"], str(p)) for p in range(6)}
        lags: dict[str, dict[tuple[str, str], float]] = {}

        async def lags_settled() -> bool:
            for r in replicas:
                lags[r.name] = {
                    (dict(k[1])["topic"], dict(k[1])["partition"]): v
                    for k, v in (await r.metrics()).items()
                    if k[0] == "relmon_kafka_consumer_lag"
                }
            owned = [key for lag in lags.values() for key in lag if key[0] == topics["traffic"]]
            return (
                all(followed <= set(lag) for lag in lags.values())
                and sorted(owned) == sorted(traffic_tps)
                and all(v == 0 for lag in lags.values() for v in lag.values())
            )

        await wait_until(
            lags_settled,
            timeout_s=60,
            what="consumer lag 0 on every partition, each exported by its owner",
            detail=lambda: f"consumer lag series: {lags}",
        )
        # A barrier on each review partition: a late duplicate review item published
        # before it reaches the reviewer first. Then the reviewer stops, and every
        # verdict it sent (the duplicate copies last) is counted by the survivors.
        for p in range(2):
            await produce(
                kafka_bootstrap, topics["review"], [b"barrier"], partition=p, keys=[BARRIER]
            )
        await wait_until(
            lambda: barriers_seen == {0, 1}, timeout_s=60, what="the reviewer to read both barriers"
        )
        stop_reviewer.set()
        await reviewing

        async def duplicates_counted() -> bool:
            for r in (a, c):
                m = await r.metrics()
                got = value(m, "relmon_reviews_total", verdict="duplicate", **dict(LABELS))
                if got < len(duplicates_sent):
                    return False
            return True

        await wait_until(
            duplicates_counted, timeout_s=60, what="every duplicate verdict counted by a and c"
        )
        final = {r.name: await r.metrics() for r in replicas}
    except BaseException:
        for r in replicas:
            print(r.tail())
        raise
    finally:
        stop_reviewer.set()
        if not reviewing.done():
            reviewing.cancel()
        for r in replicas:
            r.stop()
        await model.stop()

    # At least once: every hash-sampled event has a review item, no skipped one has.
    assert set(review_items) == expected_sampled
    # At most once: no item was scored (re-asked and published) twice.
    twice = {i: n for i, n in review_items.items() if n > 1}
    assert not twice, f"{len(twice)} items published more than once: {sorted(twice)[:10]}"

    values = [scores[i] for i in sorted(scores)]
    n = len(values)
    level = sum(v <= 1 for v in values) / (n + 1)
    thresholds = {}
    for alpha in ALPHAS:
        k = math.ceil(round((n + 1) * (1 - alpha), 9))
        thresholds[alpha] = math.inf if k > n else sorted(values)[k - 1]
    report = {
        "events": len(events),
        "sampled": len(expected_sampled),
        "verdicts": n,
        "duplicate_verdicts": len(duplicates_sent),
        "independent": {"level": level, "thresholds": thresholds},
    }
    for name, m in final.items():
        report[name] = {
            "calibration_items": value(m, "relmon_calibration_items", model=MODEL, task=TASK),
            "level": value(m, "relmon_reliability_level", model=MODEL, task=TASK),
            "thresholds": {a: m[threshold_key(a)] for a in ALPHAS},
            "applied_live": value(m, "relmon_reviews_total", verdict="accepted", **dict(LABELS))
            + value(m, "relmon_reviews_total", verdict="none", **dict(LABELS)),
            "duplicate": value(m, "relmon_reviews_total", verdict="duplicate", **dict(LABELS)),
            "unknown": value(m, "relmon_verdicts_rejected_total", reason="unknown"),
            "queue_depth": value(m, "relmon_review_queue_depth", **dict(LABELS)),
            # This process's traffic decisions (b's count restarts with its process).
            "traffic": {
                dict(k[1])["decision"]: v
                for k, v in m.items()
                if k[0] == "relmon_traffic_events_total" and v
            },
        }
    print(json.dumps(report, indent=1, default=str))
    for name in final:
        got = report[name]
        assert got["calibration_items"] == n, name
        assert got["level"] == pytest.approx(level), name
        assert got["thresholds"] == thresholds, name
        assert got["unknown"] == 0, name
        # Every review item has its verdict: no replica counts one as waiting.
        assert got["queue_depth"] == 0, name
    # a and c lived through it all: each applied every verdict once, and saw each
    # duplicate as a duplicate (b's window was rebuilt by its replay instead).
    for r in (a, c):
        # Traffic was split: the survivors took partitions too (b's share before the
        # kill was checked above).
        assert sum(report[r.name]["traffic"].values()) > 0, r.name
        assert report[r.name]["applied_live"] == n, r.name
        assert report[r.name]["duplicate"] == len(duplicates_sent), r.name


async def _end_offsets(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(tps)
        ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        return ends
    finally:
        await consumer.stop()
