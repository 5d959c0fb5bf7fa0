"""Log records joined to spans by ids, within the bounds in time and count."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.core.errors import ConfigError
from monitor.core.traces.join import LogJoiner
from monitor.core.traces.spans import LogRecord, Span

TRACE = "0af7651916cd43dd8448eb211c80319c"


def _span(i: int) -> Span:
    return Span(TRACE, f"{i:016x}", "chat", 0)


def _record(i: int, name: str = "gen_ai.user.message") -> LogRecord:
    return LogRecord(TRACE, f"{i:016x}", 0, name, {"content": "x"})


def test_records_before_and_after_their_span_are_joined() -> None:
    joiner = LogJoiner(join_s=5.0, max_spans=10)
    assert joiner.add_record(_record(1), now=0.0) and joiner.held_records == 1
    joiner.add_span(_span(1), now=1.0)
    assert joiner.held_records == 0
    assert joiner.add_record(_record(1, "gen_ai.choice"), now=2.0)
    assert not joiner.add_record(LogRecord("", "", 0, "x", None), now=2.0)  # names no span
    assert joiner.release(now=5.9) == []
    [joined] = joiner.release(now=6.0)
    assert joined.span == _span(1)
    assert [r.event_name for r in joined.records] == ["gen_ai.user.message", "gen_ai.choice"]
    assert joiner.waiting == 0


def test_one_span_over_the_bound_releases_the_oldest_now() -> None:
    joiner = LogJoiner(join_s=5.0, max_spans=2)
    assert joiner.add_span(_span(1), now=0.0) == [] and joiner.add_span(_span(2), now=0.1) == []
    [pushed] = joiner.add_span(_span(3), now=0.2)
    assert pushed.span == _span(1) and joiner.waiting == 2
    assert joiner.add_span(_span(3), now=0.3) == [] and joiner.waiting == 2  # a duplicate
    assert [j.span.span_id for j in joiner.drain()] == [_span(2).span_id, _span(3).span_id]


def test_records_that_wait_in_vain_are_dropped_and_counted() -> None:
    joiner = LogJoiner(join_s=1.0, max_spans=2, max_records=3)
    for i in range(5):
        joiner.add_record(_record(i), now=0.0)
    assert joiner.held_records == 3 and joiner.dropped_records == 2
    joiner.release(now=1.0)
    assert joiner.held_records == 0 and joiner.dropped_records == 5
    joiner.add_span(_span(9), now=1.0)
    for _ in range(4):
        joiner.add_record(_record(9), now=1.0)
    [joined] = joiner.release(now=2.0)
    assert len(joined.records) == 3 and joiner.dropped_records == 6


def test_bounds_must_make_sense() -> None:
    with pytest.raises(ConfigError):
        LogJoiner(join_s=-1, max_spans=1)
    with pytest.raises(ConfigError):
        LogJoiner(join_s=1, max_spans=0)


_STEP = st.tuples(
    st.sampled_from(["span", "record", "release"]),
    st.integers(min_value=0, max_value=30),
    st.floats(min_value=0.0, max_value=3.0, allow_nan=False),
)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(_STEP, max_size=120),
    join_s=st.floats(min_value=0.0, max_value=5.0, allow_nan=False),
    max_spans=st.integers(min_value=1, max_value=8),
)
def test_nothing_waits_past_join_s_and_never_more_than_max_spans(
    steps: list[tuple[str, int, float]], join_s: float, max_spans: int
) -> None:
    joiner = LogJoiner(join_s=join_s, max_spans=max_spans, max_records=20)
    now = 0.0
    arrived: dict[str, float] = {}
    out: list[str] = []
    for kind, i, dt in steps:
        now += dt
        if kind == "span":
            key = _span(i).span_id
            pushed = joiner.add_span(_span(i), now)
            if key not in arrived:
                arrived[key] = now
            out += [j.span.span_id for j in pushed]
        elif kind == "record":
            joiner.add_record(_record(i), now)
        else:
            released = joiner.release(now)
            out += [j.span.span_id for j in released]
            for j in released:
                assert now - arrived[j.span.span_id] >= join_s  # never before its time
            for key, t in arrived.items():
                if key not in out:
                    assert now - t < join_s  # what still waits is within join_s
        assert joiner.waiting <= max_spans
        assert joiner.held_records <= 20
        for key in out:
            arrived.pop(key, None)
        out.clear()
    assert len(joiner.drain()) == len(arrived)  # every span comes out once
