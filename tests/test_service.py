"""The service core with fakes: admission, sampling, review routing, verdicts, restart."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from adapters.canon.registry import _ExtractThen
from monitor.config import BudgetSettings, TaskSettings
from monitor.core.canon import QueryContext, as_async, get_canonicalizer, per_answer
from monitor.core.canon.regex import RegexCanonicalizer
from monitor.core.canon.toolcall import PlainAnswersOnly
from monitor.core.conformal import decay_weights, weighted_reliability_level, weighted_threshold
from monitor.core.events import parse_event
from monitor.core.review import ReviewItem, Verdict
from monitor.core.stopping import get_stopping_rule
from monitor.engine.metrics import Metrics
from monitor.engine.service import MonitorService, TaskRuntime
from monitor.testing import FakeModelClient, InMemoryStore, ManualClock
from tests.waiting import wait_until


def arithmetic_model(p_right: float, seed: int = 0):
    rng = np.random.default_rng(seed)

    def answer(query: str, call: int) -> str:
        a, b = map(int, re.findall(r"\d+", query)[:2])
        right = a + b
        return f"The answer is {right if rng.random() < p_right else right + 1}."

    return answer


def make_service(
    *,
    client: FakeModelClient,
    store: InMemoryStore | None = None,
    clock: ManualClock | None = None,
    sampling_rate: float = 1.0,
    review_rate: float = 1.0,
    budget: BudgetSettings | None = None,
    registry: CollectorRegistry | None = None,
) -> tuple[MonitorService, InMemoryStore, Metrics, CollectorRegistry]:
    settings = TaskSettings(
        name="arith",
        canonicalizer="numeric",
        k_max=10,
        k0=3,
        sampling_rate=sampling_rate,
        review_rate=review_rate,
        half_life_s=600,
        endpoint={"model": "sim-1"},
    )
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings=settings,
        canonicalizer=as_async(canon),
        rule=get_stopping_rule(k_max=10, k0=3),
        client=client,
        sync_canonicalizer=canon,
    )
    store = store or InMemoryStore()
    registry = registry or CollectorRegistry()
    metrics = Metrics(registry, k_max=10)
    service = MonitorService(
        [task],
        store=store,
        review_queue=store,
        metrics=metrics,
        budget=budget or BudgetSettings(calls_per_minute=100_000, max_in_flight=2, queue_size=100),
        clock=clock or ManualClock(),
    )
    return service, store, metrics, registry


def event(i: int, a: int = 2, b: int = 3) -> dict[str, object]:
    return {
        "id": f"req-{i}",
        "model": "sim-1",
        "task": "arith",
        "request": {
            "model": "sim-1",
            "messages": [{"role": "user", "content": f"What is {a} + {b}?"}],
        },
    }


async def test_events_flow_to_review_and_verdicts_to_the_window() -> None:
    client = FakeModelClient(arithmetic_model(0.9))
    service, store, _, registry = make_service(client=client)
    await service.load()
    service.start()
    admissions = [service.offer(parse_event(event(i, i, 7)), "test") for i in range(40)]
    assert all(a.decision == "sampled" for a in admissions)
    await service.drain()
    assert all(a.done is not None and a.done.done() for a in admissions)
    assert len(store.items) == 40  # review rate 1
    # Verdicts from the ground truth.
    scores = []
    for item in store.pending():
        a, b = map(int, re.findall(r"\d+", item.query)[:2])
        ranks = [i + 1 for i, (c, _) in enumerate(item.candidates) if c == str(a + b)]
        verdict = (
            Verdict(item.item_id, tuple(ranks))
            if ranks
            else Verdict(item.item_id, none_of_these=True)
        )
        outcome = await service.apply_verdict(verdict)
        assert outcome.status == "applied"
        scores.append(outcome.score)
        again = await service.apply_verdict(verdict)
        assert again.status == "duplicate"
    await service.stop(5)
    level = registry.get_sample_value(
        "relmon_reliability_level", {"model": "sim-1", "task": "arith"}
    )
    # All items were sampled at the same clock time, so all weights are equal.
    expected = sum(1 for s in scores if s <= 1) / (len(scores) + 1)
    assert level == pytest.approx(expected)
    threshold = registry.get_sample_value(
        "relmon_conformal_threshold", {"model": "sim-1", "task": "arith", "alpha": "0.1"}
    )
    w = np.ones(len(scores))
    assert threshold == weighted_threshold(scores, w, 0.1, test_weight=1.0)
    assert (
        registry.get_sample_value(
            "relmon_traffic_events_total", {"source": "test", "decision": "sampled"}
        )
        == 40
    )
    assert (
        registry.get_sample_value(
            "relmon_samples_per_item_count", {"model": "sim-1", "task": "arith"}
        )
        == 40
    )
    assert (
        registry.get_sample_value(
            "relmon_reviews_total", {"model": "sim-1", "task": "arith", "verdict": "duplicate"}
        )
        == 40
    )


async def test_restart_restores_exactly_the_same_window() -> None:
    clock = ManualClock()
    client = FakeModelClient(arithmetic_model(0.7, seed=3))
    service, store, _, _ = make_service(client=client, clock=clock)
    await service.load()
    service.start()
    for i in range(30):
        service.offer(parse_event(event(i, i, 1)), "test")
        clock.advance(10)
        await service.drain()
    for item in store.pending():
        a, b = map(int, re.findall(r"\d+", item.query)[:2])
        ranks = [i + 1 for i, (c, _) in enumerate(item.candidates) if c == str(a + b)]
        await service.apply_verdict(
            Verdict(item.item_id, tuple(ranks))
            if ranks
            else Verdict(item.item_id, none_of_these=True)
        )
    await service.stop(5)
    before = service.snapshot("sim-1", "arith")
    restarted, _, _, _ = make_service(client=client, store=store, clock=clock)
    assert await restarted.load() == 30
    after = restarted.snapshot("sim-1", "arith")
    assert after == before
    # And equals the batch weighted formula with decay on the sampling times.
    recs = [r for r, _ in store.records.values()]
    w = decay_weights([clock.time() - r.sampled_at for r in recs], 600) / 1.0
    assert after.reliability_level == pytest.approx(
        weighted_reliability_level([r.score for r in recs], w)
    )


async def test_failed_calls_abandon_the_item_and_refund_the_budget() -> None:
    client = FakeModelClient(lambda q, i: RuntimeError("boom") if i >= 2 else "5")
    service, store, _, registry = make_service(client=client)
    service.start()
    admission = service.offer(parse_event(event(1)), "test")
    await service.drain()
    await service.stop(1)
    assert admission.done is not None and admission.done.done()
    assert store.items == {}  # never scored on partial data
    assert (
        registry.get_sample_value(
            "relmon_items_total", {"model": "sim-1", "task": "arith", "outcome": "abandoned"}
        )
        == 1
    )
    assert service.budget.tokens == pytest.approx(service.budget.capacity)


async def test_over_budget_and_full_queue_drop_without_waiting() -> None:
    client = FakeModelClient(lambda q, i: "5")
    service, _, _, registry = make_service(
        client=client, budget=BudgetSettings(calls_per_minute=25, max_in_flight=1, queue_size=100)
    )
    decisions = [service.offer(parse_event(event(i)), "test").decision for i in range(5)]
    assert decisions == [
        "sampled",
        "sampled",
        "dropped",
        "dropped",
        "dropped",
    ]  # 10 calls reserved each
    service2, _, _, _ = make_service(
        client=client, budget=BudgetSettings(calls_per_minute=10_000, max_in_flight=1, queue_size=2)
    )
    decisions = [service2.offer(parse_event(event(i)), "test").decision for i in range(4)]
    assert decisions == ["sampled", "sampled", "dropped", "dropped"]
    assert (
        registry.get_sample_value(
            "relmon_traffic_events_total", {"source": "test", "decision": "dropped"}
        )
        == 3
    )


async def test_hash_sampling_is_deterministic_and_near_the_rate() -> None:
    client = FakeModelClient(lambda q, i: "5")
    service, _, _, _ = make_service(
        client=client,
        sampling_rate=0.1,
        budget=BudgetSettings(calls_per_minute=10**7, max_in_flight=1, queue_size=10_000),
    )
    first = [service.offer(parse_event(event(i)), "t").decision for i in range(4000)]
    share = first.count("sampled") / 4000
    assert abs(share - 0.1) < 0.02
    service2, _, _, _ = make_service(
        client=client,
        sampling_rate=0.1,
        budget=BudgetSettings(calls_per_minute=10**7, max_in_flight=1, queue_size=10_000),
    )
    assert [service2.offer(parse_event(event(i)), "t").decision for i in range(4000)] == first


async def test_the_fast_path_skips_exactly_the_events_offer_would_skip() -> None:
    service, _, _, registry = make_service(
        client=FakeModelClient(lambda q, i: "5"),
        sampling_rate=0.1,
        budget=BudgetSettings(calls_per_minute=10**7, max_in_flight=1, queue_size=10_000),
    )
    fast = [service.skip_unsampled("t", "arith", "sim-1", f"req-{i}") for i in range(2000)]
    # The same events offered in full: skipped exactly where the fast path skipped.
    slow = [service.offer(parse_event(event(i)), "u").decision == "skipped" for i in range(2000)]
    assert fast == slow
    assert 0.85 < sum(fast) / 2000 < 0.95
    skipped = registry.get_sample_value(
        "relmon_traffic_events_total", {"source": "t", "decision": "skipped"}
    )
    assert skipped == sum(fast)
    # A task named in the event that does not exist: nothing can sample it.
    assert service.skip_unsampled("t", "no-such-task", None, "x")


async def test_unknown_verdicts_and_invalid_ranks() -> None:
    service, store, _, registry = make_service(client=FakeModelClient(lambda q, i: "5"))
    labels = {"model": "sim-1", "task": "arith"}

    def count(name: str, **extra: str) -> float | None:
        return registry.get_sample_value(name, {**extra})

    assert (await service.apply_verdict(Verdict("nope", (1,)))).status == "unknown"
    # No item, so no model or task: counted by reason alone, never under empty labels.
    assert count("relmon_verdicts_rejected_total", reason="unknown") == 1
    service.reject_verdict("invalid", "not JSON")  # what a review backend reports
    assert count("relmon_verdicts_rejected_total", reason="invalid") == 1
    assert count("relmon_reviews_total", model="", task="", verdict="unknown") is None
    assert count("relmon_reviews_total", model="", task="", verdict="invalid") is None
    service.start()
    service.offer(parse_event(event(1)), "test")
    await service.drain()
    await service.stop(1)
    item = store.pending()[0]
    assert (await service.apply_verdict(Verdict(item.item_id, (5,)))).status == "invalid"
    # An attributable invalid verdict keeps its real labels.
    assert count("relmon_reviews_total", **labels, verdict="invalid") == 1
    # No verdict applied yet: no level, no lower bound (not a 0), though the window exists.
    service.publish()
    assert count("relmon_reliability_level", **labels) is None
    assert count("relmon_reliability_lower_bound", **labels) is None
    outcome = await service.apply_verdict(
        Verdict(item.item_id, none_of_these=True, correct_answer="5.0")
    )
    assert outcome.status == "applied" and outcome.score == 1.0  # typed answer found at rank 1
    # The first verdict creates the level and its bound.
    assert count("relmon_reliability_level", **labels) == pytest.approx(0.5)
    assert 0 <= (count("relmon_reliability_lower_bound", **labels) or -1) <= 0.5
    snap = service.snapshot("sim-1", "arith")
    assert snap.n == 1 and snap.reliability_level == pytest.approx(0.5)  # 1 / (n + 1)
    assert snap.thresholds[0.3] == math.inf  # k = ceil(2 * 0.7) = 2 > n = 1


def test_deeply_nested_json_is_a_rejected_event_not_a_crash() -> None:
    from monitor.core.errors import InputError
    from monitor.core.review import parse_verdict

    with pytest.raises(InputError, match="nested too deeply"):
        parse_event(b"[" * 100_000)
    with pytest.raises(InputError, match="not valid JSON"):
        parse_verdict(b"[" * 60_000)  # deep, and under the verdict's size limit
    with pytest.raises(InputError, match="over the limit"):
        parse_verdict(b"[" * 100_000)


def test_every_known_series_exists_at_zero_before_traffic() -> None:
    service, _, _, registry = make_service(client=FakeModelClient(arithmetic_model(1.0)))
    labels = {"model": "sim-1", "task": "arith"}
    for outcome in ("scored", "abandoned"):
        assert registry.get_sample_value("relmon_items_total", {**labels, "outcome": outcome}) == 0
    for verdict in ("accepted", "none", "duplicate", "invalid"):
        value = registry.get_sample_value("relmon_reviews_total", {**labels, "verdict": verdict})
        assert value == 0
    for reason in ("unknown", "invalid"):
        value = registry.get_sample_value("relmon_verdicts_rejected_total", {"reason": reason})
        assert value == 0
    # No series under empty model and task labels; the level is a gauge of an estimate and
    # does not exist before the first verdict (a counter's 0 is true, a level's 0 is not).
    assert not any(s.labels.get("model") == "" for m in registry.collect() for s in m.samples)
    assert registry.get_sample_value("relmon_reliability_level", labels) is None
    assert registry.get_sample_value("relmon_reliability_lower_bound", labels) is None
    for outcome in ("accepted", "rejected"):
        value = registry.get_sample_value(
            "relmon_top_answers_total", {**labels, "outcome": outcome}
        )
        assert value == 0
    for alpha in service.tasks["arith"].alphas:
        key = {**labels, "alpha": f"{alpha:g}"}
        assert registry.get_sample_value("relmon_coverage_checks_total", key) == 0
        assert registry.get_sample_value("relmon_coverage_misses_total", key) == 0
    names = {m.name for m in registry.collect() for s in m.samples if s.name.endswith("_created")}
    assert names == set()


async def test_model_label_comes_from_configuration_not_the_request() -> None:
    """3,000 client model names must not make 3,000 series: the task's model is used."""
    service, _, _, registry = make_service(client=FakeModelClient(arithmetic_model(1.0)))
    service.start()
    for i in range(20):
        e = parse_event({**event(i), "model": f"client-made-up-{i}"})
        service.offer(e, "kafka")
    await service.drain()
    await service.stop(1.0)
    models = {
        s.labels["model"] for m in registry.collect() for s in m.samples if "model" in s.labels
    }
    assert models == {"sim-1"}  # and no "" (unknown verdicts are counted by reason alone)
    assert (
        registry.get_sample_value(
            "relmon_items_total", {"model": "sim-1", "task": "arith", "outcome": "scored"}
        )
        == 20
    )


