"""The canonicalizer interface.

A canonicalizer maps a raw answer (and, optionally, what is known of the query) to a
canonical class: a short string such that two answers that mean the same thing get
the same string (paper §3.2, appendix A). An answer that cannot be parsed maps to
:data:`INVALID`, which is a class of its own and never an acceptable one.

Two kinds exist:

* :class:`Canonicalizer` is pure and synchronous and looks at one answer at a time
  (``numeric``, ``mcq``, ``text``, ``json``, ``regex``).
* :class:`AsyncCanonicalizer` needs I/O and sees all of an item's answers at once,
  because it groups them jointly (``embedding`` clusters by cosine similarity, ``llm``
  asks a judge endpoint). To place a label in the same classes as the answers, pass
  the labels along in the same call: ``canonicalize_many([*answers, *labels])``.

:func:`as_async` lets the service treat both kinds alike.

Either kind may set ``redact_canonical_only = True`` when its canonical form keeps what
the redaction rules match (or drops it): the service then redacts only the canonical
classes, not the raw answers it passes in (:mod:`monitor.core.redaction`). Without it, the
raw answers are redacted before the canonicalizer sees them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

__all__ = [
    "INVALID",
    "AsyncCanonicalizer",
    "Canonicalizer",
    "QueryContext",
    "as_async",
    "per_answer",
]

INVALID: Final = "<INVALID>"
"""The class of answers that could not be parsed."""


@dataclass(frozen=True, slots=True)
class QueryContext:
    """What a canonicalizer may know about the query besides the answer.

    ``options`` maps option letters to option texts for multiple-choice questions
    (``{"A": "Paris", "B": "London"}``).
    """

    query: str | None = None
    options: Mapping[str, str] | None = None


@runtime_checkable
class Canonicalizer(Protocol):
    """A pure, per-answer canonicalizer."""

    @property
    def name(self) -> str:
        """The registry name (``"numeric"``) or import path it was built from."""
        ...

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        """The canonical class of ``answer``; :data:`INVALID` if it cannot be parsed."""
        ...


@runtime_checkable
class AsyncCanonicalizer(Protocol):
    """A canonicalizer that needs I/O and groups an item's answers jointly."""

    @property
    def name(self) -> str: ...

    async def canonicalize_many(
        self, answers: Sequence[str], context: QueryContext | None = None
    ) -> list[str]:
        """One class per answer, in order; equal strings mean the same class."""
        ...


def per_answer(canonicalizer: AsyncCanonicalizer) -> bool:
    """Whether ``canonicalizer`` gives each answer a class that depends on that answer
    (and the query) alone, as a :class:`Canonicalizer` does: then the engine gives it only
    each batch's new answers, not an item's every answer again after every batch. One
    that groups answers jointly (embedding clusters, an LLM judge) has no such
    ``per_answer`` attribute, or has it false."""
    return bool(getattr(canonicalizer, "per_answer", False))


class _SyncAsAsync:
    """Wraps a :class:`Canonicalizer` as an :class:`AsyncCanonicalizer`."""

    per_answer = True

    def __init__(self, inner: Canonicalizer) -> None:
        self._inner = inner

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def redact_canonical_only(self) -> bool:
        return bool(getattr(self._inner, "redact_canonical_only", False))

    async def canonicalize_many(
        self, answers: Sequence[str], context: QueryContext | None = None
    ) -> list[str]:
        return [self._inner.canonicalize(a, context) for a in answers]


def as_async(canonicalizer: Canonicalizer | AsyncCanonicalizer) -> AsyncCanonicalizer:
    """``canonicalizer`` itself if it is already asynchronous, else a wrapper."""
    if isinstance(canonicalizer, Canonicalizer):
        return _SyncAsAsync(canonicalizer)
    return canonicalizer
