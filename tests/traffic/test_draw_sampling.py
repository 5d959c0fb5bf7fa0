"""A request without ``X-Request-Id`` is sampled by a uniform draw, not by the hash of
an id relmon makes up (adapters/traffic/intake.py, monitor/core/sampler.py): the traffic
port and the service decide it the same way, each task gets its rate, and only the
sampled requests get an id."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from adapters.traffic import intake as intake_module
from adapters.traffic.intake import MAX_REQUEST_ID, HeaderView, Intake, event_key
from monitor.config import TaskSettings
from monitor.core.apis.registry import get_api
from monitor.core.events import TrafficEvent
from monitor.core.sampler import CallBudget, hash_fraction, sampled
from monitor.engine.admission import AdmissionControl
from monitor.engine.metrics import Metrics
from monitor.engine.routing import HeaderTaskResolver, HeadSkip, RoutedTask, TaskRouter
from monitor.engine.runtime import Job, ServiceStats, TaskRuntime


def test_event_key_uses_an_own_id_else_a_draw() -> None:
    assert event_key(b"  req-1 ") == ("req-1", None)
    assert event_key(b"\xff\xfe") == (None, None)  # not UTF-8: rejected when parsed
    assert event_key(" é-1\t".encode()) == ("é-1", None)
    for raw in (None, b"", b"   ", b"x" * (MAX_REQUEST_ID + 1)):
        rid, draw = event_key(raw)
        assert rid is None
        assert draw is not None and 0.0 <= draw < 1.0
    assert event_key(b"x" * MAX_REQUEST_ID)[0] == "x" * MAX_REQUEST_ID


def test_the_hash_is_sha256_of_task_and_id() -> None:
    """Computed here with hashlib's own SHA-256: the sampler's (CPython's built-in one)
    gives the same fraction, so an upgrade samples the same events with an id."""
    for task, item_id in [("t", "abc"), ("arithmetic", "7f3c2a9e"), ("é", "x" * 300)]:
        digest = hashlib.sha256(f"{task}\x00{item_id}".encode()).digest()
        assert hash_fraction(task, item_id) == int.from_bytes(digest[:8], "big") / 2.0**64


def test_a_draw_is_its_own_sampling_key() -> None:
    assert sampled("t", 0.0999, 0.1) and not sampled("t", 0.1, 0.1)
    assert not sampled("t", 0.5, 0.0) and sampled("t", 0.999, 1.0)
    # An id is hashed with the task, as before.
    assert sampled("t", "abc", 0.3) == (hash_fraction("t", "abc") < 0.3)


def _settings(name: str, rate: float, model: str | None = None) -> TaskSettings:
    return TaskSettings(name=name, sampling_rate=rate, match={"model": model})


def _admission(configured: list[TaskSettings]) -> tuple[AdmissionControl, ServiceStats]:
    runtimes = {
        t.name: cast(
            TaskRuntime,
            SimpleNamespace(
                name=t.name,
                settings=t,
                model=t.name,
                server_tools=frozenset(),
                api=lambda event: get_api(event.api),
            ),
        )
        for t in configured
    }
    stats = ServiceStats()
    admission = AdmissionControl(
        TaskRouter(runtimes),
        store=cast(Any, SimpleNamespace(has_review_item=lambda key: False)),
        metrics=Metrics(CollectorRegistry()),
        clock=cast(Any, SimpleNamespace(monotonic=lambda: 0.0, time=lambda: 0.0)),
        budget=CallBudget(10_000_000, 0.0),
        queue=asyncio.Queue(),
        stats=stats,
    )
    return admission, stats


task_settings = st.builds(
    _settings,
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]),
    st.sampled_from([None, "m1", "m2"]),
)


@settings(max_examples=40, deadline=None)
@given(
    configured=st.lists(task_settings, min_size=1, max_size=3, unique_by=lambda t: t.name),
    heads=st.lists(
        st.tuples(
            st.sampled_from([None, "a", "b", "c", "unknown"]),
            st.one_of(st.text(min_size=1), st.floats(0.0, 1.0, exclude_max=True)),
        ),
        max_size=60,
    ),
)
def test_the_childs_fast_path_decides_draws_as_the_services(
    configured: list[TaskSettings], heads: list[tuple[str | None, str | float]]
) -> None:
    """HeadSkip (the data plane's process) and the service skip the same events, whether
    their key is an id or a draw, and a draw over every task's rate is always skipped."""
    admission, stats = _admission(configured)
    router = TaskRouter({t.name: RoutedTask(t) for t in configured})
    skip = HeadSkip(router)
    assert router.max_rate == max(t.sampling_rate for t in configured)
    for task, key in heads:
        assert skip("proxy", task, key) == admission.skip_by_head("proxy", task, key)
        if isinstance(key, float) and key >= router.max_rate:
            assert router.unsampled_by_head(task, key)
    assert skip.take().get("proxy", 0) == stats.by_decision["skipped"]


def _body(model: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()


async def test_requests_without_an_id_are_sampled_at_each_tasks_rate(
    request: pytest.FixtureRequest,
) -> None:
    """20,000 requests with no X-Request-Id through the port's intake and the service's
    admission: each model's task samples its rate (within 4.5 binomial sigmas), every
    request is decided once, the port never lets through one the service then skips
    for a task named in the head, and each sampled event has a fresh id and its draw."""
    state = intake_module._random.getstate()  # the draws' generator, seeded for this test
    request.addfinalizer(lambda: intake_module._random.setstate(state))
    intake_module._random.seed(11)
    configured = [_settings("small", 0.02, "m-small"), _settings("rest", 0.1)]
    admission, stats = _admission(configured)
    router = admission.router
    named: list[str] = []  # what the service decided for events whose head named the task
    head_named = [False]

    def sink(event: TrafficEvent, source: str) -> Any:
        admitted = admission.offer(event, source)
        if head_named[0]:
            named.append(admitted.decision)
        return admitted

    intake = Intake(
        "proxy",
        sink=sink,
        reject=lambda source, reason: pytest.fail(reason),
        task_resolver=HeaderTaskResolver(router, "X-Relmon-Task"),
        skip=admission.skip_by_head,
        max_rate=router.max_rate,
    )
    models = ["m-small", "m-other"]
    n = 20_000
    at_once = 0
    for i in range(n):
        head = [(b"Host", b"x"), (b"Content-Type", b"application/json")]
        if i % 4 == 0:
            head.append((b"X-Relmon-Task", b"small"))
        rid, draw = event_key(None)
        assert draw is not None
        if intake.skipped_at_once(draw):
            at_once += 1
            continue
        headers = HeaderView(head)
        head_named[0] = i % 4 == 0
        if not intake.skipped(headers, "/v1/chat/completions", rid, draw):
            intake.offer(
                pytest.fail,
                headers,
                "/v1/chat/completions",
                _body(models[i % 2]),
                answer=None,
                rid=rid,
                draw=draw,
            )
    decided = stats.by_decision
    assert decided["skipped"] + decided["sampled"] == n
    assert named and set(named) == {"sampled"}
    assert at_once > 0.85 * n  # draws over 0.1: no task resolved, no hash
    jobs: list[Job] = []
    while not admission.queue.empty():
        jobs.append(admission.queue.get_nowait())
    assert len(jobs) == decided["sampled"]
    ids = [job.event.id for job in jobs]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    for job in jobs:
        event: TrafficEvent = job.event
        assert event.draw is not None and event.draw < job.task.settings.sampling_rate
    # By task: i % 4 == 0 names "small" in the head (and is m-small), i % 4 == 2 is
    # m-small, the odd half m-other (the catch-all task "rest").
    by_task = {"small": 0, "rest": 0}
    for job in jobs:
        by_task[job.task.name] += 1
    expected = {"small": (n / 2, 0.02), "rest": (n / 2, 0.1)}
    for name, (count, rate) in expected.items():
        mean, sigma = count * rate, math.sqrt(count * rate * (1 - rate))
        assert abs(by_task[name] - mean) < 4.5 * sigma, (name, by_task[name], mean)
