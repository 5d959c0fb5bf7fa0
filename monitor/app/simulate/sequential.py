"""Sequential-stopping experiments: samples saved and wrong modes certified (paper §9).

:func:`run_stopping` runs a stream of items drawn from one or more answer
distributions (mixed in given proportions) under one rule, optionally next to the
paper's ``hoeffding`` rule on the same random numbers. :func:`run_stopping_grid` runs a
fixed validation grid (unanimous, clear, near ties, exact ties, long tails) under the
chosen rule and ``hoeffding``. Distribution ``i`` always gets the generator
``default_rng([seed, i])``, so results are reproducible and the rules compared on the
same draws. Pure: nothing is printed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby

import numpy as np

from monitor.app.simulate.stopping import StoppingTrials, run_stopping_trials
from monitor.app.simulate.tables import fmt, format_table
from monitor.core.errors import ConfigError
from monitor.core.stopping import DEFAULT_RULE, StoppingRule, get_stopping_rule

__all__ = [
    "GRID",
    "GridRow",
    "StoppingGridResult",
    "StoppingResult",
    "describe_distribution",
    "make_rule",
    "run_stopping",
    "run_stopping_grid",
]

GRID: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("unanimous", (1.0,)),
    ("clear", (0.9, 0.1)),
    ("clear", (0.8, 0.2)),
    ("clear", (0.7, 0.2, 0.1)),
    ("near tie", (0.6, 0.4)),
    ("near tie", (0.55, 0.45)),
    ("near tie", (0.52, 0.48)),
    ("near tie", (0.45, 0.4, 0.15)),
    ("exact tie", (0.5, 0.5)),
    ("exact tie", (0.4, 0.4, 0.2)),
    ("exact tie", (1 / 3,) * 3),
    ("exact tie", (0.25,) * 4),
    ("long tail", (0.5, *(0.05,) * 10)),
    ("long tail", (0.3, *(0.07,) * 10)),
    ("long tail", (0.6, *(0.02,) * 20)),
    ("long tail", (0.8, *(0.02,) * 10)),
    ("tie + tail", (0.35, 0.35, *(0.03,) * 10)),
)
"""The validation grid: (kind, distribution)."""

COMPARE_RULE = "hoeffding"
PREVIOUS_DEFAULT = "runner-up"


def make_rule(
    name: str,
    *,
    k0: int,
    k_max: int,
    delta: float,
    point_mass: float | None = None,
    strict: bool = False,
    futility: bool = False,
    c: float | None = None,
) -> StoppingRule:
    """The named rule; ``point_mass``/``strict``/``futility``/``c`` passed only when set."""
    options: dict[str, object] = {"k0": k0, "k_max": k_max, "delta": delta}
    if point_mass is not None:
        options["point_mass"] = point_mass
    if strict:
        options["strict"] = True
    if futility:
        options["futility"] = True
    if c is not None:
        options["c"] = c
    return get_stopping_rule(name, **options)


def describe_distribution(dist: Sequence[float]) -> str:
    """``(0.5, 0.05, ..., 0.05)`` → ``"0.5+0.05x10"``."""
    parts = []
    for value, run in groupby(round(float(p), 4) for p in dist):
        n = len(list(run))
        parts.append(f"{value:.3g}" + (f"x{n}" if n > 1 else ""))
    return "+".join(parts)


def _check_dist(dist: Sequence[float]) -> tuple[float, ...]:
    p = np.asarray(dist, dtype=float)
    if p.size == 0 or not np.isfinite(p).all() or (p <= 0).any():
        raise ConfigError(f"probabilities must be positive numbers: {list(dist)}")
    if abs(p.sum() - 1.0) > 1e-6:
        raise ConfigError(f"probabilities must sum to 1, got {p.sum():g}")
    return tuple(float(x) for x in p / p.sum())


def _check_weights(weights: Sequence[float] | None, n: int) -> tuple[float, ...]:
    if weights is None:
        return (1.0 / n,) * n
    w = np.asarray(weights, dtype=float)
    if w.size != n:
        raise ConfigError(f"{w.size} weights for {n} distributions")
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ConfigError("weights must be >= 0 and not all 0")
    return tuple(float(x) for x in w / w.sum())


def _trials_dict(t: StoppingTrials, k_max: int) -> dict[str, object]:
    return {**t.as_dict(), "savings": 1.0 - t.mean_samples / k_max}


@dataclass(frozen=True, slots=True)
class StoppingResult:
    """One rule on a stream mixing ``dists`` in proportions ``weights``."""

    rule: str
    k0: int
    k_max: int
    delta: float
    trials: int
    point_mass: float | None
    strict: bool
    dists: tuple[tuple[float, ...], ...]
    weights: tuple[float, ...]
    per_dist: tuple[StoppingTrials, ...]
    compare: StoppingResult | None = None

    def _mix(self, values: Iterable[float]) -> float:
        return float(sum(w * v for w, v in zip(self.weights, values, strict=True)))

    @property
    def mean_samples(self) -> float:
        return self._mix(t.mean_samples for t in self.per_dist)

    @property
    def wrong_mode_rate(self) -> float:
        return self._mix(t.wrong_mode_rate for t in self.per_dist)

    @property
    def stopped_rate(self) -> float:
        return self._mix(t.stopped_rate for t in self.per_dist)

    @property
    def savings(self) -> float:
        return 1.0 - self.mean_samples / self.k_max

    def samples_fraction(self) -> dict[int, float]:
        """The stream's distribution of samples used per item."""
        out: dict[int, float] = {}
        for w, t in zip(self.weights, self.per_dist, strict=True):
            for k, n in t.samples_histogram.items():
                out[k] = out.get(k, 0.0) + w * n / t.trials
        return dict(sorted(out.items()))

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "rule": self.rule,
            "k_max": self.k_max,
            "delta": self.delta,
            "k0": self.k0,
            "trials": self.trials,
            "mean_samples": self.mean_samples,
            "wrong_mode_rate": self.wrong_mode_rate,
            "stopped_rate": self.stopped_rate,
            "savings": self.savings,
            "point_mass": self.point_mass,
            "strict": self.strict,
            "dists": [list(d) for d in self.dists],
            "weights": list(self.weights),
            "samples_fraction": {str(k): v for k, v in self.samples_fraction().items()},
        }
        if len(self.dists) > 1:
            out["per_dist"] = [
                {"dist": list(d), "weight": w, **_trials_dict(t, self.k_max)}
                for d, w, t in zip(self.dists, self.weights, self.per_dist, strict=True)
            ]
        if self.compare is not None:
            out["compare"] = self.compare.as_dict()
        return out

    def table(self) -> str:
        results = [self] if self.compare is None else [self, self.compare]
        rows = []
        for r in results:
            for d, w, t in zip(r.dists, r.weights, r.per_dist, strict=True):
                rows.append(
                    [
                        r.rule,
                        describe_distribution(d),
                        fmt(w, 3),
                        fmt(t.mean_samples, 2),
                        fmt(1.0 - t.mean_samples / r.k_max, 3),
                        fmt(t.wrong_mode_rate, 5),
                        fmt(t.stopped_rate, 4),
                    ]
                )
            if len(r.dists) > 1:
                rows.append(
                    [
                        r.rule,
                        "stream (weighted)",
                        "1",
                        fmt(r.mean_samples, 2),
                        fmt(r.savings, 3),
                        fmt(r.wrong_mode_rate, 5),
                        fmt(r.stopped_rate, 4),
                    ]
                )
        head = ["rule", "dist", "weight", "mean K", "savings", "wrong mode", "stopped"]
        title = (
            f"stopping: k0={self.k0} K_max={self.k_max} delta={self.delta:g}"
            f" trials={self.trials} per distribution"
        )
        return format_table(head, rows, title)


