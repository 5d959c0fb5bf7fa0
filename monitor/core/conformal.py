"""Split-conformal thresholds and the reliability level, plain and weighted (docs/method.md).

Plain (exchangeable) form, from ``n`` calibration scores:

* ``k = ceil((n + 1)(1 - alpha))``; the threshold ``M*`` is the k-th smallest score and
  **``inf`` when k > n** (never clamped: a clamped quantile under-covers whenever
  ``n < 1/alpha - 1``).
* reliability level ``1 - alpha* = #{s_i <= 1} / (n + 1)`` (paper Definition 2.4).

Weighted form (drift, unequal inclusion probabilities; Tibshirani et al. 2019, Barber et
al. 2023): calibration weights ``w_i`` and a test weight ``w*`` normalised together,
``p_i = w_i / (sum w + w*)``; the threshold is the smallest score ``v`` with
``sum_{s_i <= v} p_i >= 1 - alpha``, the test mass ``p*`` sitting at ``inf``. With all
weights equal it is exactly the plain form.

Comparisons of a cumulative mass against ``1 - alpha`` allow a relative slack of
:data:`MASS_TOLERANCE` so that ``(n+1)(1-alpha)`` landing on an integer is not pushed to
the next order statistic by floating-point noise (``100 * (1 - 0.1)`` and friends).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from monitor.core.errors import ConfigError, InputError

__all__ = [
    "MASS_TOLERANCE",
    "AdaptiveAlpha",
    "aci_update",
    "conformal_threshold",
    "conformal_thresholds",
    "decay_weights",
    "effective_sample_size",
    "inclusion_weights",
    "quantile_index",
    "reliability_level",
    "reliability_lower_bound",
    "weighted_reliability_level",
    "weighted_reliability_lower_bound",
    "weighted_threshold",
]

MASS_TOLERANCE = 1e-10


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"alpha must be in (0, 1), got {alpha!r}")


def _scores(scores: ArrayLike) -> np.ndarray:
    s = np.asarray(scores, dtype=float).ravel()
    if np.isnan(s).any():
        raise InputError("scores must not be NaN")
    return s


def quantile_index(n: int, alpha: float) -> int:
    """k = ceil((n + 1)(1 - alpha)), the 1-based order statistic used as threshold."""
    _check_alpha(alpha)
    if n < 0:
        raise ConfigError("n must be >= 0")
    target = (n + 1) * (1.0 - alpha)
    return math.ceil(target - MASS_TOLERANCE * (n + 1))


def conformal_threshold(scores: ArrayLike, alpha: float) -> float:
    """M*: the k-th smallest score, ``inf`` when k > n (including n = 0)."""
    s = _scores(scores)
    k = quantile_index(s.size, alpha)
    if k > s.size:
        return math.inf
    return float(np.partition(s, k - 1)[k - 1])


def conformal_thresholds(scores: ArrayLike, alphas: Iterable[float]) -> dict[float, float]:
    """M* for each alpha, sorting the scores once."""
    s = np.sort(_scores(scores))
    out: dict[float, float] = {}
    for alpha in alphas:
        k = quantile_index(s.size, alpha)
        out[alpha] = math.inf if k > s.size else float(s[k - 1])
    return out


def reliability_level(scores: ArrayLike) -> float:
    """1 - alpha* = #{s_i <= 1} / (n + 1)."""
    s = _scores(scores)
    return float(np.count_nonzero(s <= 1.0)) / (s.size + 1)


def _weights(scores: np.ndarray, weights: ArrayLike, test_weight: float) -> np.ndarray:
    w = np.asarray(weights, dtype=float).ravel()
    if w.shape != scores.shape:
        raise InputError(f"{w.size} weights for {scores.size} scores")
    if not (np.isfinite(w).all() and (w >= 0).all()):
        raise InputError("weights must be finite and >= 0")
    if not (math.isfinite(test_weight) and test_weight > 0):
        raise ConfigError("test_weight must be finite and > 0")
    return w


def weighted_threshold(
    scores: ArrayLike, weights: ArrayLike, alpha: float, test_weight: float = 1.0
) -> float:
    """Smallest score v with sum_{s_i <= v} p_i >= 1 - alpha; ``inf`` if there is none."""
    _check_alpha(alpha)
    s = _scores(scores)
    w = _weights(s, weights, test_weight)
    total = w.sum() + test_weight
    order = np.argsort(s, kind="stable")
    s_sorted, mass = s[order], np.cumsum(w[order]) / total
    # Only the last of equal scores carries their whole mass.
    last = np.append(s_sorted[1:] != s_sorted[:-1], True) if s.size else np.zeros(0, bool)
    hit = np.flatnonzero(last & (mass >= (1.0 - alpha) - MASS_TOLERANCE))
    return float(s_sorted[hit[0]]) if hit.size else math.inf


