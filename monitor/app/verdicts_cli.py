"""``relmon verdicts export|import``: reviewed labels as data (the SQLite review store,
or the PostgreSQL store every replica shares with ``store.backend: postgres``).

Export writes every applied verdict with its review item, one record per item, in the
order the calibration windows load them. JSONL keeps everything::

    {"id", "model", "task", "query", "candidates": [{"rank", "answer", "count"}], "k",
     "inclusion_probability", "sampled_at", "verdict": {"accepted_ranks",
     "none_of_these", "correct_answer", "reviewer"}, "reviewer", "score" (rank or "inf"),
     "applied_at", "aci_miss", "answers", "acceptable"}

``answers`` (every candidate repeated by its count) and ``acceptable`` (the accepted
candidates, or the reviewer's correct answer) make a JSONL export readable by
``relmon certify`` as both ``--samples`` and ``--labels``. CSV has one column per
field, ``accepted_ranks`` joined by ``;`` and ``candidates`` as JSON; every cell is safe
to open in a spreadsheet or print in a terminal (:mod:`monitor.app.spreadsheet`: a cell
that starts like a formula gets a leading ``'``, controls are written as ``\\xHH``).

Import reads either format back into a state directory (or the shared store): a review
item and its verdict per record; an item that already has a verdict keeps it (verdicts
are idempotent by item id; on the shared store the running replicas follow the imported
ones at once). ``aci_miss`` (true, false or null) is the verdict's step of the adaptive
alpha (tasks with ``aci_gamma``); a file without it imports as null (no step). The score
of a verdict with accepted ranks is recomputed from the ranks and must agree with the
file's; a "none of these" verdict keeps the file's score (its correct answer may have
matched a candidate through the task's canonicalizer). In a state directory the
imported verdicts count from relmon's next start (the running service does not see
them). Floats are written with ``repr``, so a round trip restores the same weights and
therefore the same thresholds.

The Kafka review backend keeps verdicts in its verdict topic, which is the record:
these commands refuse a configuration with ``review.backend: kafka``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, cast

from adapters.postgres.store import PostgresStore
from adapters.sqlite.store import ExportedVerdict, SqliteStore
from monitor.app.spreadsheet import cell_from_csv, cell_to_csv
from monitor.config import load_settings
from monitor.core.errors import ConfigError, InputError
from monitor.core.review import ReviewItem, Verdict, parse_verdict, verdict_score

__all__ = [
    "CSV_FIELDS",
    "add_verdicts_parser",
    "read_records",
    "record_from_json",
    "record_to_json",
    "write_records",
]

CSV_FIELDS = (
    "id",
    "model",
    "task",
    "reviewer",
    "accepted_ranks",
    "none_of_these",
    "correct_answer",
    "score",
    "inclusion_probability",
    "sampled_at",
    "applied_at",
    "k",
    "query",
    "candidates",
    "aci_miss",
)
_OPTIONAL_CSV_FIELDS = frozenset({"aci_miss"})  # not in exports older than it


def _score_out(score: float) -> float | str:
    return "inf" if math.isinf(score) else score


def record_to_json(row: Any) -> dict[str, Any]:
    """An :class:`adapters.sqlite.store.ExportedVerdict` as one JSONL object."""
    item: ReviewItem = row.item
    verdict: Verdict = row.verdict
    d = item.to_json()
    d.pop("item_id")
    acceptable = [item.candidates[r - 1][0] for r in verdict.accepted_ranks]
    if verdict.correct_answer:
        acceptable.append(verdict.correct_answer)
    return {
        "id": item.item_id,
        **d,
        "verdict": {k: v for k, v in verdict.to_json().items() if k != "item_id"},
        "reviewer": verdict.reviewer,
        "score": _score_out(row.score),
        "applied_at": row.applied_at,
        "aci_miss": row.aci_miss,
        "answers": [answer for answer, count in item.candidates for _ in range(count)],
        "acceptable": acceptable,
    }


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputError(f"{name!r} must be a number")
    number = float(value)
    if math.isnan(number):
        raise InputError(f"{name!r} must be a number")
    return number


def record_from_json(obj: Any) -> Any:
    """One exported object back to an ``ExportedVerdict``; :class:`InputError` if bad."""
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object")
    item_id = obj.get("id")
    if not isinstance(item_id, str) or not item_id:
        raise InputError("'id' must be a non-empty string")
    item = ReviewItem.from_json({**obj, "item_id": item_id})
    if not item.candidates or item.k < 1:
        raise InputError("an item needs candidates and k >= 1")
    if not 0.0 < item.inclusion_probability <= 1.0:
        raise InputError("'inclusion_probability' must be in (0, 1]")
    verdict = parse_verdict(
        {**(obj.get("verdict") or {})}, item_id=item_id, max_rank=len(item.candidates)
    )
    score = _number(obj.get("score", "inf"), "score")
    if verdict.accepted_ranks:
        expected = verdict_score(item, verdict)
        if expected != score:
            raise InputError(f"'score' {score} disagrees with the accepted ranks ({expected})")
    elif not (math.isinf(score) or (score == int(score) and 1 <= score <= len(item.candidates))):
        raise InputError("'score' of a 'none of these' verdict is 'inf' or a candidate rank")
    aci_miss = obj.get("aci_miss")
    if aci_miss is not None and not isinstance(aci_miss, bool):
        raise InputError("'aci_miss' must be true, false or null")
    return ExportedVerdict(
        item=item,
        verdict=verdict,
        score=score,
        applied_at=_number(obj.get("applied_at", item.sampled_at), "applied_at"),
        aci_miss=aci_miss,
    )


def _csv_row(row: Any) -> dict[str, str]:
    """One CSV row; every cell safe to open (:mod:`monitor.app.spreadsheet`)."""
    return {name: cell_to_csv(cell) for name, cell in _csv_cells(row).items()}


def _csv_cells(row: Any) -> dict[str, str]:
    d = record_to_json(row)
    v = d["verdict"]
    return {
        "id": d["id"],
        "model": d["model"],
        "task": d["task"],
        "reviewer": v["reviewer"],
        "accepted_ranks": ";".join(str(r) for r in v["accepted_ranks"]),
        "none_of_these": "true" if v["none_of_these"] else "false",
        "correct_answer": "" if v["correct_answer"] is None else v["correct_answer"],
        "score": repr(row.score) if math.isfinite(row.score) else "inf",
        "inclusion_probability": repr(d["inclusion_probability"]),
        "sampled_at": repr(d["sampled_at"]),
        "applied_at": repr(d["applied_at"]),
        "k": str(d["k"]),
        "query": d["query"],
        "candidates": json.dumps(d["candidates"], ensure_ascii=False),
        "aci_miss": {None: "", True: "true", False: "false"}[row.aci_miss],
    }


def _from_csv_row(cells: dict[str, str]) -> Any:
    row = {k: cell_from_csv(v) if isinstance(v, str) else v for k, v in cells.items()}
    missing = [f for f in CSV_FIELDS if row.get(f) is None and f not in _OPTIONAL_CSV_FIELDS]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}")
    none = row["none_of_these"].strip().lower()
    if none not in ("true", "false"):
        raise InputError("'none_of_these' must be true or false")
    aci = (row.get("aci_miss") or "").strip().lower()
    if aci not in ("", "true", "false"):
        raise InputError("'aci_miss' must be true, false or empty")
    try:
        ranks = [int(r) for r in row["accepted_ranks"].split(";") if r.strip()]
        candidates = json.loads(row["candidates"])
        k = int(row["k"])
    except (ValueError, json.JSONDecodeError) as exc:
        raise InputError(f"bad ranks, k or candidates: {exc}") from None
    verdict: dict[str, Any] = {
        "accepted_ranks": ranks,
        "none_of_these": none == "true",
        "reviewer": row["reviewer"],
    }
    if row["correct_answer"]:
        verdict["correct_answer"] = row["correct_answer"]
    return record_from_json(
        {
            "id": row["id"],
            "model": row["model"],
            "task": row["task"],
            "query": row["query"],
            "candidates": candidates,
            "k": k,
            "inclusion_probability": row["inclusion_probability"],
            "sampled_at": row["sampled_at"],
            "verdict": verdict,
            "score": row["score"],
            "applied_at": row["applied_at"],
            "aci_miss": None if not aci else aci == "true",
        }
    )


def write_records(rows: Sequence[Any], out: TextIO, fmt: str) -> None:
    if fmt == "csv":
        # RFC 4180 line ends: "\r\n" in the terminator makes the writer quote any field
        # holding "\r" or "\n", so such text survives the round trip.
        writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\r\n")
        writer.writeheader()
        for row in rows:
            writer.writerow(_csv_row(row))
        return
    for row in rows:
        out.write(json.dumps(record_to_json(row), ensure_ascii=False, allow_nan=False) + "\n")


def _lines(text: str, source: str, fmt: str) -> Iterator[tuple[int, Any]]:
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        for number, row in enumerate(reader, start=2):
            yield number, ("csv", row)
        return
    # Only "\n" ends a record: str.splitlines would also split at U+2028 and friends,
    # which JSON strings may hold unescaped.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            yield number, ("json", json.loads(line))
        except (json.JSONDecodeError, RecursionError) as exc:
            raise InputError(f"invalid JSON: {exc}", source=source, line=number) from None


def read_records(path: Path, fmt: str | None = None) -> list[Any]:
    """Every record of an export file; :class:`InputError` naming the line if bad."""
    fmt = fmt or ("csv" if path.suffix.lower() == ".csv" else "jsonl")
    try:
        # newline="": no translation, so "\r" inside a quoted CSV field stays itself.
        with path.open(encoding="utf-8", newline="") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", source=str(path)) from None
    out, seen = [], set()
    for number, (kind, obj) in _lines(text, str(path), fmt):
        try:
            row = _from_csv_row(obj) if kind == "csv" else record_from_json(obj)
        except (ValueError, KeyError, TypeError, InputError) as exc:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(message, source=str(path), line=number) from None
        if row.item.item_id in seen:
            raise InputError(f"duplicate id {row.item.item_id!r}", source=str(path), line=number)
        seen.add(row.item.item_id)
        out.append(row)
    return out


@dataclass(frozen=True)
class _Target:
    """Where the verdicts are: a SQLite file, or the shared PostgreSQL store (a DSN)."""

    path: Path | None = None
    dsn: str | None = None

    @property
    def shown(self) -> str:
        return str(self.path) if self.path is not None else "the PostgreSQL store"

    async def open(self) -> Any:
        if self.dsn is not None:
            return await PostgresStore.open(self.dsn, max_size=2)
        return await SqliteStore.open(self.path or Path("relmon.sqlite3"))


def _target(args: argparse.Namespace) -> _Target:
    if args.state_dir is not None:
        return _Target(path=Path(args.state_dir) / "relmon.sqlite3")
    settings = load_settings(args.config)
    if settings.review.backend == "kafka":
        raise ConfigError(
            "review.backend: relmon verdicts works with the SQLite or PostgreSQL review "
            "store; with the Kafka backend the verdict topic is the record (copy or mirror "
            "the topic)"
        )
    if settings.store.backend == "postgres":
        dsn = settings.store.resolved_dsn()
        if dsn is None:
            raise ConfigError("store.dsn: store.backend postgres needs a DSN")
        return _Target(dsn=dsn)
    return _Target(path=Path(settings.state_dir) / "relmon.sqlite3")


async def _export(target: _Target, out: TextIO, fmt: str) -> int:
    store = await target.open()
    try:
        rows = await store.export_verdicts()
    finally:
        await store.aclose()
    write_records(rows, out, fmt)
    return len(rows)


async def _import(target: _Target, rows: Sequence[Any]) -> tuple[int, int]:
    store = await target.open()
    try:
        return cast("tuple[int, int]", await store.import_verdicts(rows))
    finally:
        await store.aclose()


def run_verdicts(args: argparse.Namespace) -> int:
    target = _target(args)
    if args.action == "export":
        if target.path is not None and not target.path.exists():
            raise ConfigError(f"no review store at {target.path} (check --state-dir or --config)")
        if args.output is None:
            count = asyncio.run(_export(target, sys.stdout, args.format))
        else:
            with args.output.open("w", encoding="utf-8", newline="") as out:
                count = asyncio.run(_export(target, out, args.format))
        print(f"relmon: exported {count} verdicts from {target.shown}", file=sys.stderr)
        return 0
    rows = read_records(args.file, args.format)
    new, old = asyncio.run(_import(target, rows))
    when = (
        "relmon uses them from its next start"
        if target.dsn is None
        else "the running replicas follow them now"
    )
    print(
        f"relmon: imported {new} verdicts into {target.shown} ({old} already had one and "
        f"kept it); {when}",
        file=sys.stderr,
    )
    return 0


def add_verdicts_parser(sub: Any) -> None:
    p = sub.add_parser(
        "verdicts",
        help="export or import reviewed labels (the SQLite or PostgreSQL review store)",
        description="Keep, audit and move reviewed labels: every applied verdict with its "
        "review item, as JSONL or CSV.",
    )
    actions = p.add_subparsers(dest="action", required=True)
    for name, text in (
        ("export", "write every applied verdict (stdout unless --output)"),
        ("import", "read an export into a state directory"),
    ):
        a = actions.add_parser(name, help=text, description=text)
        where = a.add_mutually_exclusive_group()
        where.add_argument(
            "--config", type=Path, help="settings file (its state_dir, or store.dsn)"
        )
        where.add_argument("--state-dir", type=Path, help="relmon's state directory")
        a.set_defaults(handler=run_verdicts)
        if name == "export":
            a.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
            a.add_argument("--output", "-o", type=Path, help="file to write")
        else:
            a.add_argument("file", type=Path, help="an export (JSONL, or CSV by extension)")
            a.add_argument("--format", choices=("jsonl", "csv"), help="default: by extension")
