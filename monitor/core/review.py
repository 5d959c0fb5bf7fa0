"""Review items and verdicts (docs/review.md), and how a verdict becomes a score. No I/O.

A review item is what a reviewer sees: the item id, model, task, the (redacted) query,
the ranked candidates with their counts, K used and the inclusion probability. A
verdict names the accepted candidate ranks, or says "none of these" with an optional
correct answer; verdicts are idempotent by item id.

**The served answer.** When production's answer is known, the item offers its class
among the candidates, so that a verdict judges it (``served_rank``: its position). When
the re-asks never drew that class (a changed re-ask), it is offered after the ranked
candidates with count 0: outside the ranking, so it never changes the item's score
(:func:`verdict_score` reads the ranked candidates only), and
:func:`served_acceptable` tells whether the verdict accepted it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from monitor.core.canon.base import INVALID, Canonicalizer, QueryContext
from monitor.core.conformal import quantile_index
from monitor.core.consensus import Consensus
from monitor.core.errors import InputError, TooLargeError
from monitor.core.events import is_text
from monitor.core.reask import UNRECORDED
from monitor.core.scores import rank_score
from monitor.core.segments.labels import LABEL_PATTERN

__all__ = [
    "MAX_ACCEPTED_RANKS",
    "MAX_CORRECT_ANSWER_CHARS",
    "MAX_ITEM_ID_CHARS",
    "MAX_REVIEWER_CHARS",
    "MAX_TASK_NAME_CHARS",
    "MAX_VERDICT_BYTES",
    "ReviewItem",
    "TaskProgress",
    "Verdict",
    "aci_miss",
    "check_item_id_size",
    "minimum_calibration_items",
    "parse_verdict",
    "reviewer_name_problem",
    "same_judgement",
    "served_acceptable",
    "verdict_score",
]

# The size limits of a verdict, wherever it comes from (review API, review page, Kafka
# verdict topic, an import): over one, parse_verdict raises TooLargeError, which the
# review API answers 413 and the Kafka follower dead-letters. docs/review.md lists them.
MAX_VERDICT_BYTES = 65_536
"""The whole verdict, as sent (JSON bytes; unknown fields are ignored but count)."""
MAX_TASK_NAME_CHARS = 256
"""``tasks[].name`` (the settings schema checks it): with the event id limit
(``monitor.core.events.MAX_EVENT_ID_CHARS``) every item id, ``task:event id``, fits in
:data:`MAX_ITEM_ID_CHARS`."""
MAX_ITEM_ID_CHARS = 1024
"""``item_id`` (at least ``MAX_TASK_NAME_CHARS + 1 + MAX_EVENT_ID_CHARS``)."""
MAX_REVIEWER_CHARS = 256
"""``reviewer``: a name or an e-mail address (kept whole, never cut)."""
MAX_CORRECT_ANSWER_CHARS = 4096
"""``correct_answer``: the reviewer's own answer to a "none of these"."""
MAX_ACCEPTED_RANKS = 200
"""Entries of ``accepted_ranks``: an item has at most ``k_max`` <= 200 candidates."""


_CHANGE_KEYS: Final = ("from", "to")


def _reask_changes(raw: Any) -> dict[str, dict[str, Any]]:
    """A review item's ``reask_changes`` (absent in items written before it existed):
    field -> ``from`` / ``to``, and ``"unrecorded": true`` for a field its span did not
    record (:func:`~monitor.core.reask.with_unrecorded`)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Mapping) for k, v in raw.items()
    ):
        raise InputError("reask_changes must map field names to {from, to}")
    return {
        k: {
            kk: vv
            for kk, vv in v.items()
            if kk in _CHANGE_KEYS or (kk == UNRECORDED and vv is True)
        }
        for k, v in raw.items()
    }


def _served_rank(raw: Any, candidates: int) -> int | None:
    """A review item's ``served_rank`` (absent: no served answer, or an older item)."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= candidates:
        raise InputError("served_rank must be the position of one of the candidates")
    return raw


