"""Stopping rules on real answer distributions (a cached file of K answers per item).

Each item's K cached answers (canonicalized with the item's canonicalizer) define its
answer distribution: the empirical distribution of its classes. Every rule x futility
setting is replayed ``reps`` times per item, drawing with replacement from that
distribution in the batches the rule asks for, so the true mode is known exactly (the
empirical mode; an exact tie at the top has none, and any certification there is
wrong). Reported per setting:

* calls per item (mean K used) and the saving against K_max;
* certified share: items the rule certified (the rest reached K_max or were stopped
  for futility);
* wrong-mode rate: certified items whose certified leader is not the true mode;
* top-answer accuracy: the top-ranked class after stopping (ties broken at random)
  is acceptable, the figure a user's reliability level is built on.

Item ``i`` and replay ``r`` use the generator ``default_rng([seed, i, r])`` under every
setting, so the settings are compared on the same random numbers. Pure: no printing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from monitor.app.simulate.sequential import make_rule
from monitor.app.simulate.tables import fmt, format_table
from monitor.core.canon.base import INVALID
from monitor.core.canon.registry import get_canonicalizer
from monitor.core.consensus import rank_classes
from monitor.core.errors import ConfigError
from monitor.core.stopping import StoppingRule

__all__ = [
    "SETTINGS",
    "RealItem",
    "RealRow",
    "RealStoppingResult",
    "load_answer_file",
    "real_items",
    "replay",
    "replay_top",
    "run_real_stopping",
]

SETTINGS: tuple[tuple[str, bool], ...] = (
    ("fixed", False),
    ("hoeffding", False),
    ("mixture", False),
    ("mixture", True),
    ("runner-up", False),
    ("runner-up", True),
    ("truncated", False),
    ("truncated", True),
)
"""(rule, futility) settings compared: ``runner-up`` with futility was the default before
``truncated`` with futility."""


@dataclass(frozen=True, slots=True)
class RealItem:
    """One item's answer distribution over classes, and which classes are acceptable."""

    item_id: str
    classes: tuple[str, ...]
    probabilities: tuple[float, ...]
    acceptable: frozenset[str]

    @property
    def true_mode(self) -> str | None:
        p = np.asarray(self.probabilities)
        top = np.flatnonzero(np.isclose(p, p.max(), rtol=0, atol=1e-12))
        return self.classes[int(top[0])] if top.size == 1 else None


