"""The error tree (monitor.core.errors) and the errors public functions raise.

Every expected failure is a :class:`RelmonError`: bad arguments or settings a
:class:`ConfigError`, bad data an :class:`InputError`, too little data a
:class:`CalibrationError`, an object used out of order a :class:`StateError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adapters.kafka.source import KafkaUnavailableError
from adapters.model.client import parse_completion
from adapters.sqlite import store as sqlite_store
from monitor.app.simulate.agents import dirichlet_items, draw_counts
from monitor.app.simulate.alarm import StreamEDetector
from monitor.app.simulate.drift import run_drift
from monitor.app.simulate.plots import plot
from monitor.app.simulate.stopping import parse_distribution
from monitor.core import errors
from monitor.core.alarm import EDetector, bet_grid
from monitor.core.certify import certify
from monitor.core.conformal import (
    AdaptiveAlpha,
    aci_update,
    conformal_threshold,
    conformal_thresholds,
    decay_weights,
    inclusion_weights,
    quantile_index,
    reliability_lower_bound,
    weighted_reliability_level,
    weighted_reliability_lower_bound,
    weighted_threshold,
)
from monitor.core.consensus import Consensus, rank_classes
from monitor.core.errors import (
    CalibrationError,
    CanonicalizationError,
    ConfigError,
    InputError,
    ModelCallError,
    RelmonError,
    StateError,
    StoreError,
)
from monitor.core.priority import prioritised_inclusion_probability
from monitor.core.redaction import Redactor
from monitor.core.sampler import CallBudget
from monitor.core.scores import score_at_rank
from monitor.core.stability import adjusted_rand_index, bootstrap_ari
from monitor.core.stopping import get_stopping_rule
from monitor.core.window import CalibrationWindow

TREE = [getattr(errors, name) for name in errors.__all__]
CONSENSUS = rank_classes(["a", "a", "b"], np.random.default_rng(0))


# --------------------------------------------------------------------------- the tree


@pytest.mark.parametrize("cls", TREE, ids=lambda c: c.__name__)
def test_every_error_derives_from_relmon_error(cls: type[Exception]) -> None:
    assert issubclass(cls, RelmonError)


@pytest.mark.parametrize("cls", TREE, ids=lambda c: c.__name__)
def test_the_docstring_draws_every_error(cls: type[Exception]) -> None:
    assert errors.__doc__ is not None
    drawn = {line.strip(" │├└─").split(" ")[0] for line in errors.__doc__.splitlines()}
    assert cls.__name__ in drawn


def test_adapters_errors_are_in_the_tree() -> None:
    assert sqlite_store.StoreError is StoreError  # moved to the tree, still importable there
    assert issubclass(KafkaUnavailableError, RelmonError)


def test_canonicalization_errors_are_input_errors() -> None:
    assert issubclass(CanonicalizationError, InputError)


@pytest.mark.parametrize(
    ("error", "retriable"),
    [
        (RelmonError("x"), False),
        (ConfigError("x"), False),
        (InputError("x"), False),
        (CanonicalizationError("x"), False),
        (CalibrationError("x"), False),
        (StateError("x"), False),
        (ModelCallError("x"), False),
        (ModelCallError("x", retriable=True), True),
        (StoreError("x"), False),
        (StoreError("x", retriable=True), True),
        (KafkaUnavailableError("x"), True),
    ],
    ids=repr,
)
def test_retriable_flags(error: RelmonError, retriable: bool) -> None:
    assert error.retriable is retriable


def test_the_built_in_bases_kept_for_callers() -> None:
    """What these errors replaced: a caller's ``except ValueError`` still works."""
    for value_error in (ConfigError, InputError, CanonicalizationError):
        assert issubclass(value_error, ValueError)
    assert issubclass(StateError, RuntimeError)
    for other in (CalibrationError, ModelCallError, StoreError, StateError):
        assert not issubclass(other, ValueError)


def test_input_error_names_where_the_data_came_from() -> None:
    assert str(InputError("bad", source="f.jsonl", line=3)) == "f.jsonl:3: bad"
    assert str(InputError("bad", source="f.jsonl")) == "f.jsonl: bad"
    assert str(InputError("bad")) == "bad"


# ------------------------------------------------------- what public functions raise


def _window(**kwargs: Any) -> CalibrationWindow:
    return CalibrationWindow(alphas=kwargs.pop("alphas", (0.1,)), **kwargs)


def _group(answers: Sequence[str]) -> list[str]:
    return list(answers)