async def test_top_answer_sli_counts_each_verdict_with_weight_one_over_pi() -> None:
    """relmon_top_answers_total: accepted iff the top-ranked answer was accepted, weight 1/pi."""
    client = FakeModelClient(arithmetic_model(0.6, seed=3))
    service, store, _, registry = make_service(client=client, review_rate=0.25)
    service.start()
    for i in range(200):
        service.offer(parse_event(event(i, i, 5)), "test")
    await service.drain()
    await service.stop(5)
    items = store.pending()
    assert 20 < len(items) < 80  # about a quarter reviewed
    top_right = 0
    for item in items:
        a, b = map(int, re.findall(r"\d+", item.query)[:2])
        ranks = [i + 1 for i, (c, _) in enumerate(item.candidates) if c == str(a + b)]
        verdict = (
            Verdict(item.item_id, tuple(ranks))
            if ranks
            else Verdict(item.item_id, none_of_these=True)
        )
        top_right += item.candidates[0][0] == str(a + b)
        assert (await service.apply_verdict(verdict)).status == "applied"
        # A duplicate verdict is not counted twice.
        assert (await service.apply_verdict(verdict)).status == "duplicate"
    labels = {"model": "sim-1", "task": "arith"}
    accepted = registry.get_sample_value(
        "relmon_top_answers_total", {**labels, "outcome": "accepted"}
    )
    rejected = registry.get_sample_value(
        "relmon_top_answers_total", {**labels, "outcome": "rejected"}
    )
    assert 0 < top_right < len(items)  # both outcomes happen
    assert accepted == pytest.approx(4.0 * top_right)
    assert rejected == pytest.approx(4.0 * (len(items) - top_right))