def weighted_reliability_level(
    scores: ArrayLike, weights: ArrayLike, test_weight: float = 1.0
) -> float:
    """sum_{s_i <= 1} p_i, the test mass p* counted as a miss."""
    s = _scores(scores)
    w = _weights(s, weights, test_weight)
    return float(w[s <= 1.0].sum() / (w.sum() + test_weight))


def decay_weights(ages: ArrayLike, half_life: float) -> np.ndarray:
    """w_i = 2^(-age_i / half_life); ages in items or seconds, never negative."""
    a = np.asarray(ages, dtype=float)
    if not (math.isfinite(half_life) and half_life > 0):
        raise ConfigError("half_life must be finite and > 0")
    if (a < 0).any() or np.isnan(a).any():
        raise InputError("ages must be >= 0")
    return np.exp2(-a / half_life)


def inclusion_weights(probabilities: ArrayLike) -> np.ndarray:
    """1 / pi_i for items sent to review with probability pi_i in (0, 1]."""
    p = np.asarray(probabilities, dtype=float)
    if not ((p > 0) & (p <= 1)).all():
        raise InputError("inclusion probabilities must be in (0, 1]")
    return 1.0 / p


def effective_sample_size(weights: ArrayLike) -> float:
    """Kish's n_eff = (sum w)^2 / sum w^2; 0 for no weight at all."""
    w = np.asarray(weights, dtype=float)
    sq = float((w * w).sum())
    return float(w.sum()) ** 2 / sq if sq > 0 else 0.0


def aci_update(alpha_t: float, alpha: float, err: bool | float, gamma: float) -> float:
    """Adaptive conformal inference (Gibbs & Candès 2021): a_{t+1} = a_t + gamma(alpha - err_t).

    ``err`` is 1 when the last test point was not covered. The result is not clipped:
    values outside (0, 1) are meaningful (an empty or a full set) and clipping would
    break the long-run coverage guarantee.
    """
    if gamma < 0:
        raise ConfigError("gamma must be >= 0")
    return alpha_t + gamma * (alpha - float(err))


@dataclass(slots=True)
class AdaptiveAlpha:
    """ACI's alpha_t kept as counts: ``steps`` updates so far, ``misses`` of them misses.

    Unrolled, the recursion of :func:`aci_update` from alpha_0 = alpha is
    alpha_t = alpha + gamma (steps * alpha - misses): a function of the two counts, not
    of the order the steps came in (each miss compares an item's score with the
    threshold stored on the item, fixed before any later step). Computing it from the
    integers gives bit-for-bit the same alpha_t whatever order the verdicts are applied
    or replayed in, which a float running sum does not.
    """

    alpha: float
    gamma: float
    steps: int = 0
    misses: int = 0

    def __post_init__(self) -> None:
        if self.gamma < 0:
            raise ConfigError("gamma must be >= 0")

    def update(self, miss: bool) -> None:
        """One ACI step: the last test point was (``miss``) or was not covered."""
        self.steps += 1
        self.misses += int(miss)

    @property
    def value(self) -> float:
        """alpha_t (not clipped, like :func:`aci_update`)."""
        return self.alpha + self.gamma * (self.steps * self.alpha - self.misses)


def reliability_lower_bound(successes: float, n: float, delta: float) -> float:
    """One-sided Clopper–Pearson lower bound on P(s <= 1) at confidence 1 - delta.

    Real-valued (effective) counts are allowed: the beta quantile is defined for them.
    """
    if not 0.0 < delta < 1.0:
        raise ConfigError("delta must be in (0, 1)")
    if n < 0 or not 0 <= successes <= n + 1e-9:
        raise InputError("need 0 <= successes <= n")
    if successes <= 0 or n <= 0:
        return 0.0
    successes = min(successes, n)
    # scipy.stats (~0.5 s, ~40 MB) is loaded here, when a bound is first computed: every
    # module that reaches this one for quantile_index (the traffic listener's own process)
    # need not load it.
    from scipy import stats  # noqa: PLC0415

    return float(stats.beta.ppf(delta, successes, n - successes + 1))


def weighted_reliability_lower_bound(
    scores: ArrayLike, weights: ArrayLike, delta: float, test_weight: float | None = None
) -> float:
    """Clopper–Pearson bound from effective counts: n_eff = (Σw)²/Σw² items, n_eff times
    the weighted rate successes.

    With the test weight w* (what the calibration window reports) the bound is capped at
    the weighted reliability level: when the items' weights have faded against w* (a
    long pause without verdicts) the level falls, and the bound falls with it.
    """
    s = _scores(scores)
    w = _weights(s, weights, 1.0 if test_weight is None else test_weight)
    total = w.sum()
    if total <= 0:
        return 0.0
    n_eff = effective_sample_size(w)
    rate = min(1.0, float(w[s <= 1.0].sum() / total))
    bound = reliability_lower_bound(rate * n_eff, n_eff, delta)
    if test_weight is not None:
        bound = min(bound, float(w[s <= 1.0].sum() / (total + test_weight)))
    return bound
