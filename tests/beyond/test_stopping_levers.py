"""The runner-up (intersection-union) rule and the futility stop."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from monitor.app.simulate.real_stopping import load_answer_file, run_real_stopping
from monitor.app.simulate.stopping import run_stopping_trials
from monitor.core.errors import ConfigError
from monitor.core.stopping import MixtureRule, RunnerUpRule, get_stopping_rule

DELTA = 0.05
ANSWERS = Path(__file__).resolve().parents[2] / "bench" / "data" / "smollm2_answers.json"


def e_value_by_quadrature(x: int, y: int) -> float:
    """E = int_{1/2}^1 (theta/(1/2))^x ((1-theta)/(1/2))^y * 2 dtheta, computed numerically."""
    value, _ = integrate.quad(lambda t: (2 * t) ** x * (2 * (1 - t)) ** y * 2, 0.5, 1.0)
    return float(value)


def test_runner_up_threshold_does_not_grow_with_the_number_of_classes() -> None:
    rule = RunnerUpRule(k0=1, k_max=60, delta=DELTA)
    union = MixtureRule(k0=1, k_max=60, delta=DELTA)
    for x, y in [(9, 1), (12, 2), (16, 3), (20, 5)]:
        expected = e_value_by_quadrature(x, y) >= 2 / DELTA
        for tail in (0, 3, 10):
            counts = [x, y, *([1] * tail)]
            assert rule.certified(counts) == expected, (x, y, tail)
    # The union over observed rivals needs more as the tail grows; runner-up does not.
    long_tail = [12, 1, *([1] * 10)]
    assert rule.certified(long_tail) and not union.certified(long_tail)


def test_runner_up_stops_unanimous_answers_at_eight() -> None:
    rule = RunnerUpRule(k0=1, delta=DELTA)
    first = next(k for k in range(1, 21) if rule.certified([k]))
    assert first == next(n for n in range(1, 30) if (2 ** (n + 1) - 1) / (n + 1) >= 2 / DELTA)
    assert first == 8


def test_runner_up_rejects_a_bad_constant() -> None:
    with pytest.raises(ConfigError, match="c must be"):
        get_stopping_rule("runner-up", c=0.5)


def _one_at_a_time(rule: RunnerUpRule | MixtureRule, draws: list[int]) -> tuple[int, bool]:
    counts = [0] * 6
    k = 0
    for d in draws:
        decision = rule.decide(counts)
        if decision.stop:
            return k, decision.certified
        counts[d] += 1
        k += 1
    decision = rule.decide(counts)
    return k, decision.certified


@settings(max_examples=200, deadline=None)
@given(
    draws=st.lists(st.integers(0, 5), min_size=20, max_size=20),
    name=st.sampled_from(["runner-up", "mixture", "hoeffding"]),
)
def test_futility_certifies_exactly_the_same_items(draws: list[int], name: str) -> None:
    plain = get_stopping_rule(name, k0=3, k_max=20, delta=DELTA)
    futile = get_stopping_rule(name, k0=3, k_max=20, delta=DELTA, futility=True)
    k_plain, cert_plain = _one_at_a_time(plain, draws)  # type: ignore[arg-type]
    k_futile, cert_futile = _one_at_a_time(futile, draws)  # type: ignore[arg-type]
    assert cert_plain == cert_futile
    if cert_plain:
        assert k_plain == k_futile
    else:
        assert k_futile <= k_plain == 20


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 8), min_size=1, max_size=6))
def test_a_futility_stop_means_no_continuation_could_certify(counts: list[int]) -> None:
    rule = RunnerUpRule(k0=3, k_max=20, delta=DELTA, futility=True)
    k = sum(counts)
    if k > 20:
        return
    decision = rule.decide(counts)
    if not (decision.stop and not decision.certified) or k >= 20:
        return
    # Brute force: give every remaining draw to any one class, or split between two.
    room = 20 - k
    for i in range(len(counts)):
        for j in range(len(counts)):
            for a in range(room + 1):
                c = list(counts)
                c[i] += a
                c[j] += room - a
                assert not rule.certified(c), (counts, c)


def test_runner_up_with_c2_stays_below_delta_on_long_exact_ties() -> None:
    """c = 2 covers the two ways an exact two-way tie can be certified (a or b)."""
    rule = RunnerUpRule(k0=3, k_max=400, delta=DELTA, c=2.0)
    for i, dist in enumerate([(0.5, 0.5), (0.35, 0.35, *(0.03,) * 10)]):
        result = run_stopping_trials(rule, dist, 1500, np.random.default_rng([7, i]))
        # 1500 trials: a true rate of delta would exceed 0.045 with probability > 0.8.
        assert result.wrong_mode_rate <= 0.045, (dist, result.wrong_mode_rate)


def test_real_answer_distributions_save_at_least_35_percent() -> None:
    items = load_answer_file(ANSWERS)
    assert len(items) >= 40
    result = run_real_stopping(items, reps=30, seed=3)
    fixed = result.row("fixed", False)
    default = result.row("runner-up", True)
    without = result.row("runner-up", False)
    assert fixed.calls_per_item == 20 and fixed.certified == 0
    assert default.calls_per_item <= 0.65 * 20
    assert default.wrong_mode <= DELTA
    # futility certifies the same items (same share up to replay noise) with fewer calls
    assert abs(default.certified - without.certified) <= 0.03
    assert default.calls_per_item < without.calls_per_item - 1.5
    # and costs at most a little top-answer accuracy
    assert fixed.top_accuracy - default.top_accuracy <= 0.03
    assert math.isclose(fixed.top_accuracy, result.mode_accuracy, abs_tol=0.03)


def test_cli_real_and_alarm(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from monitor.app.cli import main

    assert main(["simulate", "stopping", "--real", str(ANSWERS), "--trials", "5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {(r["rule"], r["futility"]): r for r in doc["rows"]}
    assert rows[("fixed", False)]["calls_per_item"] == 20
    assert rows[("runner-up", True)]["savings"] > 0.3
    assert rows[("truncated", True)]["savings"] > 0.4
    assert main(["simulate", "alarm", "--streams", "20", "--horizon", "300", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["rule"] for r in doc["false_alarms"]} == {
        "e-detector",
        "lower bound",
        "fixed window",
        "lower bound, full window",
    }
    assert main(["simulate", "stopping", "--real", "/nonexistent.json"]) == 2
    assert "cannot read answer file" in capsys.readouterr().err
    # --real-prefix: only the capital questions (30 of the 48 items).
    args = ["simulate", "stopping", "--real", str(ANSWERS), "--trials", "2", "--json"]
    assert main([*args, "--real-prefix", "capital-"]) == 0
    assert json.loads(capsys.readouterr().out)["items"] == 30
    assert main([*args, "--real-prefix", "nothing-"]) == 2
    assert "no item id" in capsys.readouterr().err
