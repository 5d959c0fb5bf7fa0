"""``relmon simulate EXPERIMENT``: the paper's synthetic experiments (appendix C).

Every experiment prints a plain table (``--json`` for JSON), can write a PNG plot
(``--plot DIR``, needs matplotlib) and is reproducible from ``--seed``. Bad input is a
one-line ``relmon: error: ...`` with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from monitor.app.simulate.alarm import run_alarm
from monitor.app.simulate.drift import run_drift
from monitor.app.simulate.experiments import (
    run_canon,
    run_coverage,
    run_entropy,
    run_setsize,
    run_variance,
)
from monitor.app.simulate.plots import plot
from monitor.app.simulate.priority import MIXES, run_priority
from monitor.app.simulate.real_stopping import load_answer_file, run_real_stopping
from monitor.app.simulate.sequential import run_stopping, run_stopping_grid
from monitor.app.simulate.stopping import parse_distribution
from monitor.core.errors import ConfigError
from monitor.core.stopping import DEFAULT_FUTILITY, DEFAULT_RULE, available_rules

__all__ = ["add_simulate_parser"]


class _Result(Protocol):
    def as_dict(self) -> dict[str, object]: ...

    def table(self) -> str: ...


# --------------------------------------------------------------------------- argument types


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _open_unit(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        a = _number(text, float)
        if not 0.0 < a < 1.0:
            raise argparse.ArgumentTypeError(f"{name} must be in (0, 1), got {text}")
        return a

    return parse


_alpha = _open_unit("alpha")


def _unit(text: str) -> float:
    p = _number(text, float)
    if not 0.0 <= p <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return p


def _positive(text: str) -> int:
    n = int(_number(text, int))
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return n


def _seed(text: str) -> int:
    n = int(_number(text, int))
    if n < 0:
        raise argparse.ArgumentTypeError(f"seed must be >= 0, got {text}")
    return n


def _dist(text: str) -> list[float]:

    try:
        return [float(x) for x in parse_distribution(text)]
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _weights(text: str) -> list[float]:
    try:
        w = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not w or any(not x >= 0 for x in w) or sum(w) <= 0:
        raise argparse.ArgumentTypeError(f"weights must be >= 0 and not all 0: {text!r}")
    return w


# --------------------------------------------------------------------------- output


def _emit(result: _Result, args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, allow_nan=False))
    else:
        print(result.table())
    if args.plot is not None:
        for path in plot(result, Path(args.plot)):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _rng(args: argparse.Namespace) -> np.random.Generator:
    return np.random.default_rng(args.seed)


def _opt(args: argparse.Namespace, **names: str) -> dict[str, Any]:
    """Keyword arguments for the flags the user gave (``None`` keeps the default)."""
    out: dict[str, Any] = {}
    for key, attr in names.items():
        value = getattr(args, attr)
        if value is not None:
            out[key] = tuple(value) if isinstance(value, list) else value
    return out


# --------------------------------------------------------------------------- handlers


def _coverage(args: argparse.Namespace) -> int:

    opts = _opt(args, alphas="alpha", p_stars="p_star", n_cal="n_cal", n_test="n_test", k="k")
    return _emit(run_coverage(_rng(args), reps=args.reps, **opts), args)


def _variance(args: argparse.Namespace) -> int:

    opts = _opt(args, p_stars="p_star", ks="k")
    return _emit(run_variance(_rng(args), trials=args.trials, **opts), args)


def _setsize(args: argparse.Namespace) -> int:

    opts = _opt(args, alphas="alpha", p_stars="p_star", n_cal="n_cal", n_test="n_test", k="k")
    return _emit(run_setsize(_rng(args), reps=args.reps, **opts), args)


def _entropy(args: argparse.Namespace) -> int:

    opts = _opt(args, alpha="alpha", n_cal="n_cal", n_test="n_test", k="k")
    return _emit(run_entropy(_rng(args), reps=args.reps, **opts), args)


def _canon(args: argparse.Namespace) -> int:

    opts = _opt(args, ks="k")
    return _emit(run_canon(_rng(args), trials=args.trials, **opts), args)


def _stopping(args: argparse.Namespace) -> int:

    settings: dict[str, Any] = {
        "rule": args.rule,
        "k0": args.k0,
        "k_max": args.kmax,
        "delta": args.delta,
        "point_mass": args.point_mass,
        "strict": args.strict,
        "futility": args.futility == "on",
        "c": args.c,
        "seed": args.seed,
    }
    if args.real is not None:
        if args.grid or args.dist is not None:
            raise ConfigError("--real replays its own items; drop --grid and --dist")
        items = load_answer_file(Path(args.real))
        if args.real_prefix is not None:
            items = [i for i in items if i.item_id.startswith(args.real_prefix)]
            if not items:
                raise ConfigError(f"--real-prefix {args.real_prefix!r}: no item id starts so")
        trials = args.trials if args.trials is not None else 200
        return _emit(
            run_real_stopping(
                items, k0=args.k0, k_max=args.kmax, delta=args.delta, reps=trials, seed=args.seed
            ),
            args,
        )
    if args.grid:
        if args.dist is not None or args.weights is not None:
            raise ConfigError("--grid runs its own distributions; drop --dist and --weights")
        trials = args.trials if args.trials is not None else 20000
        return _emit(run_stopping_grid(trials=trials, **settings), args)
    dists = args.dist if args.dist is not None else [[0.7, 0.2, 0.1]]
    if args.weights is not None and len(args.weights) != len(dists):
        raise ConfigError(f"--weights has {len(args.weights)} values for {len(dists)} --dist")
    trials = args.trials if args.trials is not None else 5000
    result = run_stopping(
        dists, weights=args.weights, trials=trials, compare=args.compare, **settings
    )
    return _emit(result, args)


def _drift(args: argparse.Namespace) -> int:

    opts = _opt(args, alpha="alpha", gamma="gamma", reps="reps", half_life="half_life")
    return _emit(run_drift(seed=args.seed, **opts), args)  # ConfigError for a bad --half-life


def _priority(args: argparse.Namespace) -> int:

    if args.mix is not None and (bad := [m for m in args.mix if m not in MIXES]):
        raise ConfigError(f"unknown mix {bad[0]!r}; available: {', '.join(MIXES)}")
    opts = _opt(args, mixes="mix", budgets="reviews", reps="reps", alpha="alpha")
    return _emit(run_priority(seed=args.seed, **opts), args)


def _alarm(args: argparse.Namespace) -> int:

    opts = _opt(args, tau="target", alpha="alpha_alarm", window="window", streams="streams")
    opts.update(_opt(args, horizon="horizon"))
    return _emit(run_alarm(seed=args.seed, **opts), args)


# --------------------------------------------------------------------------- parser


def _add_experiment(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Callable[[argparse.Namespace], int],
    help_text: str,
) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--seed", type=_seed, default=0, help="random seed (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", metavar="DIR", help="write a PNG plot to DIR (needs matplotlib)")
    p.set_defaults(handler=handler)
    return p


def _add_sizes(p: argparse.ArgumentParser, reps: int) -> None:
    p.add_argument("--reps", type=_positive, default=reps, help=f"repetitions (default {reps})")
    p.add_argument("--n-cal", type=_positive, help="calibration items per repetition (200)")
    p.add_argument("--n-test", type=_positive, help="test items per repetition (500)")
    p.add_argument("--k", type=_positive, help="answers per item (10)")


def _add_p_star(p: argparse.ArgumentParser) -> None:
    p.add_argument("--p-star", type=_unit, action="append", help="agent quality p* (repeatable)")


def _add_stopping_options(p: argparse.ArgumentParser) -> None:
    """The options of ``relmon simulate stopping``."""
    p.add_argument(
        "--dist", type=_dist, action="append", help="answer distribution, e.g. 0.7,0.2,0.1"
    )
    p.add_argument("--weights", type=_weights, help="stream proportions of the --dist values")
    p.add_argument("--kmax", type=_positive, default=20, help="K_max (default 20)")
    p.add_argument("--k0", type=_positive, default=3, help="minimum samples (default 3)")
    p.add_argument(
        "--delta", type=_open_unit("delta"), default=0.05, help="error level (default 0.05)"
    )
    p.add_argument(
        "--rule",
        default=DEFAULT_RULE,
        help=f"stopping rule: {', '.join(available_rules())} (default {DEFAULT_RULE})",
    )
    p.add_argument(
        "--point-mass",
        type=float,
        help="mixture prior mass at theta=1 (truncated: use the e-value construction with "
        "this mass instead of the tuned table)",
    )
    p.add_argument("--strict", action="store_true", help="allow for K_max - 1 rivals")
    p.add_argument(
        "--futility",
        choices=["on", "off"],
        default="on" if DEFAULT_FUTILITY else "off",
        help="also stop once K_max can no longer certify (default: the service's, "
        + ("on" if DEFAULT_FUTILITY else "off")
        + ")",
    )
    p.add_argument("--c", type=float, help="runner-up rule constant: E >= c/delta (default 2)")
    p.add_argument(
        "--real",
        metavar="FILE",
        help="replay real answer distributions (bench/data/smollm2_answers.json) "
        "under every rule x futility setting",
    )
    p.add_argument(
        "--real-prefix",
        metavar="PREFIX",
        help="with --real: only the items whose id starts with PREFIX (e.g. capital-)",
    )
    p.add_argument(
        "--trials", type=_positive, help="trials per distribution (5000; grid 20000; real 200)"
    )
    p.add_argument("--compare", action="store_true", help="also run the hoeffding rule")
    p.add_argument("--grid", action="store_true", help="run the built-in validation grid")


def add_simulate_parser(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``simulate`` and its experiments to the ``relmon`` command.

    The sub-subcommands' parsers are of the same class as ``simulate``'s, so they
    report errors the way the main parser does.
    """
    sim: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="the paper's synthetic experiments (appendix C)",
        description=__doc__.splitlines()[0].replace("``", "") if __doc__ else None,
    )
    sub = sim.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")

    p = _add_experiment(sub, "coverage", _coverage, "coverage >= 1 - alpha (Theorem 6.7)")
    _add_sizes(p, reps=50)
    _add_p_star(p)
    p.add_argument("--alpha", type=_alpha, action="append", help="miscoverage (repeatable)")

    p = _add_experiment(sub, "variance", _variance, "mode error vs K and the Hoeffding bound")
    p.add_argument("--trials", type=_positive, default=5000, help="trials per cell (5000)")
    p.add_argument("--k", type=_positive, action="append", help="answers per item (repeatable)")
    _add_p_star(p)

    p = _add_experiment(sub, "setsize", _setsize, "M* vs agent quality p*")
    _add_sizes(p, reps=20)
    _add_p_star(p)
    p.add_argument("--alpha", type=_alpha, action="append", help="miscoverage (repeatable)")

    p = _add_experiment(sub, "entropy", _entropy, "set size vs consensus entropy")
    _add_sizes(p, reps=10)
    p.add_argument("--alpha", type=_alpha, help="miscoverage (default 0.1)")

    p = _add_experiment(sub, "canon", _canon, "mode error with and without canonicalization")
    p.add_argument("--trials", type=_positive, default=5000, help="trials per K (5000)")
    p.add_argument("--k", type=_positive, action="append", help="answers per item (repeatable)")

    p = _add_experiment(sub, "stopping", _stopping, "sequential stopping: samples and errors")
    _add_stopping_options(p)

    p = _add_experiment(
        sub, "drift", _drift, "live self-check under drift: decay window alone vs with ACI"
    )
    p.add_argument("--alpha", type=_alpha, help="miscoverage (default 0.1)")
    p.add_argument("--gamma", type=_alpha, help="ACI step (default 0.01)")
    p.add_argument("--half-life", type=float, help="window half-life in items (default 1000)")
    p.add_argument("--reps", type=_positive, help="repetitions (default 10)")

    p = _add_experiment(sub, "priority", _priority, "uncertainty-prioritised vs uniform review")
    p.add_argument("--mix", action="append", help="difficulty mix (repeatable; default all)")
    p.add_argument("--reviews", type=_positive, action="append", help="review budget (repeatable)")
    p.add_argument("--alpha", type=_alpha, help="miscoverage (default 0.1)")
    p.add_argument("--reps", type=_positive, help="repetitions (default 100)")

    p = _add_experiment(
        sub, "alarm", _alarm, "anytime-valid reliability alarm: false alarms and delay"
    )
    p.add_argument("--target", type=_alpha, help="reliability target (default 0.9)")
    p.add_argument("--alpha-alarm", type=_alpha, help="alarm level (default 0.01)")
    p.add_argument("--window", type=_positive, help="naive rules' window (default 100)")
    p.add_argument("--streams", type=_positive, help="simulated streams (default 500)")
    p.add_argument("--horizon", type=_positive, help="reviewed items per stream (default 3000)")