BAD_CALLS: list[tuple[str, Callable[[], object], type[RelmonError], str]] = [
    # conformal
    ("alpha 1.5", lambda: conformal_threshold([1.0], 1.5), ConfigError, "alpha"),
    ("alpha 0", lambda: conformal_thresholds([1.0], [0.0]), ConfigError, "alpha"),
    ("NaN score", lambda: conformal_threshold([math.nan], 0.1), InputError, "NaN"),
    ("n < 0", lambda: quantile_index(-1, 0.1), ConfigError, "n must"),
    ("negative weight", lambda: weighted_threshold([1, 2], [1, -1], 0.1), InputError, "weights"),
    ("weights vs scores", lambda: weighted_reliability_level([1, 2], [1]), InputError, "weights"),
    (
        "test weight 0",
        lambda: weighted_threshold([1], [1], 0.1, test_weight=0.0),
        ConfigError,
        "test_weight",
    ),
    (
        "weighted bound, negative weight",
        lambda: weighted_reliability_lower_bound([1], [-1], 0.05),
        InputError,
        "weights",
    ),
    ("half-life 0", lambda: decay_weights([1], half_life=0), ConfigError, "half_life"),
    ("negative age", lambda: decay_weights([-1], half_life=10), InputError, "ages"),
    ("pi 0", lambda: inclusion_weights([0.0]), InputError, "inclusion"),
    ("gamma < 0", lambda: aci_update(0.1, 0.1, True, -1.0), ConfigError, "gamma"),
    ("adaptive gamma < 0", lambda: AdaptiveAlpha(0.1, -1.0), ConfigError, "gamma"),
    ("delta 1.5", lambda: reliability_lower_bound(1, 2, 1.5), ConfigError, "delta"),
    ("successes > n", lambda: reliability_lower_bound(3, 2, 0.05), InputError, "successes"),
    # the calibration window
    ("window alpha", lambda: _window(alphas=(1.5,)), ConfigError, "alpha"),
    ("window size 0", lambda: _window(max_items=0), ConfigError, "max_items"),
    ("window half-life 0", lambda: _window(half_life_s=0.0), ConfigError, "half_life_s"),
    ("window pi floor 0", lambda: _window(min_inclusion_probability=0.0), ConfigError, "min_"),
    ("score below 1", lambda: _window().add("x", 0.5, 1.0, 0.0), InputError, "rank score"),
    ("pi 0 added", lambda: _window().add("x", 1.0, 0.0, 0.0), InputError, "inclusion"),
    ("time inf", lambda: _window().add("x", 1.0, 1.0, math.inf), InputError, "time"),
    # the alarm
    ("target 1", lambda: bet_grid(1.0), ConfigError, "target"),
    ("no bets", lambda: bet_grid(0.9, ()), ConfigError, "bet fractions"),
    ("alarm alpha 0", lambda: EDetector(tau=0.9, alpha=0.0), ConfigError, "alpha"),
    ("pi_min 0", lambda: EDetector(tau=0.9, pi_min=0.0), ConfigError, "pi_min"),
    (
        "pi below the floor",
        lambda: EDetector(tau=0.9, pi_min=0.5).update(True, 0.1),
        InputError,
        "floor",
    ),
    ("pi 1.5", lambda: EDetector(tau=0.9).update(True, 1.5), InputError, "inclusion"),
    # consensus, scores, priority, stopping, budget
    ("counts vs classes", lambda: Consensus(("a",), (1, 2)), InputError, "length"),
    ("rising counts", lambda: Consensus(("a", "b"), (1, 2)), InputError, "non-increasing"),
    ("unknown score", lambda: score_at_rank(CONSENSUS, "bogus", 1), ConfigError, "unknown"),
    ("certify score", lambda: certify([], score="bogus"), ConfigError, "unknown score"),
    (
        "floor 0",
        lambda: prioritised_inclusion_probability(CONSENSUS, floor=0.0, ceiling=1.0),
        ConfigError,
        "floor",
    ),
    ("negative count", lambda: get_stopping_rule().decide([-1]), InputError, "counts"),
    ("unknown rule", lambda: get_stopping_rule("nope"), ConfigError, "unknown"),
    ("budget 0", lambda: CallBudget(0, 0.0), ConfigError, "per_minute"),
    # stability, redaction
    ("labelings", lambda: adjusted_rand_index([1], [1, 2]), InputError, "length"),
    (
        "no answers",
        lambda: bootstrap_ari([], _group, np.random.default_rng(0)),
        InputError,
        "no answers",
    ),
    (
        "n_boot 0",
        lambda: bootstrap_ari(["a"], _group, np.random.default_rng(0), n_boot=0),
        ConfigError,
        "n_boot",
    ),
    ("unknown rule name", lambda: Redactor.from_config(["nope"]), ConfigError, "nope"),
    (
        "bad pattern",
        lambda: Redactor.from_config([], [("mine", "(", "x")]),
        ConfigError,
        "mine",
    ),
    # the simulations and a pure adapter helper
    ("distribution", lambda: parse_distribution("0.5,0.2"), ConfigError, "sum to 1"),
    ("not numbers", lambda: parse_distribution("a,b"), ConfigError, "numbers"),
    (
        "p_star 2",
        lambda: dirichlet_items(np.random.default_rng(0), 2, 2.0),
        ConfigError,
        "p_star",
    ),
    ("k 0", lambda: draw_counts(np.random.default_rng(0), [[1.0]], 0), ConfigError, "k must"),
    ("drift phases", lambda: run_drift(drift_start=10, drift_end=5), ConfigError, "drift_start"),
    ("no outcome yet", lambda: StreamEDetector(0.9, 0.01).value, StateError, "no outcome"),
    ("not a completion", lambda: parse_completion(b"null"), InputError, "choices"),
]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [pytest.param(call, error, match, id=name) for name, call, error, match in BAD_CALLS],
)
def test_bad_arguments_raise_relmon_errors(
    call: Callable[[], object], error: type[RelmonError], match: str
) -> None:
    with pytest.raises(error, match=match):
        call()


def test_no_plot_for_an_experiment_without_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no plot"):
        plot(object(), tmp_path)
