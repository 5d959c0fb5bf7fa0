"""Bootstrap ARI of a canonicalization."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import adjusted_rand_score

from monitor.core.errors import InputError
from monitor.core.stability import adjusted_rand_index, bootstrap_ari

labelings = st.integers(2, 30).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 4), min_size=n, max_size=n),
        st.lists(st.integers(0, 4), min_size=n, max_size=n),
    )
)


@given(labelings)
def test_ari_matches_scikit_learn(pair: tuple[list[int], list[int]]) -> None:
    a, b = pair
    assert adjusted_rand_index(a, b) == pytest.approx(adjusted_rand_score(a, b), abs=1e-12)


def test_ari_edge_cases() -> None:
    assert adjusted_rand_index(["x"] * 5, ["y"] * 5) == 1.0
    assert adjusted_rand_index(list("abcde"), list("vwxyz")) == 1.0
    assert adjusted_rand_index(["a"], ["b"]) == 1.0
    assert adjusted_rand_index(list("aabb"), list("abab")) == pytest.approx(
        adjusted_rand_score(list("aabb"), list("abab"))
    )
    with pytest.raises(InputError):
        adjusted_rand_index([1], [1, 2])


def test_per_answer_canonicalization_is_perfectly_stable() -> None:
    answers = ["42", "42.0", "forty", "41", "42", "$42"]

    def group(xs: Sequence[str]) -> list[str]:
        return [x.strip("$").removesuffix(".0") for x in xs]

    report = bootstrap_ari(answers, group, np.random.default_rng(0), n_boot=100)
    assert report.mean_ari == 1.0 and report.stable


def test_order_dependent_clustering_is_flagged_unstable() -> None:
    """A greedy single-link chain clustering whose groups depend on which answers are
    present: 'a'-'ab'-'abc'... merge only through the chain, so resamples break it."""
    answers = ["a", "ab", "abc", "abcd", "x", "xy", "xyz", "b", "bc"] * 2

    def group(xs: Sequence[str]) -> list[int]:
        present = sorted(set(xs))
        parent = {p: p for p in present}

        def find(p: str) -> str:
            while parent[p] != p:
                p = parent[p]
            return p

        for p in present:
            for q in present:
                if p < q and (q.startswith(p) or p.startswith(q)) and abs(len(p) - len(q)) == 1:
                    parent[find(q)] = find(p)
                if p < q and len(p) == len(q) == 1:
                    parent[find(q)] = find(p)  # single letters all merge: a, b, x
        roots = {r: i for i, r in enumerate(sorted({find(p) for p in present}))}
        return [roots[find(x)] for x in xs]

    report = bootstrap_ari(answers, group, np.random.default_rng(1), n_boot=200)
    assert report.mean_ari < 0.8
    assert not report.stable
    assert len(report.values) == 200