async def test_a_repeated_event_is_a_duplicate_and_a_waiting_source_gets_busy() -> None:
    client = FakeModelClient(arithmetic_model(1.0))
    clock = ManualClock()
    budget = BudgetSettings(calls_per_minute=20, max_in_flight=1, queue_size=10, pace=False)
    service, store, _, registry = make_service(client=client, clock=clock, budget=budget)
    await service.load()
    first = service.offer(parse_event(event(1)), "kafka", wait=True)
    again = service.offer(parse_event(event(1)), "kafka", wait=True)
    assert (first.decision, again.decision) == ("sampled", "duplicate")
    assert again.done is first.done  # still running: the source waits for the first one
    # 20 calls a minute, 10 reserved per item: room for one more, then busy (not counted)
    assert service.offer(parse_event(event(2)), "kafka", wait=True).decision == "sampled"
    assert service.offer(parse_event(event(3)), "kafka", wait=True).decision == "busy"
    assert service.offer(parse_event(event(3)), "mirror").decision == "dropped"
    service.start()
    await service.drain()
    assert service.offer(parse_event(event(2)), "kafka").decision == "duplicate"
    assert service.offer(parse_event(event(2)), "kafka").done is None  # done long ago
    assert client.calls <= 20 and len(store.items) == 2

    def count(decision: str, source: str = "kafka") -> float:
        labels = {"source": source, "decision": decision}
        return registry.get_sample_value("relmon_traffic_events_total", labels) or 0.0

    assert (count("sampled"), count("duplicate"), count("dropped")) == (2, 3, 0)
    assert count("dropped", "mirror") == 1
    await service.stop(5)
    assert service.offer(parse_event(event(9)), "kafka", wait=True).decision == "busy"


