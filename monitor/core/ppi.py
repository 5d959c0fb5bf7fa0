"""Prediction-powered reliability: many judge labels, a few human labels, one valid bound.

An LLM judge labels every scored item ``J_i`` (1: the top answer is acceptable); human
review labels a random subset ``Y_i``, item ``i`` reviewed with a known probability
``pi_i``. Prediction-powered inference (Angelopoulos, Bates, Fannjiang, Jordan, Zrnic,
*Science* 2023) corrects the judge by what the humans saw, so the estimate stays unbiased
whatever the judge's bias. relmon uses its stratified form (Fisch et al. 2024), with the
judge's own label as the stratum:

    theta = P(J = 1) * q1 + P(J = 0) * q0,     q_j = P(Y = 1 | J = j)

``P(J = j)`` from every judged item (decay weights ``d_i``, the drift weighting of the
human level); ``q_j`` from the reviewed items the judge put in stratum ``j`` (weights
``d_i / pi_i``). Given the judge's labels, the human labels of a stratum are draws of one
Bernoulli(q_j): whatever the judge does (lenient, strict, constant, random, adversarial),
it only decides how the reviewed items are split.

**The bound** is the Clopper-Pearson bound carried over to that sum. Clopper-Pearson's
one-sided lower bound on a rate with ``x`` successes of ``n`` is the ``delta``-quantile of
Beta(x, n - x + 1): the successes, plus one pseudo-failure. Here

    lower = delta-quantile of  P1 * B1 + (1 - P1) * B0,
            B_j ~ Beta(x_j, n_j - x_j + c_j),  P1 ~ Beta(m1 + 1/2, m0 + 1/2)

with effective (Kish) counts ``n_j``, ``x_j`` per stratum and ``m_j`` of judged items
(Jeffreys for the uncertainty of P(J = 1)). There is **one** pseudo-failure, shared
between the strata: a whole one each would put the weight of several on theta and make
the bound looser than the human-only one with a judge that tells nothing. Stratum ``j``
gets ``c_j = P_j``: the total weight on theta, ``sum_j P_j c_j / n_j = sum_j P_j^2 /
n_j``, is then ``1 / n_eff`` of the stratified estimate, what Clopper-Pearson's
pseudo-failure weighs on a rate of ``n_eff`` items (the "mean weight" form of Fay and
Feuer's bound for weighted sums of counts, Tiwari et al. 2006). When the strata's
variances say the estimate is noisier than ``n_eff`` items (``1 / n*`` > ``1 / n_eff``,
``n*`` the sample size whose binomial variance is the stratified estimate's, from rates
smoothed by half a success and half a failure: reviews drawn far from proportion, a
small noisy stratum carrying most of the variance), the extra weight goes to the strata
in proportion to their part of that variance, each ``c_j`` at most 1, as a stratum's
own Clopper-Pearson bound would have (``_pseudo_failure_parts``). So:

- a judge that says the same to everything leaves one stratum: the bound *is* the
  human-only Clopper-Pearson bound of the same reviews;
- a judge whose labels carry no information splits the reviews in proportion, and the
  sum of two Betas with the shared pseudo-failure is, within Monte Carlo error, the
  pooled one: the bound falls back to the human labels (power tuning);
- a good judge leaves strata with small variances: the bound is tighter;
- a stratum with no reviewed item, or none acceptable, contributes 0 (nothing certain).

Coverage is not proved in closed form; it is measured on a grid of judges (lenient,
strict, constant, anti-correlated, random, good), levels, inclusion probabilities and
30-300 reviews, 2,000 seeds a cell (``bench/ppi_bench.py``, ``tests/test_ppi.py``). The
quantile is taken over :data:`DRAWS` draws of a generator with a fixed seed, so every
replica computes the same bound from the same labels.

The estimate is published from :data:`MIN_REVIEWS` effective reviewed items. Like the
human level, the estimate and the bound are scaled by ``W / (W + w*)`` when a test
weight ``w*`` is given: after a long pause without verdicts they fall with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from monitor.core.conformal import effective_sample_size, reliability_lower_bound
from monitor.core.errors import ConfigError, InputError

__all__ = ["DRAWS", "MIN_REVIEWS", "PPIEstimate", "ppi_reliability"]

MIN_REVIEWS = 30
"""Effective reviewed items needed before a prediction-powered estimate is published."""

DRAWS = 20_000
"""Monte Carlo draws of the bound's distribution: between seeds, the bound moves by
about 0.5% of its distance under the estimate (measured, tests/test_ppi.py)."""

SEED = 20261127
"""The draws' fixed seed: the bound is a function of the labels only."""

