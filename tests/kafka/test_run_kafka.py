"""``relmon run --drain`` on Kafka: traffic topic in, review topic out, verdict topic in,
metrics out; then a restart that rebuilds the window by replaying the topics."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from monitor.app.demo.model import QuestionBank, SimulatedModel, truth_of
from monitor.core.canon import get_canonicalizer
from tests.kafka import (
    arith_events,
    free_port,
    produce,
    read_all,
    relmon_config,
    relmon_topics,
    unique,
)

pytestmark = pytest.mark.timeout(600)  # ~40 s unloaded: room for a machine 10x slower


def metrics_of(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def run_relmon(cfg: Path, out: Path, idle_s: float, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:
        return subprocess.Popen(  # noqa: ASYNC220 - waited for in a thread
            [
                sys.executable,
                "-m",
                "monitor",
                "run",
                "--config",
                str(cfg),
                "--drain",
                "--idle-s",
                str(idle_s),
                "--metrics-out",
                str(out),
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )


async def test_kafka_drain_end_to_end_and_replay_restart(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = await relmon_topics(kafka_bootstrap)
    group = unique("relmon")
    bank = QuestionBank(size=30, seed=9)
    model = SimulatedModel(quality=0.8, drift_after_s=None, bank=bank, seed=4)
    url = await model.start()
    events = arith_events([q for q, _ in bank.questions], "k")
    await produce(
        kafka_bootstrap, topics["traffic"], [*events[:10], b"{not json", *events[10:], b'{"id": 1}']
    )
    cfg, out, log = tmp_path / "relmon.yaml", tmp_path / "m1.prom", tmp_path / "relmon.log"
    relmon_config(cfg, url, kafka_bootstrap, topics=topics, group=group, port=free_port())
    canon = get_canonicalizer("numeric")
    scores: dict[str, float] = {}
    proc = await run_relmon(cfg, out, 8, log)
    try:
        # The reviewer: read the review items off the topic, answer on the verdict topic.
        items = await read_all(kafka_bootstrap, topics["review"], at_least=30, timeout_s=90)
        assert len(items) == 30, log.read_text()[-3000:]
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for record in items:
                item = json.loads(record.value)
                truth = canon.canonicalize(str(truth_of(item["query"])))
                ranks = [c["rank"] for c in item["candidates"] if c["answer"] == truth]
                verdict = {"item_id": item["item_id"], "reviewer": "test"}
                verdict |= {"accepted_ranks": ranks} if ranks else {"none_of_these": True}
                scores[item["item_id"]] = float(min(ranks)) if ranks else math.inf
                await producer.send_and_wait(
                    topics["verdict"], json.dumps(verdict).encode(), key=item["item_id"].encode()
                )
            await producer.send_and_wait(topics["verdict"], b"not a verdict")
        finally:
            await producer.stop()
        assert await asyncio.to_thread(proc.wait, 120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first = metrics_of(out.read_text())
    labels = (("model", "sim-arith-1"), ("task", "arithmetic"))
    values = list(scores.values())
    n = len(values)
    assert first[("relmon_calibration_items", labels)] == n == 30
    assert first[("relmon_reliability_level", labels)] == pytest.approx(
        sum(v <= 1 for v in values) / (n + 1)
    )
    for alpha in (0.1, 0.2, 0.3):
        k = math.ceil(round((n + 1) * (1 - alpha), 9))
        expected = math.inf if k > n else sorted(values)[k - 1]
        key = ("relmon_conformal_threshold", tuple(sorted((*labels, ("alpha", f"{alpha:g}")))))
        assert first[key] == expected
    assert (
        first[("relmon_traffic_events_total", (("decision", "sampled"), ("source", "kafka")))] == 30
    )
    assert (
        first[("relmon_traffic_events_total", (("decision", "rejected"), ("source", "kafka")))] == 2
    )
    dead = await read_all(kafka_bootstrap, topics["dlq"], at_least=2)
    assert len(dead) == 2  # two bad events, none lost
    assert {dict(r.headers)["relmon-stream"] for r in dead} == {b"traffic"}
    dead = await read_all(kafka_bootstrap, topics["verdict-dlq"], at_least=1)
    assert [r.value for r in dead] == [b"not a verdict"]
    assert dict(dead[0].headers)["relmon-stream"] == b"verdicts"
    # A refused verdict is counted as a verdict, not as traffic.
    # It names no item, so it has no model or task: relmon_verdicts_rejected_total.
    assert first[("relmon_verdicts_rejected_total", (("reason", "invalid"),))] == 1
    assert not any(k[0] == "relmon_reviews_total" and ("model", "") in k[1] for k in first)
    assert not any(
        k[0] == "relmon_traffic_events_total" and ("source", "verdicts") in k[1] for k in first
    )

    # Restart: the window is rebuilt by replaying the review and verdict topics.
    out2 = tmp_path / "m2.prom"
    proc = await run_relmon(cfg, out2, 2, log)
    try:
        assert await asyncio.to_thread(proc.wait, 120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await model.stop()
    second = metrics_of(out2.read_text())
    for name in (
        "relmon_calibration_items",
        "relmon_reliability_level",
        "relmon_reliability_lower_bound",
    ):
        assert second[(name, labels)] == first[(name, labels)], name
    for alpha in (0.1, 0.2, 0.3):
        key = ("relmon_conformal_threshold", tuple(sorted((*labels, ("alpha", f"{alpha:g}")))))
        assert second[key] == first[key]
    # Committed offsets: nothing re-processed on restart (the series exists from the
    # start at 0, so that alerts on it can fire).
    assert (
        second[("relmon_traffic_events_total", (("decision", "sampled"), ("source", "kafka")))] == 0
    )


async def test_kafka_backlog_over_budget_is_paced_to_the_end_in_drain_mode(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The operator's case: a backlog larger than the budget. relmon run --drain takes
    all of it at the budget's pace (nothing dropped) and stops only when it is done."""
    topics = await relmon_topics(kafka_bootstrap, traffic_partitions=2)
    bank = QuestionBank(size=480, seed=2)
    model = SimulatedModel(quality=0.9, drift_after_s=None, bank=bank, seed=8)
    url = await model.start()
    events = arith_events([q for q, _ in bank.questions], "b", task=False)
    await produce(kafka_bootstrap, topics["traffic"], events)
    cfg, out, log = tmp_path / "relmon.yaml", tmp_path / "m.prom", tmp_path / "relmon.log"
    relmon_config(
        cfg,
        url,
        kafka_bootstrap,
        topics=topics,
        group=unique("paced"),
        port=free_port(),
        task={"k_max": 3, "k0": 3, "review_rate": 0.05},
        # Unpaced: the bucket's 1,200 calls at once (paced, 3 calls every 0.15 s, the
        # backlog would take 72 s; tests/test_budget.py tests the pace).
        budget={"calls_per_minute": 1200, "queue_size": 16, "pace": False},
    )
    started = time.monotonic()
    proc = await run_relmon(cfg, out, 3, log)
    try:
        assert await asyncio.to_thread(proc.wait, 200) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await model.stop()
    elapsed = time.monotonic() - started
    m = metrics_of(out.read_text())

    def decision(d: str) -> float:
        return m[("relmon_traffic_events_total", (("decision", d), ("source", "kafka")))]

    assert decision("sampled") == 480
    assert decision("dropped") == decision("skipped") == decision("rejected") == 0
    labels = (("model", "sim-arith-1"), ("outcome", "scored"), ("task", "arithmetic"))
    assert m[("relmon_items_total", labels)] == 480
    # The budget (20 calls a second after a bucket of 1,200) was kept: 1,440 calls
    # cannot have been made in less than 12 s.
    assert model.calls == 480 * 3
    assert elapsed >= (model.calls - 1200) / 20
    assert '"kafka.paused"' in log.read_text()
