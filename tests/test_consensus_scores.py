"""Ranked consensus and the nonconformity scores."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.core.canon.base import INVALID
from monitor.core.consensus import Consensus, rank_classes
from monitor.core.errors import ConfigError, InputError
from monitor.core.scores import (
    SCORE_NAMES,
    aps_score,
    cumprob_score,
    item_score,
    lac_score,
    rank_score,
    set_size,
)


def test_rank_by_count() -> None:
    c = rank_classes(["b", "a", "b", "c", "b", "a"], np.random.default_rng(0))
    assert c.classes == ("b", "a", "c")
    assert c.counts == (3, 2, 1)
    assert c.k == 6
    assert c.mode == "b"
    assert c.strength == pytest.approx(0.5)
    assert c.margin == pytest.approx(1 / 6)
    p = np.array([3, 2, 1]) / 6
    assert c.entropy == pytest.approx(float(-(p * np.log(p)).sum()))
    assert c.rank("a") == 2
    assert c.rank("zzz") == math.inf
    assert c.top(2) == ("b", "a")
    assert c.top(math.inf) == ("b", "a", "c")


def test_counts_mapping_input_and_single_class() -> None:
    c = rank_classes({"x": 5}, np.random.default_rng(0))
    assert c.margin == 1.0
    assert c.entropy == 0.0
    empty = rank_classes([], np.random.default_rng(0))
    assert empty.mode is None and empty.k == 0 and empty.strength == 0.0


def test_ties_broken_uniformly_at_random_not_alphabetically() -> None:
    rng = np.random.default_rng(42)
    firsts = Counter(rank_classes(["a", "b", "c", "a", "b", "c"], rng).mode for _ in range(6000))
    assert set(firsts) == {"a", "b", "c"}
    for count in firsts.values():  # each ~2000; 5 SE ~ 180
        assert abs(count - 2000) < 200
    # The tie-break is a function of the generator only: same seed, same order.
    a = rank_classes(["x", "y"], np.random.default_rng(7))
    b = rank_classes(["x", "y"], np.random.default_rng(7))
    assert a == b


@given(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=40), st.integers(0, 2**32 - 1))
def test_consensus_invariants(answers: list[str], seed: int) -> None:
    c = rank_classes(answers, np.random.default_rng(seed))
    assert sorted(c.classes) == sorted(set(answers))
    assert list(c.counts) == sorted(c.counts, reverse=True)
    assert c.k == len(answers)
    assert dict(zip(c.classes, c.counts, strict=True)) == Counter(answers)
    assert 0 <= c.margin <= c.strength <= 1


def test_consensus_validates() -> None:
    with pytest.raises(InputError):
        Consensus(("a", "b"), (1, 2))
    with pytest.raises(InputError):
        Consensus(("a", "a"), (2, 1))


# --- scores ---------------------------------------------------------------------------

C = Consensus(("42", INVALID, "41", "7"), (5, 3, 1, 1))


def test_rank_score() -> None:
    assert rank_score(C, {"42"}) == 1
    assert rank_score(C, {"41", "7"}) == 3  # smallest rank among acceptable classes
    assert rank_score(C, {"99"}) == math.inf
    assert rank_score(C, {INVALID}) == math.inf  # INVALID is never acceptable
    assert rank_score(C, set()) == math.inf


def test_other_scores_hand_computed() -> None:
    assert cumprob_score(C, {"41"}) == pytest.approx(0.9)
    assert lac_score(C, {"41"}) == pytest.approx(0.9)
    assert lac_score(C, {"42"}) == pytest.approx(0.5)
    assert aps_score(C, {"41"}, u=0.5) == pytest.approx((8 + 0.5) / 10)
    assert aps_score(C, {"42"}, u=0.0) == 0.0
    for name in SCORE_NAMES:
        assert item_score(C, {"nope"}, name, 0.3) == math.inf


@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=8).map(lambda xs: sorted(xs, reverse=True)),
    st.sampled_from(SCORE_NAMES),
    st.floats(0, 1),
    st.floats(0, 10),
)
def test_set_membership_agrees_with_scores(
    counts: list[int], score: str, u: float, threshold: float
) -> None:
    """c is in the set at t exactly when its score <= t, and the set is a top-M set."""
    consensus = Consensus(tuple(f"c{i}" for i in range(len(counts))), tuple(counts))
    size = set_size(consensus, score, threshold, u)
    members = [item_score(consensus, {cls}, score, u) <= threshold for cls in consensus.classes]
    # A class tied with a member by count can sit at a later rank; membership is by rank.
    assert size == sum(members)
    assert members == [True] * size + [False] * (len(counts) - size)


def test_rank_set_size() -> None:
    assert set_size(C, "rank", 2) == 2
    assert set_size(C, "rank", math.inf) == 4
    assert set_size(C, "rank", 9) == 4
    with pytest.raises(ConfigError):
        set_size(C, "bogus", 1)