MIN_SHARE = 1e-3
"""The smallest part of the pseudo-failure a stratum gets (a Beta needs b > 0)."""


@dataclass(frozen=True, slots=True)
class PPIEstimate:
    level: float
    """The prediction-powered estimate of P(top answer acceptable)."""
    lower_bound: float
    """One-sided lower confidence bound at 1 - delta."""
    judge_positive: float
    """Weighted share of judged items the judge called acceptable, P(J = 1)."""
    std_error: float
    n_judged: float
    """Effective number of judged items (Kish)."""
    n_reviewed: float
    """Effective number of reviewed items (Kish, inclusion weights included)."""
    agreement: float
    """Weighted share of reviewed items where judge and human agree."""


def _binary(name: str, values: ArrayLike) -> np.ndarray:
    a = np.asarray(values, dtype=float).ravel()
    if not np.isin(a, (0.0, 1.0)).all():
        raise InputError(f"{name} must hold 0/1 labels")
    return a


def _weights(name: str, values: ArrayLike, size: int) -> np.ndarray:
    w = np.asarray(values, dtype=float).ravel()
    if w.shape != (size,):
        raise InputError(f"{name} must have one weight per label ({size})")
    if not np.isfinite(w).all() or (w < 0).any():
        raise InputError(f"{name} must be finite and >= 0")
    return w


@dataclass(frozen=True, slots=True)
class _Stratum:
    """The reviewed items of one judge stratum, as effective (Kish) counts."""

    n: float
    successes: float

    @classmethod
    def of(cls, y: np.ndarray, w: np.ndarray) -> _Stratum:
        total = float(w.sum())
        if total <= 0:
            return cls(0.0, 0.0)
        n = effective_sample_size(w)
        return cls(n, float(w @ y) / total * n)

    @property
    def rate(self) -> float | None:
        return self.successes / self.n if self.n > 0 else None

    def variance(self, weight: float) -> float:
        """This stratum's part of the stratified estimate's variance, from its rate
        smoothed by half a success and half a failure (never 0 for a few reviews)."""
        if self.n <= 0:
            return 0.0
        q = (self.successes + 0.5) / (self.n + 1.0)
        return weight * weight * q * (1.0 - q) / self.n

    def draws(self, part: float, rng: np.random.Generator) -> np.ndarray:
        """Clopper-Pearson's Beta(x, n - x + c) with the stratum's part ``c`` of the
        pseudo-failure; 0 (nothing certain) with no reviewed or no acceptable item."""
        if self.n <= 0 or self.successes <= 0:
            return np.zeros(DRAWS)
        failures = max(self.n - self.successes, 0.0)
        return rng.beta(self.successes, failures + max(part, MIN_SHARE), DRAWS)


