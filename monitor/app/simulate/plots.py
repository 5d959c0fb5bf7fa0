"""PNG plots of the synthetic experiments (needs the optional matplotlib extra).

matplotlib is imported inside the functions, so the rest of relmon works without it.
Figures are drawn on the Agg canvas directly (no pyplot, no global backend state).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from monitor.app.simulate.experiments import (
    CanonResult,
    CoverageResult,
    EntropyResult,
    SetSizeResult,
    StoppingGridResult,
    StoppingResult,
    VarianceResult,
)
from monitor.app.simulate.sequential import describe_distribution
from monitor.core.errors import ConfigError

__all__ = ["plot"]


def _figure(width: float = 6.0, height: float = 4.5) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 (optional extra)
        from matplotlib.figure import Figure  # noqa: PLC0415 (optional extra, imported on use)
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'relmon[plot]'") from None
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, outdir: Path, name: str) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / name
    fig.savefig(path, dpi=110)
    return path


def _coverage(r: CoverageResult, outdir: Path) -> Path:
    fig = _figure()
    ax = fig.add_subplot()
    targets = sorted({c.target for c in r.cells})
    ax.plot(targets, targets, "k--", lw=1, label="target (diagonal)")
    for p in dict.fromkeys(c.p_star for c in r.cells):
        cells = sorted((c for c in r.cells if c.p_star == p), key=lambda c: c.target)
        x = [c.target for c in cells]
        y = [c.coverage_mean for c in cells]
        err = [
            [c.coverage_mean - c.coverage_min for c in cells],
            [c.coverage_max - c.coverage_mean for c in cells],
        ]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=f"p* = {p:g}")
    ax.set_xlabel(r"target coverage $1-\alpha$")
    ax.set_ylabel("empirical coverage (mean, min-max over reps)")
    ax.set_title(f"Coverage, n_cal={r.n_cal}, K={r.k}, {r.reps} reps")
    ax.legend()
    return _save(fig, outdir, "coverage.png")


def _variance(r: VarianceResult, outdir: Path) -> Path:
    fig = _figure()
    ax = fig.add_subplot()
    ax.set_yscale("log")
    for i, p in enumerate(dict.fromkeys(c.p_star for c in r.cells)):
        cells = [c for c in r.cells if c.p_star == p]
        color = f"C{i}"
        pos = [c for c in cells if c.mode_error > 0]  # a log axis cannot show 0
        ax.plot(
            [c.k for c in pos], [c.mode_error for c in pos], "o-", color=color, label=f"p* = {p:g}"
        )
        ax.plot(
            [c.k for c in cells],
            [c.bound for c in cells],
            "--",
            color=color,
            label=f"Hoeffding, p* = {p:g}",
        )
    ax.set_xlabel("K (answers per item)")
    ax.set_ylabel("mode error")
    ax.set_title(f"Mode error vs K ({r.trials} trials per point)")
    ax.legend(fontsize="small")
    return _save(fig, outdir, "variance.png")


def _setsize(r: SetSizeResult, outdir: Path) -> Path:
    fig = _figure()
    ax = fig.add_subplot()
    for a in dict.fromkeys(c.alpha for c in r.cells):
        cells = sorted((c for c in r.cells if c.alpha == a), key=lambda c: c.p_star)
        m = [c.m_star_median if math.isfinite(c.m_star_median) else math.nan for c in cells]
        ax.step(
            [c.p_star for c in cells],
            m,
            where="mid",
            marker="o",
            label=rf"median $M^*$, $\alpha$={a:g}",
        )
        ax.plot(
            [c.p_star for c in cells],
            [c.set_size_mean for c in cells],
            ":",
            label=rf"mean |S|, $\alpha$={a:g}",
        )
    ax.set_xlabel("agent quality p*")
    ax.set_ylabel(r"$M^*$ (infinite values not drawn)")
    ax.set_title(f"Set size vs agent quality (n_cal={r.n_cal}, K={r.k})")
    ax.legend()
    return _save(fig, outdir, "setsize.png")


def _entropy(r: EntropyResult, outdir: Path) -> Path:
    fig = _figure(10.0, 4.5)
    for i, (name, sizes, rho) in enumerate(
        [("rank", r.size_rank, r.r_rank), ("cumprob", r.size_cumprob, r.r_cumprob)]
    ):
        ax = fig.add_subplot(1, 2, i + 1)
        ax.scatter(r.entropy, sizes, s=6, alpha=0.25)
        ax.set_xlabel("consensus entropy H(x) (nats)")
        ax.set_ylabel("|S(x)|")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"{name} score: r = {rho:.3f}")
    return _save(fig, outdir, "entropy.png")


def _canon(r: CanonResult, outdir: Path) -> Path:
    fig = _figure()
    ax = fig.add_subplot()
    ax.plot(r.ks, r.raw_error, "o-", label=f"raw strings (p_raw = {r.p_raw:g})")
    ax.plot(r.ks, r.canon_error, "s-", label=f"canonicalized (p_canon = {r.p_canon:g})")
    ax.plot(r.ks, r.bounds(), "k--", lw=1, label="Hoeffding bound at p_canon")
    ax.set_xlabel("K (answers per item)")
    ax.set_ylabel("mode error")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Canonicalization ({r.trials} trials per point)")
    ax.legend()
    return _save(fig, outdir, "canon.png")


def _stopping(r: StoppingResult, outdir: Path) -> Path:
    fig = _figure()
    ax = fig.add_subplot()
    results = [r] if r.compare is None else [r, r.compare]
    width = 0.8 / len(results)
    for i, res in enumerate(results):
        frac = res.samples_fraction()
        x = [k + (i - (len(results) - 1) / 2) * width for k in frac]
        ax.bar(
            x, list(frac.values()), width=width, label=f"{res.rule}: mean {res.mean_samples:.2f}"
        )
    ax.set_xlabel("samples used per item")
    ax.set_ylabel("fraction of items")
    ax.set_title(f"Sequential stopping, K_max={r.k_max}, delta={r.delta:g}")
    ax.legend()
    return _save(fig, outdir, "stopping.png")


def _stopping_grid(r: StoppingGridResult, outdir: Path) -> Path:
    fig = _figure(11.0, 5.0)
    ax = fig.add_subplot()
    width = 0.8 / len(r.rules)
    for i, rule in enumerate(r.rules):
        x = [j + (i - (len(r.rules) - 1) / 2) * width for j in range(len(r.rows))]
        ax.bar(x, [row.results[i].mean_samples for row in r.rows], width=width, label=rule)
    ax.set_xticks(range(len(r.rows)))
    ax.set_xticklabels(
        [describe_distribution(row.dist) for row in r.rows],
        rotation=60,
        ha="right",
        fontsize="small",
    )
    ax.axhline(r.k_max, color="k", lw=1, ls="--")
    ax.set_ylabel("mean samples per item")
    ax.set_title(f"Stopping grid, K_max={r.k_max}, delta={r.delta:g}")
    ax.legend()
    return _save(fig, outdir, "stopping_grid.png")


def plot(result: object, outdir: Path) -> list[Path]:
    """Write the plot(s) for ``result`` into ``outdir``; returns the paths written."""
    if isinstance(result, CoverageResult):
        return [_coverage(result, outdir)]
    if isinstance(result, VarianceResult):
        return [_variance(result, outdir)]
    if isinstance(result, SetSizeResult):
        return [_setsize(result, outdir)]
    if isinstance(result, EntropyResult):
        return [_entropy(result, outdir)]
    if isinstance(result, CanonResult):
        return [_canon(result, outdir)]
    if isinstance(result, StoppingResult):
        return [_stopping(result, outdir)]
    if isinstance(result, StoppingGridResult):
        return [_stopping_grid(result, outdir)]
    raise ConfigError(f"--plot: no plot for {type(result).__name__}")