def _run_streams(
    rule: StoppingRule, dists: Sequence[tuple[float, ...]], trials: int, seed: int
) -> tuple[StoppingTrials, ...]:
    return tuple(
        run_stopping_trials(rule, d, trials, np.random.default_rng([seed, i]))
        for i, d in enumerate(dists)
    )


def _check_trials(trials: int) -> None:
    if trials < 1:
        raise ConfigError(f"trials must be >= 1, got {trials}")


def run_stopping(
    dists: Sequence[Sequence[float]],
    *,
    weights: Sequence[float] | None = None,
    rule: str = DEFAULT_RULE,
    k0: int = 3,
    k_max: int = 20,
    delta: float = 0.05,
    point_mass: float | None = None,
    strict: bool = False,
    futility: bool = False,
    c: float | None = None,
    trials: int = 5000,
    seed: int = 0,
    compare: bool = False,
) -> StoppingResult:
    """``trials`` items per distribution under ``rule`` (and ``hoeffding`` if ``compare``)."""
    _check_trials(trials)
    if not dists:
        raise ConfigError("give at least one distribution")
    ds = tuple(_check_dist(d) for d in dists)
    ws = _check_weights(weights, len(ds))
    main_rule = make_rule(
        rule,
        k0=k0,
        k_max=k_max,
        delta=delta,
        point_mass=point_mass,
        strict=strict,
        futility=futility,
        c=c,
    )
    other = None
    if compare:
        base = make_rule(COMPARE_RULE, k0=k0, k_max=k_max, delta=delta)
        other = StoppingResult(
            COMPARE_RULE,
            k0,
            k_max,
            delta,
            trials,
            None,
            False,
            ds,
            ws,
            _run_streams(base, ds, trials, seed),
        )
    return StoppingResult(
        main_rule.name,
        k0,
        k_max,
        delta,
        trials,
        point_mass,
        strict,
        ds,
        ws,
        _run_streams(main_rule, ds, trials, seed),
        other,
    )


