"""Rows of the SQLite store to and from relmon's data, and its errors."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from monitor.core.errors import InputError, StoreError
from monitor.core.review import Verdict, same_judgement
from monitor.engine.ports import CalibrationRecord

__all__ = [
    "RECORD_COLUMNS",
    "aci_column",
    "held_elsewhere",
    "next_seq",
    "pending_filter",
    "record_of",
    "score_column",
    "store_error",
    "verdict_from_json",
]


def store_error(exc: sqlite3.Error) -> StoreError:
    busy = isinstance(exc, sqlite3.OperationalError) and any(
        word in str(exc).lower() for word in ("locked", "busy")
    )
    return StoreError(f"calibration store: {exc}", retriable=busy)


def score_column(score: float) -> float | None:
    if math.isnan(score) or score < 1:
        raise InputError(f"a rank score is >= 1 or +inf, not {score!r}")
    return None if math.isinf(score) else score


def verdict_from_json(text: str) -> Verdict:
    d = json.loads(text)
    return Verdict(
        item_id=str(d["item_id"]),
        accepted_ranks=tuple(int(r) for r in d.get("accepted_ranks", [])),
        none_of_these=bool(d.get("none_of_these", False)),
        correct_answer=d.get("correct_answer"),
        reviewer=str(d.get("reviewer", "unknown")),
    )


def aci_column(miss: bool | None) -> int | None:
    """A nullable flag (``aci_miss``, ``served_acceptable``) as SQLite stores it."""
    return None if miss is None else int(miss)


def record_of(row: Sequence[Any]) -> CalibrationRecord:
    model, task, item_id, score, prob, sampled_at, seq, miss, served, segment = row
    return CalibrationRecord(
        model=str(model),
        task=str(task),
        item_id=str(item_id),
        score=math.inf if score is None else float(score),
        inclusion_probability=float(prob),
        sampled_at=float(sampled_at),
        order=(int(seq),),
        aci_miss=None if miss is None else bool(miss),
        served_acceptable=None if served is None else bool(served),
        segment=None if segment is None else str(segment),
    )


RECORD_COLUMNS = (
    "model, task, item_id, score, inclusion_probability, sampled_at, seq, aci_miss, "
    "served_acceptable, segment"
)


def next_seq(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT coalesce(max(seq), 0) + 1 FROM records").fetchone()[0])


def pending_filter(task: str | None) -> tuple[str, tuple[Any, ...]]:
    return ("", ()) if task is None else (" AND ri.task = ?", (task,))


def held_elsewhere(conn: sqlite3.Connection, verdict: Verdict) -> bool:
    """Whether a verdict that judges ``verdict``'s item otherwise is held for it."""
    row = conn.execute(
        "SELECT verdict FROM held_verdicts WHERE item_id = ?", (verdict.item_id,)
    ).fetchone()
    return row is not None and not same_judgement(verdict_from_json(str(row[0])), verdict)
