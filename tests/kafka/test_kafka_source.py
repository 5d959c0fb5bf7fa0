"""KafkaEventSource against a real broker: delivery, dead letters, commits, restarts."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.kafka.source import KafkaEventSource, KafkaUnavailableError, parse_event_bytes
from monitor.core.errors import InputError
from monitor.core.events import TrafficEvent, parse_event
from monitor.engine.ports import Admission
from tests.kafka import (
    FAST_GROUP,
    committed,
    event_bytes,
    free_port,
    new_topic,
    produce,
    read_all,
    unique,
)
from tests.waiting import wait_until


class Recorder:
    """A sink: records events, samples the ids in ``sample`` with futures kept by id."""

    def __init__(self, sample: Collection[str] = ()) -> None:
        self.events: list[TrafficEvent] = []
        self.sample = sample
        self.futures: dict[str, asyncio.Future[None]] = {}
        self.rejects: list[tuple[str, str]] = []

    def __call__(self, event: TrafficEvent, source: str) -> Admission:
        assert source == "kafka"
        self.events.append(event)
        if event.id in self.sample:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.futures[event.id] = fut
            return Admission("sampled", fut)
        return Admission("skipped")

    def reject(self, source: str, reason: str) -> None:
        self.rejects.append((source, reason))

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.events]


@asynccontextmanager
async def running(
    source: KafkaEventSource, stop_timeout_s: float = 5.0
) -> AsyncIterator[asyncio.Task[None]]:
    await source.start()
    task = asyncio.create_task(source.run())
    try:
        yield task
    finally:
        await source.stop(stop_timeout_s)
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _committed_is(
    bootstrap: str, group: str, tps: list[TopicPartition], expected: list[int]
) -> bool:
    return await committed(bootstrap, group, tps) == expected


class CommitRounds:
    """Counts the commit rounds of a source's run loop: each one works out the commit
    point from what is finished. "Still not committed past X" is checked after a few
    more rounds, not after a guessed while."""

    def __init__(self, source: KafkaEventSource, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        commit = source._commit

        async def counted(only: Collection[Any] | None = None) -> None:
            await commit(only)
            self.count += 1

        monkeypatch.setattr(source, "_commit", counted)

    async def several_more(self, rounds: int = 5) -> None:
        target = self.count + rounds
        await wait_until(lambda: self.count >= target, what=f"{rounds} more commit rounds")


MARKERS = ("p0-end", "p1-end")
"""One last event per partition (0, 1): a barrier for "nothing more arrives"."""


async def end_markers(bootstrap: str, topic: str, *recorders: Recorder) -> None:
    """Produce :data:`MARKERS` and wait until ``recorders`` got both: a partition's
    events arrive in order, so whatever was still to come of it came before its marker."""
    for p, marker in enumerate(MARKERS):
        await produce(bootstrap, topic, [event_bytes(marker)], partition=p)

    def both() -> bool:
        return set(MARKERS) <= {i for r in recorders for i in r.ids}

    await wait_until(both, what="the end marker of each partition")


def make_source(
    bootstrap: str, topic: str, group: str, rec: Recorder, **kw: Any
) -> KafkaEventSource:
    dlq = kw.pop("dlq", topic + "-dlq")
    return KafkaEventSource(bootstrap, topic, group, dlq, rec, rec.reject, **{**FAST_GROUP, **kw})


async def test_events_reach_the_sink_in_order_per_partition(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap, "events", partitions=3)
    ids = [f"req-{i}" for i in range(60)]
    metas = await produce(
        kafka_bootstrap,
        topic,
        [event_bytes(i, task="triage" if n % 2 else "code") for n, i in enumerate(ids)],
        keys=[i.encode() for i in ids],
    )
    by_partition: dict[int, list[str]] = {}
    for item_id, md in zip(ids, metas, strict=True):
        by_partition.setdefault(md.partition, []).append(item_id)
    assert len(by_partition) > 1

    rec = Recorder()
    group = unique("g")
    source = make_source(kafka_bootstrap, topic, group, rec, commit_interval_s=0.05)
    async with running(source):
        await wait_until(lambda: len(rec.events) == 60, timeout_s=60, what="60 events at the sink")
        assert source.connected
        tps = [TopicPartition(topic, p) for p in sorted(by_partition)]

        async def all_committed() -> bool:
            got = await committed(kafka_bootstrap, group, tps)
            return got == [len(by_partition[tp.partition]) for tp in tps]

        await wait_until(all_committed, timeout_s=60, what="every partition committed to its end")
    assert not source.connected

    for part_ids in by_partition.values():
        assert [i for i in rec.ids if i in set(part_ids)] == part_ids
    first = next(e for e in rec.events if e.id == "req-1")
    assert first.model == "gpt-4.1"
    assert first.task == "triage"
    assert first.ts == datetime(2026, 11, 22, 7, tzinfo=UTC)
    assert first.response_text == "4"
    assert first.request["messages"][0]["content"] == "What is 2+2?"
    assert rec.rejects == []


async def test_malformed_events_go_to_the_dead_letter_topic(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap, "events")
    dlq = await new_topic(kafka_bootstrap, "events-dlq")
    secret = "SECRET-PROMPT-TEXT"
    oversize = event_bytes("big", content=secret * 400)
    assert len(oversize) > 4096
    bad: list[bytes | None] = [
        b'{"id": "x1", "model": "m", "request": {"messages": [' + secret.encode(),
        json.dumps({"id": "x2", "model": "gpt-4.1", "prompt": secret}).encode(),
        json.dumps({"id": ["x3"], "model": 7, "request": {"messages": "hi"}}).encode(),
        oversize,
        b"\xff\xfe\x00\x81garbage\x00\xc3",
        None,
    ]
    values = [event_bytes("ok-1"), *bad, event_bytes("ok-2")]
    keys = [b"tombstone" if v is None else None for v in values]
    await produce(kafka_bootstrap, topic, values, keys=keys)

    rec = Recorder()
    group = unique("g")
    source = make_source(
        kafka_bootstrap, topic, group, rec, dlq=dlq, max_event_bytes=4096, commit_interval_s=0.05
    )
    async with running(source) as task:
        await wait_until(
            lambda: len(rec.events) == 2 and len(rec.rejects) == len(bad),
            timeout_s=60,
            what="2 events at the sink and every bad record rejected",
        )
        tp = TopicPartition(topic, 0)

        async def done() -> bool:
            return await committed(kafka_bootstrap, group, [tp]) == [len(values)]

        await wait_until(done, timeout_s=60, what="the commit past the dead letters")
        assert not task.done()  # the consumer keeps going
        await produce(kafka_bootstrap, topic, [event_bytes("ok-3")])
        await wait_until(
            lambda: rec.ids == ["ok-1", "ok-2", "ok-3"],
            timeout_s=60,
            what="ok-1, ok-2 and ok-3 at the sink",
        )

    assert [s for s, _ in rec.rejects] == ["kafka"] * len(bad)
    dead = await read_all(kafka_bootstrap, dlq, at_least=len(bad))
    assert [r.value for r in dead] == bad
    assert dead[-1].key == b"tombstone"
    for offset, r in enumerate(dead, start=1):
        headers = dict(r.headers)
        assert headers["relmon-error"]
        assert secret.encode() not in headers["relmon-error"]
        assert headers["relmon-source-topic"] == topic.encode()
        assert headers["relmon-source-partition"] == b"0"
        assert headers["relmon-source-offset"] == str(offset).encode()
    reasons = [dict(r.headers)["relmon-error"].decode() for r in dead]
    assert "invalid JSON" in reasons[0]
    assert "'request'" in reasons[1]
    assert "over the 4096-byte limit" in reasons[3]
    assert "invalid JSON" in reasons[4]
    assert "not a JSON object" in reasons[5]
    assert [reason for _, reason in rec.rejects] == reasons


async def test_commit_never_passes_an_unfinished_event(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = await new_topic(kafka_bootstrap, "events")
    await produce(kafka_bootstrap, topic, [event_bytes(f"e{i}") for i in range(10)])
    rec = Recorder(sample={"e3", "e6", "e8"})
    group = unique("g")
    tp = TopicPartition(topic, 0)
    source = make_source(kafka_bootstrap, topic, group, rec, commit_interval_s=0.05)

    async def position() -> int | None:
        return (await committed(kafka_bootstrap, group, [tp]))[0]

    async def position_is(expected: int) -> bool:
        return await position() == expected

    rounds = CommitRounds(source, monkeypatch)
    async with running(source):
        await wait_until(lambda: len(rec.events) == 10, timeout_s=60, what="10 events at the sink")
        await wait_until(
            lambda: position_is(3), timeout_s=60, what="the commit at offset 3 (e3 unfinished)"
        )
        await rounds.several_more()
        assert await position() == 3  # still held at e3

        rec.futures["e3"].set_result(None)
        await wait_until(
            lambda: position_is(6), timeout_s=60, what="the commit at offset 6 (e6 unfinished)"
        )
        rec.futures["e8"].set_result(None)  # finished out of order: e6 still holds
        await rounds.several_more()
        assert await position() == 6

        rec.futures["e6"].set_exception(RuntimeError("abandoned"))  # abandoned is done too
        await wait_until(lambda: position_is(10), timeout_s=60, what="the commit at offset 10")


async def test_stop_drains_in_flight_items_before_the_last_commit(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap, "events")
    await produce(kafka_bootstrap, topic, [event_bytes(f"e{i}") for i in range(5)])
    rec = Recorder(sample={"e1"})
    group = unique("g")
    source = make_source(kafka_bootstrap, topic, group, rec, commit_interval_s=600)
    async with running(source, stop_timeout_s=5.0):
        await wait_until(lambda: len(rec.events) == 5, timeout_s=60, what="5 events at the sink")
        asyncio.get_running_loop().call_later(0.2, rec.futures["e1"].set_result, None)
    assert await committed(kafka_bootstrap, group, [TopicPartition(topic, 0)]) == [5]


async def test_restart_redelivers_exactly_the_unfinished_tail(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap, "events", partitions=2)
    await produce(kafka_bootstrap, topic, [event_bytes(f"p0-{i}") for i in range(10)], partition=0)
    await produce(kafka_bootstrap, topic, [event_bytes(f"p1-{i}") for i in range(10)], partition=1)
    group = unique("g")

    first = Recorder(sample={"p0-2", "p0-6", "p1-8", "p1-9"})
    source = make_source(kafka_bootstrap, topic, group, first, commit_interval_s=0.05)
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    async with running(source, stop_timeout_s=0.2):
        await wait_until(
            lambda: len(first.events) == 20, timeout_s=60, what="20 events at the first member"
        )
        first.futures["p0-2"].set_result(None)
        # The periodic commit gets there first: stop's own last commit has only 0.1 s
        # left after waiting out its 0.2 s, which a loaded broker may need more than.
        await wait_until(
            lambda: _committed_is(kafka_bootstrap, group, tps, [6, 8]),
            timeout_s=60,
            what="the commits at 6 and 8",
        )
    # p0-6, p1-8 and p1-9 never finished: the commit stays at p0 -> 6 and p1 -> 8.
    assert await committed(kafka_bootstrap, group, tps) == [6, 8]

    second = Recorder()
    source = make_source(kafka_bootstrap, topic, group, second, commit_interval_s=0.05)
    async with running(source):
        await wait_until(lambda: len(second.events) == 6, timeout_s=60, what="6 events redelivered")
        await end_markers(kafka_bootstrap, topic, second)  # nothing more arrives before them
    tail = ["p0-6", "p0-7", "p0-8", "p0-9", "p1-8", "p1-9"]
    assert sorted(second.ids) == sorted([*tail, *MARKERS])
    every = {f"p{p}-{i}" for p in (0, 1) for i in range(10)}
    assert set(first.ids) | set(second.ids) == every | set(MARKERS)
    assert await committed(kafka_bootstrap, group, tps) == [11, 11]  # the markers too


async def test_a_failed_dead_letter_stops_the_source_without_committing_past_it(
    kafka_bootstrap: str,
) -> None:
    topic = await new_topic(kafka_bootstrap, "events")
    await produce(kafka_bootstrap, topic, [event_bytes("ok-1"), b"[" * 2000, event_bytes("ok-2")])
    rec = Recorder()
    group = unique("g")
    source = make_source(
        kafka_bootstrap,
        topic,
        group,
        rec,
        commit_interval_s=0.05,
        producer_options={"max_request_size": 512},  # the dead letter cannot be sent
    )
    async with running(source) as task:
        with pytest.raises(KafkaUnavailableError, match="dead-letter"):
            await asyncio.wait_for(task, 60)
        assert not source.connected
    assert await committed(kafka_bootstrap, group, [TopicPartition(topic, 0)]) == [1]


async def test_start_fails_clearly_when_kafka_is_unreachable() -> None:
    rec = Recorder()
    source = make_source(f"127.0.0.1:{free_port()}", "t", unique("g"), rec)
    for _ in range(2):  # a failed start can be tried again
        with pytest.raises(KafkaUnavailableError, match="cannot reach Kafka"):
            await source.start()
    assert not source.connected
    await source.stop(1.0)


async def test_connected_turns_false_when_the_broker_goes_away(
    private_kafka: tuple[str, subprocess.Popen[bytes]],
) -> None:
    bootstrap, proc = private_kafka
    topic = await new_topic(bootstrap, "events")
    await produce(bootstrap, topic, [event_bytes("e0")])
    rec = Recorder()
    source = make_source(bootstrap, topic, unique("g"), rec, request_timeout_ms=2000)
    async with running(source, stop_timeout_s=2.0):
        await wait_until(lambda: len(rec.events) == 1, timeout_s=60, what="the event at the sink")
        assert source.connected
        proc.kill()  # a crash (SIGTERM makes Tansu drain for seconds)
        await asyncio.to_thread(proc.wait, 10)
        await wait_until(
            lambda: not source.connected, timeout_s=60, what="the source to see the broker gone"
        )


async def test_a_rebalance_commits_finished_work_of_revoked_partitions(
    kafka_bootstrap: str,
) -> None:
    topic = await new_topic(kafka_bootstrap, "events", partitions=2)
    await produce(kafka_bootstrap, topic, [event_bytes(f"p0-{i}") for i in range(10)], partition=0)
    await produce(kafka_bootstrap, topic, [event_bytes(f"p1-{i}") for i in range(10)], partition=1)
    group = unique("g")
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    first = Recorder(sample={"p0-5"})  # never finishes
    # No periodic commit within the test: only the revoke hook can commit.
    one = make_source(kafka_bootstrap, topic, group, first, commit_interval_s=600)
    async with running(one):
        await wait_until(
            lambda: len(first.events) == 20, timeout_s=60, what="20 events at the first member"
        )
        assert await committed(kafka_bootstrap, group, tps) == [None, None]
        second = Recorder()
        two = make_source(kafka_bootstrap, topic, group, second, commit_interval_s=0.05)
        async with running(two):
            await wait_until(
                lambda: len(first.events) + len(second.events) == 25,
                timeout_s=60,
                what="25 events over both members",
            )
            await end_markers(kafka_bootstrap, topic, first, second)
            assert len(first.events) + len(second.events) == 25 + len(MARKERS)
            assert one.connected
            assert two.connected
            redelivered = [i for i in first.ids[20:] + second.ids if i not in MARKERS]
            assert sorted(redelivered) == [f"p0-{i}" for i in range(5, 10)]


class Busy(Recorder):
    """A sink with room for ``room`` events, then ``busy`` (records every offer)."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room
        self.taken: list[str] = []

    def __call__(self, event: TrafficEvent, source: str) -> Admission:
        self.events.append(event)
        if len(self.taken) >= self.room:
            return Admission("busy")
        self.taken.append(event.id)
        return Admission("skipped")