def real_items(doc: dict[str, object]) -> list[RealItem]:
    """Items from a parsed answer file (see bench/smollm2_answers.py for the format)."""
    raw = doc.get("items")
    if not isinstance(raw, list) or not raw:
        raise ConfigError("answer file: 'items' must be a non-empty list")
    out = []
    for i, entry in enumerate(raw):
        try:
            canon = get_canonicalizer(str(entry.get("canonicalizer", "text")))
            answers = [canon.canonicalize(str(a)) for a in entry["answers"]]
            acceptable = frozenset(canon.canonicalize(str(a)) for a in entry["acceptable"])
            item_id = str(entry["id"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"answer file: item {i} is malformed: {exc}") from None
        if not answers:
            raise ConfigError(f"answer file: item {item_id} has no answers")
        counts = Counter(answers)
        classes = tuple(sorted(counts))
        total = sum(counts.values())
        out.append(
            RealItem(
                item_id,
                classes,
                tuple(counts[c] / total for c in classes),
                acceptable - {INVALID},
            )
        )
    return out


def load_answer_file(path: Path) -> list[RealItem]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read answer file {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"answer file {path}: not a JSON object")
    return real_items(doc)


@dataclass(frozen=True, slots=True)
class RealRow:
    rule: str
    futility: bool
    calls_per_item: float
    certified: float
    wrong_mode: float
    top_accuracy: float


@dataclass(frozen=True, slots=True)
class RealStoppingResult:
    items: int
    reps: int
    k0: int
    k_max: int
    delta: float
    mode_accuracy: float
    """Share of items whose true mode is acceptable (the ceiling for top accuracy)."""
    rows: tuple[RealRow, ...]

    def row(self, rule: str, futility: bool) -> RealRow:
        return next(r for r in self.rows if r.rule == rule and r.futility == futility)

    def as_dict(self) -> dict[str, object]:
        return {
            "experiment": "stopping_real",
            "items": self.items,
            "reps": self.reps,
            "k0": self.k0,
            "k_max": self.k_max,
            "delta": self.delta,
            "mode_accuracy": self.mode_accuracy,
            "rows": [
                {
                    "rule": r.rule,
                    "futility": r.futility,
                    "calls_per_item": r.calls_per_item,
                    "savings": 1.0 - r.calls_per_item / self.k_max,
                    "certified": r.certified,
                    "wrong_mode": r.wrong_mode,
                    "top_accuracy": r.top_accuracy,
                }
                for r in self.rows
            ],
        }

    def table(self) -> str:
        head = ["rule", "futility", "calls/item", "saved", "certified", "wrong mode", "top acc."]
        rows = [
            [
                r.rule,
                "on" if r.futility else "off",
                fmt(r.calls_per_item, 2),
                fmt(1.0 - r.calls_per_item / self.k_max, 3),
                fmt(r.certified, 3),
                fmt(r.wrong_mode, 4),
                fmt(r.top_accuracy, 3),
            ]
            for r in self.rows
        ]
        title = (
            f"stopping on real answers: {self.items} items x {self.reps} replays, "
            f"k0={self.k0} K_max={self.k_max} delta={self.delta:g}; "
            f"true mode acceptable on {self.mode_accuracy:.3f} of items"
        )
        return format_table(head, rows, title)


def replay_top(
    rule: StoppingRule, item: RealItem, rng: np.random.Generator
) -> tuple[int, bool, str | None]:
    """One item under ``rule``: (calls, certified, the top-ranked class after stopping)."""
    p = np.asarray(item.probabilities)
    counts = np.zeros(p.size, dtype=int)
    decision = rule.decide([])
    while not decision.stop:
        counts += rng.multinomial(decision.more, p)
        decision = rule.decide(counts.tolist())
    drawn = [c for c, n in zip(item.classes, counts.tolist(), strict=True) for _ in range(n)]
    consensus = rank_classes(drawn, rng)
    top = consensus.classes[0] if consensus.classes else None
    return int(counts.sum()), decision.certified, top


def replay(
    rule: StoppingRule, item: RealItem, rng: np.random.Generator
) -> tuple[int, bool, bool, bool]:
    """One item under ``rule``: (calls, certified, wrong mode, top answer acceptable)."""
    calls, certified, top = replay_top(rule, item, rng)
    wrong = certified and (item.true_mode is None or top != item.true_mode)
    return calls, certified, wrong, top in item.acceptable


def run_real_stopping(
    items: Sequence[RealItem],
    *,
    k0: int = 3,
    k_max: int = 20,
    delta: float = 0.05,
    reps: int = 200,
    seed: int = 0,
    settings: Sequence[tuple[str, bool]] = SETTINGS,
) -> RealStoppingResult:
    """Every (rule, futility) of ``settings`` on every item, ``reps`` replays each."""
    if not items:
        raise ConfigError("no items to replay")
    if reps < 1:
        raise ConfigError(f"reps must be >= 1, got {reps}")
    rows = []
    for name, futility in settings:
        rule = make_rule(name, k0=k0, k_max=k_max, delta=delta, futility=futility)
        calls = certified = wrong = right = 0
        for i, item in enumerate(items):
            for r in range(reps):
                used, cert, bad, ok = replay(rule, item, np.random.default_rng([seed, i, r]))
                calls += used
                certified += cert
                wrong += bad
                right += ok
        n = len(items) * reps
        rows.append(RealRow(name, futility, calls / n, certified / n, wrong / n, right / n))
    mode_ok = sum(it.true_mode is not None and it.true_mode in it.acceptable for it in items)
    return RealStoppingResult(len(items), reps, k0, k_max, delta, mode_ok / len(items), tuple(rows))
