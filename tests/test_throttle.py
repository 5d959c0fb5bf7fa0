"""The rate limit of log lines a client or an outage can trigger (monitor.core.throttle)."""

from __future__ import annotations

import itertools

import structlog
from hypothesis import given
from hypothesis import strategies as st

from monitor.core.throttle import LineThrottle
from monitor.engine.logs import ThrottledLog


def test_one_line_per_key_per_interval_and_the_count_held_back() -> None:
    t = LineThrottle(10.0)
    assert t.admit("a", 0.0) == 0
    assert [t.admit("a", s) for s in (1.0, 2.0, 9.9)] == [None, None, None]
    assert t.admit("b", 5.0) == 0  # another key is not held back by a
    assert t.admit("a", 10.0) == 3
    assert t.admit("a", 11.0) is None
    assert t.admit("a", 25.0) == 1
    assert t.suppressed_total == 4


@given(
    times=st.lists(st.floats(0, 1000, allow_nan=False), min_size=1, max_size=300),
    interval=st.floats(0.1, 50),
)
def test_lines_let_through_plus_held_back_equal_lines_offered(
    times: list[float], interval: float
) -> None:
    t = LineThrottle(interval)
    times.sort()
    admitted = [(s, t.admit("k", s)) for s in times]
    out = [(s, h) for s, h in admitted if h is not None]
    held_reported = sum(h for _, h in out)
    held_pending = len(times) - len(out) - held_reported
    assert held_reported + held_pending == t.suppressed_total
    assert held_pending >= 0
    # Lines let through are at least an interval apart: at most span/interval + 1 of them.
    assert len(out) <= (times[-1] - times[0]) / interval + 1
    assert all(b - a >= interval for (a, _), (b, _) in itertools.pairwise(out))


def test_a_flood_of_distinct_keys_keeps_bounded_memory() -> None:
    t = LineThrottle(10.0, max_keys=8)
    for i in range(10_000):
        t.admit(i, 0.0)
    assert len(t._keys) == 8


def test_the_logger_adds_the_count_held_back() -> None:
    now = [0.0]
    log = ThrottledLog(10.0, clock=lambda: now[0])
    with structlog.testing.capture_logs() as lines:
        for i in range(500):
            now[0] = i * 0.1  # 500 lines in 50 s
            log.warning("request_rejected", key="not_unicode", reason="not_unicode")
    assert len(lines) == 5
    assert "suppressed" not in lines[0]
    assert [line["suppressed"] for line in lines[1:]] == [99, 99, 99, 99]
    assert all(line["log_level"] == "warning" for line in lines)