def _segment(raw: Any) -> str | None:
    """A review item's ``segment`` (absent: its task has no segments, or an older item)."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not LABEL_PATTERN.fullmatch(raw):
        raise InputError("segment must be a segment label value")
    return raw


def _finite_or_inf(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"


@dataclass(frozen=True, slots=True)
class ReviewItem:
    item_id: str
    model: str
    task: str
    query: str
    candidates: tuple[tuple[str, int], ...]
    k: int
    inclusion_probability: float
    sampled_at: float
    """Seconds since the epoch when the item was sampled (its age for decay)."""
    thresholds: tuple[tuple[float, float], ...] = ()
    """(alpha, M*(alpha)) in force when the item was scored: its verdict checks them."""
    aci_threshold: float | None = None
    """With ACI on, the threshold served at the adaptive alpha_t when it was scored."""
    reask_changes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """How the re-asks differed from the request production sent: field ->
    ``{"from": sent, "to": re-asked}`` (:mod:`monitor.core.reask`); shown to the reviewer."""
    api: str = "openai.chat"
    """The wire API of the production call (``monitor.core.apis``); shown to the reviewer."""
    served_rank: int | None = None
    """The position (1-based) in ``candidates`` of the class of the answer production
    served; None when it is not known. A candidate of count 0 (last) is that class when
    the re-asks never drew it: offered, never ranked. Not shown on the review page."""
    segment: str | None = None
    """The item's segment value (``tasks[].segments``) as a label value of
    :mod:`monitor.core.segments` (kept or hashed; ``other`` in items written before
    values were kept), fixed when it was scored; None for a task without segments (and
    every item written before them)."""

    @classmethod
    def from_consensus(
        cls,
        *,
        item_id: str,
        model: str,
        task: str,
        query: str,
        consensus: Consensus,
        inclusion_probability: float,
        sampled_at: float,
        thresholds: tuple[tuple[float, float], ...] = (),
        aci_threshold: float | None = None,
        reask_changes: Mapping[str, Mapping[str, Any]] | None = None,
        api: str = "openai.chat",
        served: str | None = None,
        segment: str | None = None,
    ) -> ReviewItem:
        """``served``: the served answer's class as shown (redacted like the candidates):
        one of ``consensus.classes``, or offered after them with count 0. ``segment``: the
        item's segment label, if its task has segments."""
        candidates = tuple(zip(consensus.classes, consensus.counts, strict=True))
        served_rank = None
        if served is not None:
            if served in consensus.classes:
                served_rank = consensus.classes.index(served) + 1
            else:
                candidates += ((served, 0),)
                served_rank = len(candidates)
        return cls(
            item_id=item_id,
            model=model,
            task=task,
            query=query,
            candidates=candidates,
            k=consensus.k,
            inclusion_probability=inclusion_probability,
            sampled_at=sampled_at,
            thresholds=thresholds,
            aci_threshold=aci_threshold,
            reask_changes=dict(reask_changes or {}),
            api=api,
            served_rank=served_rank,
            segment=segment,
        )

    @property
    def consensus(self) -> Consensus:
        """The ranked candidates (an unranked served candidate, count 0, left out)."""
        ranked = [(c, n) for c, n in self.candidates if n > 0]
        return Consensus(tuple(c for c, _ in ranked), tuple(n for _, n in ranked))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["candidates"] = [
            {"rank": i + 1, "answer": c, "count": n} for i, (c, n) in enumerate(self.candidates)
        ]
        # JSON has no infinity: an infinite threshold (the full set) is the string "inf".
        d["thresholds"] = {f"{a:g}": _finite_or_inf(v) for a, v in self.thresholds}
        if self.aci_threshold is None:
            del d["aci_threshold"]
        else:
            d["aci_threshold"] = _finite_or_inf(self.aci_threshold)
        if self.reask_changes:
            d["reask_changes"] = {k: dict(v) for k, v in self.reask_changes.items()}
        else:
            del d["reask_changes"]
        if self.served_rank is None:
            del d["served_rank"]
        if self.segment is None:
            del d["segment"]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ReviewItem:
        try:
            return cls(
                item_id=str(d["item_id"]),
                model=str(d["model"]),
                task=str(d["task"]),
                query=str(d.get("query", "")),
                candidates=tuple((str(c["answer"]), int(c["count"])) for c in d["candidates"]),
                k=int(d["k"]),
                inclusion_probability=float(d["inclusion_probability"]),
                sampled_at=float(d["sampled_at"]),
                # Both optional: items written before the self-check existed have none.
                thresholds=tuple(
                    sorted((float(a), float(v)) for a, v in dict(d.get("thresholds") or {}).items())
                ),
                aci_threshold=(
                    None if d.get("aci_threshold") is None else float(d["aci_threshold"])
                ),
                reask_changes=_reask_changes(d.get("reask_changes")),
                api=str(d.get("api") or "openai.chat"),  # items before the fourth round
                served_rank=_served_rank(d.get("served_rank"), len(d["candidates"])),
                segment=_segment(d.get("segment")),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # Overflow: Infinity
            raise InputError(f"malformed review item: {exc}") from None


@dataclass(frozen=True, slots=True)
class Verdict:
    """``accepted_ranks`` (1-based) or ``none_of_these`` with an optional correct answer."""

    item_id: str
    accepted_ranks: tuple[int, ...] = ()
    none_of_these: bool = False
    correct_answer: str | None = None
    reviewer: str = "unknown"
    extra: dict[str, Any] = field(default_factory=dict)
    position: tuple[int, ...] | None = None
    """Where a durable log holds this verdict (Kafka: timestamp, partition, offset): its
    order key in the calibration window. Not part of the verdict's JSON."""

    def to_json(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "accepted_ranks": list(self.accepted_ranks),
            "none_of_these": self.none_of_these,
            "correct_answer": self.correct_answer,
            "reviewer": self.reviewer,
        }


def same_judgement(a: Verdict, b: Verdict) -> bool:
    """Whether two verdicts on one item judge it alike (the same accepted ranks, or both
    "none of these" with the same correct answer), whoever gave them: a second verdict
    that judges alike repeats the first, one that does not conflicts with it."""
    return (
        a.item_id == b.item_id
        and sorted(set(a.accepted_ranks)) == sorted(set(b.accepted_ranks))
        and a.none_of_these == b.none_of_these
        and (a.correct_answer or "").strip() == (b.correct_answer or "").strip()
    )


def reviewer_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an authenticated reviewer (a per-reviewer token's name, an
    auth proxy's header), None if it can: 1 to :data:`MAX_REVIEWER_CHARS` printable
    characters (no controls, no bidi overrides), valid Unicode."""
    if not name.strip():
        return "is empty"
    if len(name) > MAX_REVIEWER_CHARS:
        return f"is over the limit of {MAX_REVIEWER_CHARS} characters"
    if not is_text(name) or not name.isprintable():
        return "holds characters that are not printable (or not valid Unicode)"
    return None


def _check_size(name: str, size: int, limit: int, unit: str = "characters") -> None:
    if size > limit:
        raise TooLargeError(f"'{name}' has {size} {unit}, over the limit of {limit}")


def check_item_id_size(item_id: str) -> None:
    """:class:`TooLargeError` if ``item_id`` is over :data:`MAX_ITEM_ID_CHARS`."""
    _check_size("item_id", len(item_id), MAX_ITEM_ID_CHARS)


def parse_verdict(obj: Any, *, item_id: str | None = None, max_rank: int | None = None) -> Verdict:
    """Validate a verdict body; ``item_id`` from the URL wins over the body's.

    :class:`InputError` for a malformed verdict; :class:`TooLargeError` (one of them)
    for a verdict or a field over its size limit (the ``MAX_*`` constants above).
    """
    if isinstance(obj, bytes | str):
        size = len(obj if isinstance(obj, bytes) else obj.encode("utf-8", "surrogatepass"))
        if size > MAX_VERDICT_BYTES:
            raise TooLargeError(
                f"verdict of {size} bytes is over the limit of {MAX_VERDICT_BYTES} bytes"
            )
        try:
            obj = json.loads(obj)
        except (ValueError, RecursionError):  # also a number over 4,300 digits
            raise InputError("verdict is not valid JSON") from None
    if not isinstance(obj, dict):
        raise InputError("verdict must be a JSON object")
    vid = item_id if item_id is not None else obj.get("item_id")
    if not is_text(vid) or not vid:
        raise InputError("verdict needs an 'item_id'")
    check_item_id_size(vid)
    ranks = obj.get("accepted_ranks", [])
    if isinstance(ranks, list):
        _check_size("accepted_ranks", len(ranks), MAX_ACCEPTED_RANKS, "entries")
    if not isinstance(ranks, list) or not all(
        isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ranks
    ):
        raise InputError("'accepted_ranks' must be a list of ranks >= 1")
    if max_rank is not None and any(r > max_rank for r in ranks):
        raise InputError(f"'accepted_ranks' has a rank above the {max_rank} candidates")
    none = obj.get("none_of_these", False)
    if not isinstance(none, bool):
        raise InputError("'none_of_these' must be true or false")
    if none and ranks:
        raise InputError("a verdict cannot accept ranks and be 'none of these'")
    if not none and not ranks:
        raise InputError("a verdict must accept at least one rank or be 'none of these'")
    correct = obj.get("correct_answer")
    if correct is not None and not is_text(correct):
        raise InputError("'correct_answer' must be a string")
    if correct is not None:
        _check_size("correct_answer", len(correct), MAX_CORRECT_ANSWER_CHARS)
    reviewer = obj.get("reviewer", "unknown")
    if not is_text(reviewer):
        raise InputError("'reviewer' must be a string")
    _check_size("reviewer", len(reviewer), MAX_REVIEWER_CHARS)
    return Verdict(
        item_id=vid,
        accepted_ranks=tuple(sorted(set(ranks))),
        none_of_these=none,
        correct_answer=correct,
        reviewer=reviewer,
    )


def verdict_score(
    item: ReviewItem,
    verdict: Verdict,
    canonicalizer: Canonicalizer | None = None,
    context: QueryContext | None = None,
) -> float:
    """The rank score the verdict gives the item: the smallest accepted rank.

    "None of these" scores ``inf`` unless its correct answer canonicalizes to one of the
    candidates (a reviewer who typed the answer instead of clicking it).
    """
    consensus = item.consensus
    if verdict.accepted_ranks:
        valid = [r for r in verdict.accepted_ranks if r <= len(consensus.classes)]
        acceptable: Sequence[str] = [consensus.classes[r - 1] for r in valid]
        return rank_score(consensus, [c for c in acceptable if c != INVALID])
    if verdict.correct_answer is not None and canonicalizer is not None:
        return rank_score(consensus, [canonicalizer.canonicalize(verdict.correct_answer, context)])
    return math.inf


def served_acceptable(
    item: ReviewItem,
    verdict: Verdict,
    score: float,
    canonicalizer: Canonicalizer | None = None,
    context: QueryContext | None = None,
) -> bool | None:
    """Whether ``verdict`` (which gave the item ``score``) accepted the class of the answer
    production served; None when the item has no served answer.

    Accepted ranks accept it when they name its candidate. A "none of these" with a
    correct answer accepts it when that answer is its class: for a ranked class, when the
    score is its rank (the answer matched it); for the unranked one, by ``canonicalizer``
    (none: not accepted). ``<INVALID>`` is never acceptable.
    """
    rank = item.served_rank
    if rank is None:
        return None
    served, count = item.candidates[rank - 1]
    if served == INVALID:
        return False
    if verdict.accepted_ranks:
        return rank in verdict.accepted_ranks
    if verdict.correct_answer is None:
        return False
    if count > 0:
        return score == rank
    if canonicalizer is None:
        return False
    return canonicalizer.canonicalize(verdict.correct_answer, context) == served


def aci_miss(item: ReviewItem, score: float) -> bool | None:
    """The ACI step of the item's verdict: did ``score`` exceed the threshold served at
    alpha_t when the item was scored? ``None`` when it was scored without ACI."""
    return None if item.aci_threshold is None else score > item.aci_threshold


@dataclass(frozen=True, slots=True)
class TaskProgress:
    """A task's calibration state, as the page's progress table shows it."""

    model: str
    task: str
    calibration_items: int
    effective_items: float
    minimum_items: int
    threshold_finite: bool


def minimum_calibration_items(alpha: float) -> int:
    """The fewest equally weighted calibration items with a finite threshold at
    ``alpha``: the smallest n whose order statistic k = ceil((n+1)(1-alpha)) is <= n
    (about 1/alpha - 1: 9 at alpha = 0.1, 19 at alpha = 0.05)."""
    n = max(0, math.ceil(1.0 / alpha) - 3)
    while quantile_index(n, alpha) > n:
        n += 1
    return n
