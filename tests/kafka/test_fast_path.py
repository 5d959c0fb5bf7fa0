"""The Kafka source's fast path: unsampled events skipped before they are parsed, and
every malformed event still rejected and dead-lettered, sampled or not."""

from __future__ import annotations

import json
import zlib
from typing import Any

from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.kafka.fastpath import event_head
from adapters.kafka.source import KafkaEventSource
from monitor.core.errors import InputError
from monitor.core.events import parse_event
from tests.kafka import FAST_GROUP, committed, event_bytes, new_topic, produce, read_all, unique
from tests.kafka.test_kafka_source import Recorder, running
from tests.waiting import wait_until


def event(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "req-1",
        "ts": "2026-11-22T07:00:00Z",
        "model": "gpt-4.1",
        "task": "triage",
        "request": {"model": "gpt-4.1", "messages": [{"role": "user", "content": "2+2?"}]},
        "response": {"choices": [{"message": {"content": "4"}}]},
    }
    return {k: v for k, v in {**base, **fields}.items() if v is not ...}


def head_of(obj: Any) -> Any:
    return event_head(json.dumps(obj).encode())


def test_a_valid_event_gives_its_id_task_and_model() -> None:
    assert head_of(event()) == ("req-1", "triage", "gpt-4.1")
    assert head_of(event(id=42, task=..., ts=None)) == ("42", None, "gpt-4.1")
    # No top-level model: the request's, as parse_event takes it.
    assert head_of(event(model=...)) == ("req-1", "triage", "gpt-4.1")
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}
    assert head_of(event(request={"model": "m", "messages": [parts]}))[0] == "req-1"


def test_what_the_fast_path_cannot_vouch_for_goes_the_full_way() -> None:
    bad = [
        event(id=True),
        event(id=""),
        event(id="x" * 513),
        event(id=1.5),
        event(model=None),
        event(model=..., request={"messages": [{"role": "user", "content": "q"}]}),
        event(task=""),
        event(task=3),
        event(ts="yesterday"),
        event(request={"messages": []}),
        event(request={"messages": [{"role": "user"}]}),
        event(request={"messages": [{"role": "user", "content": [{"text": None}]}]}),
        event(response={"choices": []}),
        event(response={"choices": [{"message": {}}]}),
        event(response="4"),
        [event()],
    ]
    for obj in bad:
        assert head_of(obj) is None, obj
        try:
            parse_event(json.dumps(obj).encode())
        except InputError:
            continue
        raise AssertionError(f"parse_event accepted {obj}")
    good = json.dumps(event()).encode()
    for raw in (
        good.replace(b'"4"', b'"\xff"'),  # not UTF-8 in a field relmon reads
        good[:-1] + b', "extra": "\xff"}',  # ... and in one it skips (msgspec would not check)
        good[:-1] + b', "seed": ' + b"9" * 5000 + b"}",  # json.loads refuses 4,301+ digits
        good[:-1] + b', "temperature": NaN}',
        good.replace(b'"2+2?"', b'"\\ud800"'),  # a lone surrogate
        b"\xef\xbb\xbf" + good,
        good[:-1],
        None,
    ):
        assert event_head(raw) is None, raw
    assert event_head(good, max_bytes=len(good) - 1) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
FIELDS = ["id", "model", "task", "ts", "request", "response"]
near_valid = st.builds(
    lambda overrides, drops: event(**{**overrides, **dict.fromkeys(drops, ...)}),
    st.dictionaries(
        st.sampled_from(FIELDS),
        json_values
        | st.sampled_from(["", "x", "2026-11-22T07:00:00+02:00", {"messages": []}])
        | st.builds(lambda c: {"messages": [{"role": "u", "content": c}]}, json_values)
        | st.builds(lambda c: {"choices": [{"message": {"content": c}}]}, json_values),
        max_size=2,
    ),
    st.sets(st.sampled_from(FIELDS), max_size=1),
)


def agrees(raw: bytes) -> bool:
    """Whenever the fast path gives (id, task, model), ``parse_event`` accepts the value
    and gives the same three. True if the fast path answered."""
    head = event_head(raw)
    if head is None:
        return False
    parsed = parse_event(raw)
    assert head == (parsed.id, parsed.task, parsed.model)
    return True


@settings(max_examples=500, deadline=None)
@given(obj=near_valid, ascii_only=st.booleans(), cut=st.none() | st.integers(0, 200))
def test_the_fast_path_answers_only_for_events_parse_event_accepts(
    obj: dict[str, Any], ascii_only: bool, cut: int | None
) -> None:
    """Soundness: a skip never hides a rejection, nor reads other fields."""
    raw = json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    agrees(raw if cut is None else raw[:cut])