@dataclass(frozen=True, slots=True)
class GridRow:
    kind: str
    dist: tuple[float, ...]
    results: tuple[StoppingTrials, ...]  # one per rule, in StoppingGridResult.rules order


@dataclass(frozen=True, slots=True)
class StoppingGridResult:
    """The validation grid under each rule in ``rules``."""

    rules: tuple[str, ...]
    rows: tuple[GridRow, ...]
    k0: int
    k_max: int
    delta: float
    trials: int

    def over_delta(self, t: StoppingTrials) -> bool:
        """Above delta beyond sampling noise: by more than 3 standard errors of a rate of
        delta over ``trials`` (a rule that spends all of delta at the exact tie, as
        ``truncated`` does, scatters around delta there)."""
        return t.wrong_mode_rate > self.delta + 3.0 * math.sqrt(
            self.delta * (1.0 - self.delta) / self.trials
        )

    @property
    def any_over_delta(self) -> bool:
        return any(self.over_delta(t) for row in self.rows for t in row.results)

    def as_dict(self) -> dict[str, object]:
        return {
            "experiment": "stopping_grid",
            "rules": list(self.rules),
            "k_max": self.k_max,
            "delta": self.delta,
            "k0": self.k0,
            "trials": self.trials,
            "any_over_delta": self.any_over_delta,
            "mean_samples": {
                rule: float(np.mean([row.results[i].mean_samples for row in self.rows]))
                for i, rule in enumerate(self.rules)
            },
            "rows": [
                {
                    "kind": row.kind,
                    "dist": list(row.dist),
                    "results": {
                        rule: {**_trials_dict(t, self.k_max), "over_delta": self.over_delta(t)}
                        for rule, t in zip(self.rules, row.results, strict=True)
                    },
                }
                for row in self.rows
            ],
        }

    def table(self) -> str:
        head = ["kind", "dist"]
        for rule in self.rules:
            head += [f"{rule}: mean K", "wrong", "stopped"]
        rows = []
        for row in self.rows:
            cells = [row.kind, describe_distribution(row.dist)]
            for t in row.results:
                mark = " !" if self.over_delta(t) else "  "
                cells += [
                    fmt(t.mean_samples, 2),
                    fmt(t.wrong_mode_rate, 5) + mark,
                    fmt(t.stopped_rate, 4),
                ]
            rows.append(cells)
        title = (
            f"stopping grid: k0={self.k0} K_max={self.k_max} delta={self.delta:g}"
            f" trials={self.trials} per cell ('!' marks a wrong-mode rate above delta by"
            " more than 3 standard errors)"
        )
        verdict = (
            "SOME WRONG-MODE RATES ARE ABOVE DELTA"
            if self.any_over_delta
            else f"every wrong-mode rate is at most delta={self.delta:g}"
        )
        return f"{format_table(head, rows, title)}\n{verdict}"


def run_stopping_grid(
    *,
    rule: str = DEFAULT_RULE,
    k0: int = 3,
    k_max: int = 20,
    delta: float = 0.05,
    point_mass: float | None = None,
    strict: bool = False,
    futility: bool = False,
    c: float | None = None,
    trials: int = 20000,
    seed: int = 0,
) -> StoppingGridResult:
    """:data:`GRID` under ``rule``, ``runner-up`` (the previous default, with the same
    futility setting) and ``hoeffding``, on the same draws."""
    _check_trials(trials)
    rules = [
        make_rule(
            rule,
            k0=k0,
            k_max=k_max,
            delta=delta,
            point_mass=point_mass,
            strict=strict,
            futility=futility,
            c=c,
        )
    ]
    if rules[0].name not in (PREVIOUS_DEFAULT, COMPARE_RULE):
        rules.append(
            make_rule(PREVIOUS_DEFAULT, k0=k0, k_max=k_max, delta=delta, futility=futility)
        )
    if rules[0].name != COMPARE_RULE:
        rules.append(make_rule(COMPARE_RULE, k0=k0, k_max=k_max, delta=delta))
    dists = [d for _, d in GRID]
    per_rule = [_run_streams(r, dists, trials, seed) for r in rules]
    rows = tuple(
        GridRow(kind, dist, tuple(res[i] for res in per_rule))
        for i, (kind, dist) in enumerate(GRID)
    )
    return StoppingGridResult(tuple(r.name for r in rules), rows, k0, k_max, delta, trials)
