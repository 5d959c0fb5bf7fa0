"""The trace-id draw: deterministic, uniform, one per trace."""

from __future__ import annotations

import numpy as np
from scipy import stats

from monitor.core.sampler import hash_fraction, sampled
from monitor.core.traces.sampling import TRACE_NAMESPACE, trace_draw


def test_the_draw_depends_on_the_trace_id_only() -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_draw(trace) == trace_draw(trace.upper()) == hash_fraction(TRACE_NAMESPACE, trace)
    assert 0.0 <= trace_draw(trace) < 1.0
    assert trace_draw(trace) != trace_draw("4bf92f3577b34da6a3ce929d0e0e4737")
    draw = trace_draw(trace)  # every span of the trace: the same decision at any rate
    assert all(sampled("any", draw, rate) == (draw < rate) for rate in (0.01, 0.5, 0.99))


def test_random_ids_draw_uniformly() -> None:
    rng = np.random.default_rng(20260101)
    draws = np.array([trace_draw(rng.bytes(16).hex()) for _ in range(20_000)])
    assert stats.kstest(draws, "uniform").pvalue > 0.01
    counts, _ = np.histogram(draws, bins=20, range=(0.0, 1.0))
    assert stats.chisquare(counts).pvalue > 0.01
    assert abs(float(np.mean(draws < 0.1)) - 0.1) < 0.01


def test_counting_ids_draw_uniformly_too() -> None:
    draws = np.array([trace_draw(f"{i:032x}") for i in range(1, 20_001)])
    assert stats.kstest(draws, "uniform").pvalue > 0.01