@settings(max_examples=500, deadline=None)
@given(at=st.integers(0, 400), junk=st.binary(min_size=1, max_size=3), replace=st.booleans())
def test_the_fast_path_agrees_on_spliced_bytes(at: int, junk: bytes, replace: bool) -> None:
    """Bytes put into (or over) a valid event: invalid UTF-8, control characters, stray
    quotes or brackets, anywhere, also in fields the fast path does not read."""
    raw = json.dumps(event(extra={"seed": 7, "note": "ünïcode"}), ensure_ascii=False).encode()
    at = at % len(raw)
    agrees(raw[:at] + junk + raw[at + (len(junk) if replace else 0) :])


def test_the_soundness_checks_are_not_vacuous() -> None:
    """The property tests above see the fast path answer for most valid events."""
    raw = json.dumps(event(extra={"seed": 7, "note": "ünïcode"}), ensure_ascii=False).encode()
    assert agrees(raw)
    answered = sum(
        agrees(json.dumps(event(id=f"r{i}", task=t)).encode())
        for i, t in enumerate(["a", None, "b"] * 10)
    )
    assert answered == 30


# -- against the broker ----------------------------------------------------------------


def unsampled(item_id: str) -> bool:
    return zlib.crc32(item_id.encode()) % 4 != 0


class Skipper:
    """``skip_unsampled``: samples one id in four by hash, records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str | None, str, str]] = []

    def __call__(self, source: str, task: str | None, model: str, event_id: str) -> bool:
        self.asked.append((source, task, model, event_id))
        return unsampled(event_id)


async def test_unsampled_events_are_skipped_unparsed_and_malformed_ones_still_rejected(
    kafka_bootstrap: str,
) -> None:
    """Valid events: the unsampled ones are skipped by the fast path (never reach the
    sink), the sampled ones are parsed and offered. A malformed event whose id is not
    sampled (an empty messages list) and a value that is not JSON are both rejected and
    dead-lettered with their reason, as without the fast path; every offset is
    committed."""
    ids = [f"req-{i}" for i in range(40)]
    sampled_ids = [i for i in ids if not unsampled(i)]
    assert 3 < len(sampled_ids) < 20
    bad_id = next(f"bad-{n}" for n in range(100) if unsampled(f"bad-{n}"))
    malformed = json.dumps(event(id=bad_id, request={"messages": []})).encode()
    not_json = b'{"id": "' + bad_id.encode() + b'", "model": '
    values = [event_bytes(i) for i in ids[:20]] + [malformed, not_json]
    values += [event_bytes(i) for i in ids[20:]]
    topic = await new_topic(kafka_bootstrap, "fast")
    group = unique("g")
    rec, skip = Recorder(), Skipper()
    source = KafkaEventSource(
        kafka_bootstrap,
        topic,
        group,
        topic + "-dlq",
        rec,
        rec.reject,
        commit_interval_s=0.05,
        skip=skip,
        **FAST_GROUP,
    )
    await produce(kafka_bootstrap, topic, values)
    async with running(source) as task:
        await wait_until(
            lambda: (rec.ids == sampled_ids and len(rec.rejects) == 2) or task.done(),
            what="the sampled events at the sink and 2 rejects",
        )
        assert not task.done(), task.exception() if task.done() else None
        tp = TopicPartition(topic, 0)

        async def past_the_end() -> bool:
            return await committed(kafka_bootstrap, group, [tp]) == [len(values)]

        await wait_until(past_the_end, what="the commit past every record")
    assert [a[3] for a in skip.asked] == ids  # asked once per valid event, in order
    assert {(a[0], a[1], a[2]) for a in skip.asked} == {("kafka", "triage", "gpt-4.1")}
    assert rec.rejects == [
        ("kafka", "'request' must be a chat request with a non-empty 'messages' list"),
        ("kafka", rec.rejects[1][1]),
    ]
    assert rec.rejects[1][1].startswith("invalid JSON")
    dead = await read_all(kafka_bootstrap, topic + "-dlq", at_least=2)
    # Keyless dead letters may land in any partition of the dead-letter topic.
    assert {r.value: dict(r.headers)["relmon-error"].decode() for r in dead} == {
        malformed: rec.rejects[0][1],
        not_json: rec.rejects[1][1],
    }


async def test_a_failing_skip_check_leaves_the_decision_to_the_full_way(
    kafka_bootstrap: str,
) -> None:
    """A bug in the fast path's check loses no event: the record is parsed and offered."""

    def broken(source: str, task: str | None, model: str, event_id: str) -> bool:
        raise RuntimeError("a bug")

    topic = await new_topic(kafka_bootstrap, "fast-bug")
    rec = Recorder()
    source = KafkaEventSource(
        kafka_bootstrap,
        topic,
        unique("g"),
        topic + "-dlq",
        rec,
        rec.reject,
        skip=broken,
        **FAST_GROUP,
    )
    await produce(kafka_bootstrap, topic, [event_bytes("a"), event_bytes("b")])
    async with running(source) as task:
        await wait_until(lambda: rec.ids == ["a", "b"] or task.done(), what="both events")
        assert not task.done()
    assert rec.rejects == []