def _pseudo_failure_parts(
    weights: tuple[float, float], strata: tuple[_Stratum, _Stratum]
) -> tuple[float, float]:
    """Each stratum's part ``c_j`` of the one pseudo-failure (module docstring): ``P_j``,
    plus its share of the extra weight when the strata's variances make the estimate
    noisier than ``1 / n_eff`` says, at most 1."""
    filled = [(p, s) for p, s in zip(weights, strata, strict=True) if p > 0 and s.n > 0]
    total = sum(s.variance(p) for p, s in filled)
    if total <= 0:
        return weights
    level = sum(p * (s.successes + 0.5) / (s.n + 1.0) for p, s in filled)
    base = sum(p * p / s.n for p, s in filled)
    extra = max(0.0, total / (level * (1.0 - level)) - base)
    parts = []
    for p, s in zip(weights, strata, strict=True):
        if p <= 0 or s.n <= 0:
            parts.append(p)
            continue
        parts.append(min(1.0, p + extra * s.variance(p) / total * s.n / p))
    return parts[0], parts[1]


def ppi_reliability(
    judged: ArrayLike,
    judged_weights: ArrayLike,
    human: ArrayLike,
    human_judge: ArrayLike,
    human_weights: ArrayLike,
    *,
    delta: float,
    test_weight: float | None = None,
    min_reviews: float = MIN_REVIEWS,
) -> PPIEstimate | None:
    """The prediction-powered level and lower bound; None below ``min_reviews``.

    ``judged``/``judged_weights``: the judge label and decay weight of every judged item.
    ``human``/``human_judge``/``human_weights``: for each reviewed item, the human label,
    the judge's label and ``d_i / pi_i``.
    """
    if not 0.0 < delta < 1.0:
        raise ConfigError("delta must be in (0, 1)")
    j_all, y = _binary("judged", judged), _binary("human", human)
    j_rev = _binary("human_judge", human_judge)
    d = _weights("judged_weights", judged_weights, j_all.size)
    w = _weights("human_weights", human_weights, y.size)
    if j_rev.size != y.size:
        raise InputError("human and human_judge must have one label per reviewed item")
    if test_weight is not None and test_weight < 0:
        raise InputError("test_weight must be >= 0")
    n_reviewed = effective_sample_size(w)
    big_d = float(d.sum())
    if big_d <= 0 or n_reviewed < min_reviews:
        return None
    p1 = float(d @ j_all) / big_d
    yes, no = (_Stratum.of(y[j_rev == s], w[j_rev == s]) for s in (1.0, 0.0))
    overall = float(w @ y) / float(w.sum())
    level = p1 * _or(yes.rate, overall) + (1.0 - p1) * _or(no.rate, overall)
    sums = _bound_draws(p1, effective_sample_size(d), yes, no)
    if p1 in (0.0, 1.0):  # one stratum: exactly the human-only Clopper-Pearson bound
        only = yes if p1 == 1.0 else no
        bound = reliability_lower_bound(min(only.successes, only.n), only.n, delta)
    else:
        bound = float(np.quantile(sums, delta))
    factor = 1.0 if test_weight is None else float(w.sum()) / (float(w.sum()) + test_weight)
    level = float(np.clip(level, 0.0, 1.0)) * factor
    bound = float(np.clip(bound, 0.0, 1.0)) * factor
    return PPIEstimate(
        level=level,
        lower_bound=min(bound, level),
        judge_positive=p1,
        std_error=float(sums.std()),
        n_judged=effective_sample_size(d),
        n_reviewed=n_reviewed,
        agreement=float(w @ (y == j_rev)) / float(w.sum()),
    )


def _bound_draws(p1: float, n_judged: float, yes: _Stratum, no: _Stratum) -> np.ndarray:
    """Draws of P1 * B1 + (1 - P1) * B0 (module docstring), from a fixed seed. With one
    stratum empty of judged items, P(J = j) is exactly 0 or 1 and is not drawn."""
    rng = np.random.default_rng(SEED)
    if 0.0 < p1 < 1.0:
        m1 = p1 * n_judged
        share = rng.beta(m1 + 0.5, n_judged - m1 + 0.5, DRAWS)
    else:
        share = np.full(DRAWS, p1)
    c1, c0 = _pseudo_failure_parts((p1, 1.0 - p1), (yes, no))
    sums: np.ndarray = share * yes.draws(c1, rng) + (1.0 - share) * no.draws(c0, rng)
    return sums


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