async def test_items_unfinished_at_shutdown_are_counted_as_interrupted() -> None:
    """SIGTERM with items in flight and queued: each is counted (created at 0 at start),
    none is silently dropped, and the budget reserved by the queued ones is returned."""

    class Hanging:
        circuit_state = "closed"

        async def sample(self, request: object, n: int, **_: object) -> list[str]:
            await asyncio.Event().wait()
            return []

        async def aclose(self) -> None:
            return None

    budget = BudgetSettings(calls_per_minute=1_000, max_in_flight=2, queue_size=100)
    service, _, _, registry = make_service(client=Hanging(), budget=budget)  # type: ignore[arg-type]
    labels = {"model": "sim-1", "task": "arith", "outcome": "interrupted"}
    assert registry.get_sample_value("relmon_items_total", labels) == 0.0
    await service.load()
    service.start()
    admissions = [service.offer(parse_event(event(i)), "mirror") for i in range(5)]
    assert all(a.decision == "sampled" for a in admissions)
    await wait_until(lambda: service.workers.busy == 2, what="both hanging calls to start")
    assert await service.stop(0.2) is False
    assert registry.get_sample_value("relmon_items_total", labels) == 5.0
    assert service.stats.interrupted == 5
    assert service.stats.scored == service.stats.abandoned == 0
    assert sum(1 for a in admissions if a.done is not None and not a.done.done()) == 3
    assert service.budget.utilization(service.clock.monotonic()) == 0.0