async def test_a_paused_partition_revoked_goes_on_where_the_held_events_start(
    kafka_bootstrap: str,
) -> None:
    """Events held for budget are not committed: a rebalance that takes their partition
    away hands them, and only them, to the new owner; nothing is lost or taken twice."""
    topic = await new_topic(kafka_bootstrap, "events", partitions=2)
    await produce(kafka_bootstrap, topic, [event_bytes(f"p0-{i}") for i in range(10)], partition=0)
    await produce(kafka_bootstrap, topic, [event_bytes(f"p1-{i}") for i in range(10)], partition=1)
    group = unique("g")
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    first = Busy(room=6)
    one = make_source(kafka_bootstrap, topic, group, first, commit_interval_s=0.05)
    async with running(one):
        await wait_until(
            lambda: one.paused and len(first.taken) == 6,
            timeout_s=30,
            what="the first member paused with 6 events taken",
        )
        offered = len(first.events)
        # Paused: the held events are offered again (each poll), none fetched.
        await wait_until(
            lambda: len(first.events) >= offered + 5,
            timeout_s=30,
            what="the held events offered 5 more times",
        )
        assert one.paused and set(first.ids[offered:]) <= set(first.ids[:offered])

        async def committed_taken() -> bool:
            offsets = await committed(kafka_bootstrap, group, tps)
            return sum(o or 0 for o in offsets) == 6

        await wait_until(committed_taken, timeout_s=30, what="the 6 taken events committed")
        second = Recorder()
        two = make_source(kafka_bootstrap, topic, group, second, commit_interval_s=0.05)
        async with running(two):
            await wait_until(
                lambda: len(second.events) >= 1, timeout_s=60, what="an event at the second member"
            )
        # The second member owned one partition, then left: the first member is busy
        # for ever, so whatever it still holds stays uncommitted.
    assert not set(first.taken) & set(second.ids)  # nothing taken twice
    offsets = await committed(kafka_bootstrap, group, tps)
    done = set(first.taken) | set(second.ids)
    for p, offset in enumerate(offsets):
        # Each partition's commit is at its first event not taken, and every event
        # before it was taken by one member: the held ones went to the new owner.
        taken = [i for i in range(10) if f"p{p}-{i}" in done]
        assert taken == list(range(len(taken))), (p, taken)
        assert offset == len(taken), (p, offsets)
    assert 10 in offsets  # the second member took its partition to the end


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = ["id", "model", "task", "ts", "request", "response"]
valid_events = st.fixed_dictionaries(
    {
        "id": st.text(min_size=1, max_size=6) | st.integers(),
        "model": st.sampled_from(["gpt-4.1", "m"]),
        "request": st.fixed_dictionaries(
            {
                "messages": st.lists(
                    st.fixed_dictionaries(
                        {"role": st.sampled_from(["user", "system"]), "content": json_values}
                    ),
                    min_size=1,
                    max_size=3,
                )
            },
            optional={"seed": st.integers(), "temperature": st.floats(0, 2)},
        ),
    },
    optional={
        "task": st.text(min_size=1, max_size=6),
        "ts": st.sampled_from(["2026-11-22T07:00:00Z", "2026-11-22T07:00:00.5+02:00", "2026"]),
        "response": st.fixed_dictionaries({"choices": st.just([{"message": {"content": "4"}}])}),
    },
)
events = st.builds(
    lambda base, overrides, drops: {
        **{k: v for k, v in base.items() if k not in drops},
        **overrides,
    },
    valid_events,
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=2),
    st.sets(st.sampled_from(FIELDS), max_size=1),
)


