"""The pieces of ``traffic.data_plane: process`` (adapters/traffic/dataplane.py) alone: the
frames, the proxy's counts carried from one process's metrics to another's, the child's
fast path against the service's, and a child that cannot start. The whole of it, with a
real child process, is in tests/e2e/test_data_plane_process.py."""

from __future__ import annotations

import asyncio
import bisect
import socket
import sys
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from adapters.traffic.dataplane import DataPlaneProcess, frame, read_frame
from adapters.traffic.proxy_metrics import (
    ADDED_LATENCY_BUCKETS,
    FAILURE_REASONS,
    ProxyMetrics,
    bucket_of,
)
from monitor.config import TaskSettings
from monitor.core.errors import ConfigError
from monitor.core.sampler import CallBudget
from monitor.engine.admission import AdmissionControl
from monitor.engine.metrics import Metrics
from monitor.engine.routing import HeadSkip, RoutedTask, TaskRouter
from monitor.engine.runtime import ServiceStats, TaskRuntime


async def test_frames_round_trip_and_a_cut_frame_is_the_end() -> None:
    reader = asyncio.StreamReader()
    messages = [
        ("offer", "proxy", [(b"X-Request-Id", b"r1")], "/v1/chat/completions", b"{}", None, "r1"),
        ("counts", {("proxy", "skipped"): 7}, None),
        ("synced", 3),
    ]
    for m in messages:
        reader.feed_data(frame(m))
    reader.feed_data(frame(("reject", "proxy", "oversize"))[:-2])  # the sender died here
    reader.feed_eof()
    assert [await read_frame(reader) for _ in messages] == messages
    assert await read_frame(reader) is None


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[Any, ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


latencies = st.lists(st.floats(min_value=0.0, max_value=0.5), max_size=30)
ROUTES = ("0", "anthropic", "default")
routes = st.sampled_from(ROUTES)


@settings(max_examples=50, deadline=None)
@given(
    answered=st.lists(
        st.tuples(st.sampled_from([200, 204, 302, 404, 503]), latencies, routes), max_size=5
    ),
    failed=st.lists(st.tuples(st.sampled_from(FAILURE_REASONS), routes), max_size=20),
    other=st.lists(st.sampled_from(["client", "unrouted"]), max_size=5),
    takes=st.integers(min_value=1, max_value=4),
)
def test_counts_taken_in_one_process_and_merged_in_another_read_the_same(
    answered: list[tuple[int, list[float], str]],
    failed: list[tuple[str, str]],
    other: list[str],
    takes: int,
) -> None:
    """What a child counts, taken in several batches and merged in the main process,
    is exported exactly as if the main process had counted it itself, route by route."""
    child, main_registry = ProxyMetrics(), CollectorRegistry()
    merged = ProxyMetrics(main_registry, routes=ROUTES)
    reference_registry = CollectorRegistry()
    reference = ProxyMetrics(reference_registry, routes=ROUTES)
    events = [
        *(("a", s, x, route) for s, xs, route in answered for x in xs),
        *(("f", reason, 0.0, route) for reason, route in failed),
        *((kind, "", 0.0, "") for kind in other),
    ]
    batch = max(1, len(events) // takes)
    for i, (kind, what, added, route) in enumerate(events):
        for m in (child, reference):
            if kind == "a":
                m.route(route).answered(cast(int, what), added)
            elif kind == "f":
                m.route(route).failed(cast(str, what))
            elif kind == "client":
                m.client_send_timeout()
            else:
                m.unrouted()
        if (i + 1) % batch == 0:
            counts = child.take()
            assert counts is not None
            merged.merge(counts)
    rest = child.take()
    if rest is not None:
        merged.merge(rest)
    assert child.take() is None  # all handed over: nothing counted twice
    # Counts exactly; the latency sum up to rounding (added in another grouping).
    assert samples(main_registry) == pytest.approx(samples(reference_registry), rel=1e-12)
    assert len(ADDED_LATENCY_BUCKETS) + 1 == len(merged.route("default").buckets)


@settings(max_examples=300, deadline=None)
@given(
    added=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(ADDED_LATENCY_BUCKETS),  # exactly on a bound: that bound's bucket
        st.floats(min_value=0.0, max_value=0.2),
    )
)
def test_an_added_latency_falls_in_the_bucket_bisect_gives(added: float) -> None:
    """The hot path's bucket search agrees with ``bisect_left`` over the bounds, for any
    float: a bound itself, between bounds, past the last, negative, infinite, NaN."""
    assert bucket_of(added) == bisect.bisect_left(ADDED_LATENCY_BUCKETS, added)


def _admission(tasks: dict[str, Any]) -> tuple[AdmissionControl, ServiceStats]:
    none: Any = None
    stats = ServiceStats()
    admission = AdmissionControl(
        TaskRouter(tasks),
        store=none,
        metrics=Metrics(CollectorRegistry()),
        clock=none,
        budget=CallBudget(1000, 0.0),
        queue=asyncio.Queue(),
        stats=stats,
    )
    return admission, stats


task_settings = st.builds(
    lambda name, rate, model: TaskSettings(name=name, sampling_rate=rate, match={"model": model}),
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from([0.01, 0.1, 0.5, 1.0]),
    st.sampled_from([None, "m1", "m2"]),
)


@settings(max_examples=40, deadline=None)
@given(
    configured=st.lists(task_settings, min_size=1, max_size=3, unique_by=lambda t: t.name),
    heads=st.lists(
        st.tuples(st.sampled_from([None, "a", "b", "c", "unknown"]), st.text(min_size=1)),
        max_size=60,
    ),
)
def test_the_childs_fast_path_decides_and_counts_as_the_services(
    configured: list[TaskSettings], heads: list[tuple[str | None, str]]
) -> None:
    """HeadSkip, built from the settings alone (the data plane's process), skips exactly
    the requests the service's own fast path skips, and counts the same number."""
    runtimes = {
        t.name: cast(TaskRuntime, SimpleNamespace(name=t.name, settings=t)) for t in configured
    }
    admission, stats = _admission(runtimes)
    skip = HeadSkip(TaskRouter({t.name: RoutedTask(t) for t in configured}))
    for task, rid in heads:
        assert skip("proxy", task, rid) == admission.skip_by_head("proxy", task, rid)
    assert skip.take().get("proxy", 0) == stats.by_decision["skipped"]
    assert skip.take() == {}


async def test_a_child_that_cannot_start_is_a_config_error() -> None:
    listening = socket.create_server(("127.0.0.1", 0))
    plane = DataPlaneProcess(
        command=[sys.executable, "-c", "import sys; sys.exit(3)"],
        config=None,
        listening=listening,
        on_offer=lambda *a: None,
        on_reject=lambda *a: None,
        on_counts=lambda *a: None,
        start_timeout_s=30,
    )
    try:
        with pytest.raises(ConfigError, match="data plane process did not start: it exited"):
            await plane.start()
        assert plane.down
        await asyncio.wait_for(plane.sync(), 1)  # nothing to wait for: at once
    finally:
        listening.close()


async def test_a_child_that_says_why_it_cannot_start() -> None:
    """The child's own reason reaches the error (here: the config frame is not one)."""
    child = (
        "import asyncio, sys\n"
        "from adapters.traffic.dataplane import serve_child\n"
        "def build(config, sock, relay):\n"
        "    raise ValueError('no such upstream')\n"
        "sys.exit(asyncio.run(serve_child(int(sys.argv[1]), int(sys.argv[2]), build)))\n"
    )
    listening = socket.create_server(("127.0.0.1", 0))
    plane = DataPlaneProcess(
        command=[sys.executable, "-c", child],
        config={"anything": 1},
        listening=listening,
        on_offer=lambda *a: None,
        on_reject=lambda *a: None,
        on_counts=lambda *a: None,
    )
    try:
        with pytest.raises(ConfigError, match="ValueError: no such upstream"):
            await plane.start()
    finally:
        listening.close()