class FlakyQueue(InMemoryStore):
    """A review queue whose first ``failures`` writes fail (a broker re-electing its
    leader, a locked database)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.attempts = 0

    async def submit(self, item: ReviewItem) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise OSError(f"write {self.attempts} failed")
        await super().submit(item)


@pytest.mark.parametrize("failures", [0, 1, 2])
async def test_a_review_item_write_that_fails_is_tried_again(failures: int) -> None:
    """Failed writes: the item waits in the review outbox (counted as waiting) and
    reaches the reviewers once the queue takes it, scored once (no second round of model
    calls), nothing counted as lost."""
    client = FakeModelClient(arithmetic_model(1.0))
    queue = FlakyQueue(failures)
    service, _, _, registry = make_service(client=client, store=queue)
    await service.load()
    service.start()
    admission = service.offer(parse_event(event(1)), "kafka", wait=True)
    assert admission.decision == "sampled" and admission.done is not None
    await asyncio.wait_for(admission.done, 10)
    labels = {"model": "sim-1", "task": "arith"}
    assert registry.get_sample_value("relmon_review_queue_depth", labels) == 1.0
    await wait_until(lambda: len(service.reviews.outbox) == 0, what="the outbox to drain")
    assert queue.attempts == failures + 1 and [i.item_id for i in queue.pending()] == [
        "arith:req-1"
    ]
    assert registry.get_sample_value("relmon_review_submit_failures_total", labels) == (
        1.0 if failures else 0.0
    )
    assert registry.get_sample_value("relmon_review_outbox_items", labels) == 0.0
    assert registry.get_sample_value("relmon_review_outbox_dropped_total", labels) == 0.0
    assert registry.get_sample_value("relmon_review_queue_depth", labels) == 1.0
    assert service.stats.scored == service.stats.reviewed == 1 and client.calls <= 10
    await service.stop(5)


async def test_a_review_item_the_full_outbox_cannot_keep_is_counted_and_logged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The queue refuses every write and the outbox holds one item: the first scored
    item waits (counted as waiting), the second is dropped: counted under
    relmon_review_outbox_dropped_total, one error line naming the item (not its text),
    its id forgotten, so a later delivery of the event is asked again rather than called
    a duplicate. Once the queue takes writes, the waiting item is written."""
    client = FakeModelClient(arithmetic_model(1.0))
    queue = FlakyQueue(failures=10**9)
    service, _, _, registry = make_service(client=client, store=queue)
    service.reviews.outbox.max_items = 1
    await service.load()
    service.start()
    labels = {"model": "sim-1", "task": "arith"}
    for i in (1, 2):
        admission = service.offer(parse_event(event(i)), "kafka", wait=True)
        assert admission.done is not None
        await asyncio.wait_for(admission.done, 10)
    assert queue.pending() == [] and len(service.reviews.outbox) == 1
    assert registry.get_sample_value("relmon_review_outbox_items", labels) == 1.0
    assert registry.get_sample_value("relmon_review_outbox_dropped_total", labels) == 1.0
    assert registry.get_sample_value("relmon_review_queue_depth", labels) == 1.0
    assert service.stats.scored == 2 and service.stats.reviewed == 1
    out = capsys.readouterr().out
    assert "review_item_dropped" in out and "arith:req-2" in out
    assert "What is 2 + 3" not in out and "Traceback" not in out
    assert service.offer(parse_event(event(1)), "kafka", wait=True).decision == "duplicate"
    queue.failures = 0
    await wait_until(lambda: len(service.reviews.outbox) == 0, what="the outbox to drain")
    assert [i.item_id for i in queue.pending()] == ["arith:req-1"]
    assert service.offer(parse_event(event(2)), "kafka", wait=True).decision == "sampled"
    await service.drain()
    assert [i.item_id for i in queue.pending()] == ["arith:req-1", "arith:req-2"]
    assert registry.get_sample_value("relmon_review_outbox_items", labels) == 0.0
    await service.stop(5)