def encoded(obj: object, ascii_only: bool) -> bytes:
    return json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


raw_values = (
    st.builds(encoded, events | json_values, st.booleans())
    | st.binary(max_size=64)
    | st.builds(
        lambda b, cut: b[:cut], st.builds(encoded, events, st.booleans()), st.integers(0, 80)
    )
    | st.just(b"[" * 5000)
    | st.just(b'\xef\xbb\xbf{"id": "x"}')
    | st.none()
)


def outcome(parse: Callable[[bytes | None], object], value: bytes | None) -> tuple[str, object]:
    try:
        return "ok", parse(value)
    except InputError as exc:
        return "rejected", str(exc)
    except RecursionError:
        return "rejected", "invalid JSON: nested too deeply"


@settings(max_examples=400, deadline=None)
@given(value=raw_values, max_bytes=st.sampled_from([40, 1_048_576]))
def test_parse_event_bytes_agrees_with_parse_event(value: bytes | None, max_bytes: int) -> None:
    fast = outcome(lambda v: parse_event_bytes(v, max_bytes), value)
    reference = outcome(lambda v: parse_event(v, max_bytes=max_bytes), value)  # type: ignore[arg-type]
    assert fast == reference


def test_parse_event_bytes_keeps_big_integers_exact() -> None:
    body = event_bytes("e1").replace(
        b'"model": "gpt-4.1", "messages"', b'"seed": 123456789012345678901234567890, "messages"'
    )
    parsed = parse_event_bytes(body)
    assert parsed.request["seed"] == 123456789012345678901234567890
    assert parsed == parse_event(body)
