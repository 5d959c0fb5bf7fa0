"""The ``mcq`` canonicalizer: the option letter a multiple-choice answer picks.

The valid letters are ``letters`` (default ``"ABCDEFGHIJ"``), or the keys of
``context.options`` when the query's options are known. The output is the uppercase
letter. Rules, first that applies wins:

1. **Explicit statement** — the last "answer is X", "answer: (X)", "correct option is
   X", "the answer is option X" ... An uppercase X always counts ("I think the answer
   is A" → A); a lowercase x only when nothing but punctuation follows it ("answer is
   b." → B; "the answer is a bit unclear" is no statement). A stated letter that is not
   valid gives :data:`INVALID` (the model committed to it).
2. **The whole answer is a letter**: ``B``, ``b``, ``(B)``, ``B)``, ``B.``, ``[B]``,
   ``**B**``.
3. **The whole answer is an option's text** (needs ``context.options``), compared
   after :func:`~monitor.core.canon.text.normalize_text` ("paris" ↔ "Paris.").
4. **The answer opens with a letter label**: ``B) Paris``, ``B. Paris``, ``B: Paris``,
   ``(B) Paris``, ``Option B - Paris``.
5. **The last letter mentioned**: an uppercase letter standing alone (``(C)``, ``**C**``,
   ``C is right``), or a letter after "option"/"choice". The article and pronoun
   readings of ``A`` and ``I`` are skipped: followed by a lowercase word they count only
   when that word is a verb such as "is", "seems" ("A good choice is C" → C; "A is
   correct" → A). Abbreviations (``U.S.``) and compounds (``T-shirt``, ``A's``) are
   not letters.
6. **The answer mentions exactly one option's text** as a whole phrase (needs
   ``context.options``; an option whose text lies inside another matched option's text
   yields to it).

Nothing found → :data:`INVALID`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from monitor.core.canon.base import INVALID, QueryContext
from monitor.core.canon.text import normalize_text
from monitor.core.errors import ConfigError

__all__ = ["McqCanonicalizer"]

_STATEMENT: Final = re.compile(
    r"\b(?:answer|(?:correct|right|best|final)\s+(?:option|choice|letter))\b"
    r"(?:\s+|[*_:=\"'`]|\b(?:is|was|would|will|should|be|must|probably|likely|definitely"
    r"|clearly|therefore|thus|then|simply|option|choice|letter)\b){0,12}+"
    r"(?P<open>[(\[{][ ]?)?(?P<letter>[A-Za-z])(?![A-Za-z0-9'’-])",
    re.IGNORECASE,
)
_LOWER_END: Final = re.compile(r"\s*(?:$|[.,;:!?)\]}*\"'])")
_BARE_STRIP: Final = " \t\r\n*_()[]{}.:;,!\"'`"
_LEADING: Final = re.compile(
    r"[\s*_#>]*(?:(?:option|choice)\s+)?[(\[]?(?P<letter>[A-Za-z])"
    r"(?:[)\].:][*_]*|\s+[-–—])(?:\s|$)",
    re.IGNORECASE,
)
_CANDIDATE: Final = re.compile(
    r"\b(?i:options?|choices?)\b\s*(?P<open>[(\[]\s*)?(?P<opt>[A-Za-z])(?![A-Za-z0-9'’-])"
    r"|(?<![A-Za-z0-9'’])(?P<bare>[A-Z])(?![A-Za-z0-9'’-]|\.[A-Za-z])"
)
_PROSE_WORD: Final = re.compile(r"\s+(?P<word>[a-z]+)")
_VERBS: Final = frozenset(
    {"is", "was", "seems", "seemed", "looks", "appears", "would", "should", "must", "might"}
    | {"could", "can", "will", "fits", "matches", "holds", "remains", "wins"}
)


class McqCanonicalizer:
    """The chosen option letter; see the module docstring for the rules."""

    redact_canonical_only: Final = True
    """A letter carries nothing of the answer to redact (see :mod:`monitor.core.redaction`)."""

    def __init__(self, *, letters: str = "ABCDEFGHIJ") -> None:
        upper = letters.upper()
        if not upper or not all("A" <= ch <= "Z" for ch in upper) or len(set(upper)) != len(upper):
            raise ConfigError(
                f"mcq: letters must be distinct ASCII letters such as 'ABCD', not {letters!r}"
            )
        self._letters = frozenset(upper)

    @property
    def name(self) -> str:
        return "mcq"

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        options = _upper_keys(context.options) if context and context.options else None
        valid = frozenset(options) if options is not None else self._letters
        letter = self._letter(answer, valid, options)
        return letter if letter is not None and letter in valid else INVALID

    def _letter(
        self, answer: str, valid: frozenset[str], options: Mapping[str, str] | None
    ) -> str | None:
        stated = _stated_letter(answer)
        if stated is not None:
            return stated
        bare = answer.strip(_BARE_STRIP)
        if len(bare) == 1 and bare.isascii() and bare.isalpha():
            return bare.upper()
        normalised = normalize_text(answer) if options is not None else ""
        if options is not None and normalised:
            for key, text in options.items():
                if normalize_text(text) == normalised:
                    return key
        leading = _LEADING.match(answer)
        if leading is not None and leading["letter"].upper() in valid:
            return leading["letter"].upper()
        mentioned = _last_mentioned(answer, valid)
        if mentioned is not None:
            return mentioned
        if options is not None and normalised:
            return _only_contained(normalised, options)
        return None


def _upper_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {key.strip().upper(): text for key, text in options.items()}


def _stated_letter(answer: str) -> str | None:
    found: str | None = None
    for m in _STATEMENT.finditer(answer):
        letter = m["letter"]
        if letter.islower() and m["open"] is None and not _LOWER_END.match(answer, m.end()):
            continue
        if letter == "I" and m["open"] is None and _is_prose(answer, m.end()):
            continue
        found = letter.upper()
    return found


def _is_prose(answer: str, end: int) -> bool:
    """Whether the capital letter ending at ``end`` reads as an article or pronoun."""
    follow = _PROSE_WORD.match(answer, end)
    return follow is not None and follow["word"] not in _VERBS


def _last_mentioned(answer: str, valid: frozenset[str]) -> str | None:
    found: str | None = None
    for m in _CANDIDATE.finditer(answer):
        if m["opt"] is not None:
            letter = m["opt"]
            if letter.islower() and m["open"] is None and not _LOWER_END.match(answer, m.end()):
                continue
            letter = letter.upper()
        else:
            letter = m["bare"]
            if letter in ("A", "I") and _is_prose(answer, m.end()):
                continue
        if letter in valid:
            found = letter
    return found


def _only_contained(normalised: str, options: Mapping[str, str]) -> str | None:
    padded = f" {normalised} "
    hits = {
        key: text
        for key, text in ((k, normalize_text(v)) for k, v in options.items())
        if text and f" {text} " in padded
    }
    maximal = [
        key
        for key, text in hits.items()
        if not any(other != text and f" {text} " in f" {other} " for other in hits.values())
    ]
    return maximal[0] if len(maximal) == 1 else None