class _Counting:
    """The numeric canonicalizer, counting the answers it is given."""

    name = "numeric"

    def __init__(self) -> None:
        self.inner = get_canonicalizer("numeric")
        self.given = 0

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        self.given += 1
        return self.inner.canonicalize(answer, context)


class _Joint:
    """The numeric canonicalizer as one that groups an item's answers jointly (no
    ``per_answer``): it must be given every answer again after each batch."""

    name = "numeric"

    def __init__(self) -> None:
        self.inner = get_canonicalizer("numeric")
        self.given = 0

    async def canonicalize_many(
        self, answers: Sequence[str], context: QueryContext | None = None
    ) -> list[str]:
        self.given += len(answers)
        return [self.inner.canonicalize(a, context) for a in answers]


async def test_a_per_answer_canonicalizer_is_given_each_answer_once() -> None:
    """After each batch of re-asks only the new answers are canonicalized when the
    canonicalizer is per-answer; a joint one sees them all again. Same answers, same
    classes, same review items either way."""
    outcomes = {}
    for kind in ("per_answer", "joint"):
        canon = _Counting() if kind == "per_answer" else _Joint()
        wrapped = PlainAnswersOnly(as_async(canon) if kind == "per_answer" else canon)
        assert per_answer(wrapped) is (kind == "per_answer")
        client = FakeModelClient(arithmetic_model(0.55, seed=3))  # close calls: many batches
        service, store, _, _ = make_service(
            client=client,
            budget=BudgetSettings(calls_per_minute=100_000, max_in_flight=1, queue_size=100),
        )
        service.tasks["arith"].canonicalizer = wrapped
        await service.load()
        service.start()
        for i in range(30):
            service.offer(parse_event(event(i, i, 7)), "test")
        await service.drain()
        await service.stop(5)
        outcomes[kind] = (canon.given, client.calls, sorted(store.items.values(), key=str))
    given, calls, items = outcomes["per_answer"]
    joint_given, joint_calls, joint_items = outcomes["joint"]
    assert calls == joint_calls and items == joint_items and len(items) == 30
    assert given == calls  # each answer once
    assert joint_given > calls  # every answer again after every batch


class _Warming(_Joint):
    """A canonicalizer with a model to load (as the embedding one): ``warm_up``."""

    def __init__(self) -> None:
        super().__init__()
        self.warmed = 0

    async def warm_up(self) -> None:
        self.warmed += 1


@pytest.mark.parametrize("wrap", ["plain", "answers only", "answer pattern"])
async def test_load_prepares_the_canonicalizer_before_any_traffic(wrap: str) -> None:
    """A model to load (the embedding one) loads in load(), before traffic, through any
    wrapper relmon puts around the canonicalizer, not on the first item while live
    requests wait (bench/isolation_bench.py: +190 ms at p99 in one process)."""
    canon = _Warming()
    wrapped: Any = {
        "plain": canon,
        "answers only": PlainAnswersOnly(canon),
        "answer pattern": _ExtractThen(RegexCanonicalizer(pattern=r"(\d+)"), canon),
    }[wrap]
    service, _, _, _ = make_service(client=FakeModelClient(arithmetic_model(1.0)))
    service.tasks["arith"].canonicalizer = wrapped
    assert canon.warmed == 0
    await service.load()
    assert canon.warmed == 1
