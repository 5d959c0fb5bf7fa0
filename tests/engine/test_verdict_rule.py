"""The one rule from a verdict to a calibration record (live and replayed alike)."""

from __future__ import annotations

import math

import numpy as np

from monitor.config import TaskSettings
from monitor.core.canon import as_async, get_canonicalizer
from monitor.core.consensus import rank_classes
from monitor.core.redaction import Redactor
from monitor.core.review import ReviewItem, Verdict
from monitor.core.stopping import get_stopping_rule
from monitor.engine.runtime import TaskRuntime, item_id
from monitor.engine.verdicts import VerdictScorer, calibration_record, ranks_beyond_candidates
from monitor.testing import FakeModelClient


def _item(aci_threshold: float | None = None) -> ReviewItem:
    consensus = rank_classes(["4", "4", "4", "5", "5", "INVALID"], np.random.default_rng(0))
    return ReviewItem.from_consensus(
        item_id=item_id("arith", "req-1"),
        model="sim-1",
        task="arith",
        query="What is 2 plus 2?",
        consensus=consensus,
        inclusion_probability=0.25,
        sampled_at=1_800_000_000.0,
        thresholds=((0.1, 2.0),),
        aci_threshold=aci_threshold,
    )


def _scorer() -> VerdictScorer:
    canon = get_canonicalizer("numeric")
    task = TaskRuntime(
        settings=TaskSettings(name="arith", canonicalizer="numeric", endpoint={"model": "sim-1"}),
        canonicalizer=as_async(canon),
        rule=get_stopping_rule(k_max=10, k0=3),
        client=FakeModelClient(lambda q, i: "4"),
        sync_canonicalizer=canon,
    )
    return VerdictScorer({"arith": task}, Redactor.default())


def test_item_id_is_task_and_event_id() -> None:
    assert item_id("arith", "req-1") == "arith:req-1"
    assert _item().item_id == "arith:req-1"


def test_the_record_carries_the_item_and_its_aci_step() -> None:
    item = _item(aci_threshold=1.0)
    record = calibration_record(item, 2.0, order=(7,))
    assert (record.model, record.task, record.item_id) == ("sim-1", "arith", "arith:req-1")
    assert (record.score, record.inclusion_probability) == (2.0, 0.25)
    assert (record.sampled_at, record.order) == (1_800_000_000.0, (7,))
    assert record.aci_miss is True  # 2 > the threshold served at alpha_t
    assert calibration_record(item, 1.0).aci_miss is False
    assert calibration_record(_item(), 1.0).aci_miss is None  # scored without ACI
    assert calibration_record(item, 1.0).order == ()


def test_ranks_beyond_the_candidates_are_invalid() -> None:
    item = _item()  # three candidates: 4, 5, INVALID
    assert not ranks_beyond_candidates(item, Verdict(item.item_id, accepted_ranks=(1, 3)))
    assert ranks_beyond_candidates(item, Verdict(item.item_id, accepted_ranks=(4,)))


def test_the_scorer_canonicalizes_a_typed_answer_with_the_task_canonicalizer() -> None:
    scorer, item = _scorer(), _item()
    assert scorer(item, Verdict(item.item_id, accepted_ranks=(2,))) == 2.0
    typed = Verdict(item.item_id, none_of_these=True, correct_answer="4.0")
    assert scorer(item, typed) == 1.0  # "4.0" is the class "4", ranked first
    absent = Verdict(item.item_id, none_of_these=True, correct_answer="17")
    assert math.isinf(scorer(item, absent))
    # A task no longer configured: no canonicalizer, a typed answer cannot be matched.
    other = ReviewItem.from_json({**item.to_json(), "task": "gone"})
    assert math.isinf(scorer(other, typed))
