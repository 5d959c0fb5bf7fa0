"""The ``text`` canonicalizer: SQuAD-style normalisation of short free-text answers.

Rules, in order:

1. Unicode NFKC (fullwidth and compatibility forms fold to their plain letters), then
   ``str.casefold`` (``"Straße"`` → ``"strasse"``), then NFKC again.
2. Punctuation and symbols are deleted, not replaced by a space, as SQuAD does
   (``"don't"`` → ``"dont"``, ``"U.S."`` → ``"us"``). Unicode-aware: every character in
   the categories P* (punctuation), S* (symbols: ``$``, ``+``, ``°``, emoji) and Cf
   (zero-width and other format characters) goes.
3. The English articles *a*, *an*, *the* are dropped as whole words (``articles=True``).
4. Whitespace runs collapse to one space; the ends are stripped.

An answer with nothing left (empty, only punctuation, only articles) is :data:`INVALID`.
"""

from __future__ import annotations

import unicodedata
from typing import Final

from monitor.core.canon.base import INVALID, QueryContext

__all__ = ["TextCanonicalizer", "normalize_text"]

_ARTICLES: Final = frozenset({"a", "an", "the"})
_DROPPED_CATEGORIES: Final = frozenset({"P", "S"})


def _keep(ch: str) -> bool:
    if ch.isalnum() or ch.isspace():
        return True
    category = unicodedata.category(ch)
    return category[0] not in _DROPPED_CATEGORIES and category != "Cf"


def normalize_text(text: str, *, articles: bool = True) -> str:
    """``text`` normalised by the rules of the module docstring (possibly ``""``)."""
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    words = "".join(ch for ch in text if _keep(ch)).split()
    if articles:
        words = [w for w in words if w not in _ARTICLES]
    # Deleting a character can bring a combining mark next to a letter: recompose.
    return unicodedata.normalize("NFKC", " ".join(words))


class TextCanonicalizer:
    """Normalised text; see the module docstring for the rules."""

    def __init__(self, *, articles: bool = True) -> None:
        self._articles = articles

    @property
    def name(self) -> str:
        return "text"

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        return normalize_text(answer, articles=self._articles) or INVALID
