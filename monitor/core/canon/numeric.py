"""The ``numeric`` canonicalizer: the final number of an answer as an exact, stable string.

Which number (first rule that applies wins):

1. **GSM8K marker** — the number right after the last ``####`` (option ``marker``;
   ``None`` turns it off). A marker whose number opens a numbered heading
   (``#### 3. Compute the total``) is not a marker.
2. **LaTeX box** — the last number inside the last ``\\boxed{...}`` (or ``\\fbox``).
   The box is the model's commitment: a box without a number gives :data:`INVALID`.
3. **Answer phrase** — the number right after the last "answer is", "answer:",
   "final answer =" ... (filler such as ``**``, ``$``, "approximately" may sit between).
4. Otherwise the **last number anywhere**.

How a number is read:

* Exact arithmetic (:class:`fractions.Fraction`); ``42.0``, ``42.00`` → ``42``.
* Thousands separators: commas only, and only between groups of exactly three digits
  (``1,234,567`` → ``1234567``). ``1,2,3`` and ``100, 200`` are several numbers; a
  decimal comma (``3,5``) is not understood. ``100,200,300`` is one number (by the rule).
* Signs: ``-``, unicode minus ``−`` and fullwidth minus; ``+7`` → ``7``; ``-0`` → ``0``.
  A ``-`` glued to a word or number before it is a hyphen (``GPT-4`` → 4, ``3-5`` → 5).
* A number glued to letters *before* it is not a number (``v2``, ``H2O``); glued units
  after it are fine (``42kg``). A trailing period is punctuation (``42.`` → ``42``).
* Currency symbols before the number are ignored (``$42``, ``€1,000``, ``-$5``).
* Fractions ``a/b`` (integers, no spaces) are exact: ``1/2`` → ``0.5``, ``1/3`` →
  ``1/3``. ``\\frac{a}{b}``, ``\\dfrac``, ``\\tfrac`` and vulgar fractions (``½``) too.
  A number right after a ``/`` is not a number on its own (dates ``1/2/2024`` read as 1).
* **Mixed numbers**: a whole number, one space and a *proper* fraction (``0 < a < b``)
  are one number: ``2 1/2`` → ``2.5`` (``3 1/2 cups`` is read as 3.5, never as 1/2).
  With an improper fraction (``3 4/2``) they stay two numbers (3 and 2).
* Scientific notation: ``1.5e3``, ``1.5 × 10^3``, ``1.5 \\times 10^{3}`` → ``1500``.
* Percent: ``42%``, ``42 percent`` → ``42`` with ``percent="strip"`` (default), ``0.42``
  with ``percent="fraction"``.
* Unicode decimal digits of any script are read (``٤٢``, fullwidth ``４２``).
* Numbers with more than 1000 digits in a run, or exponents beyond ±1000, are not
  read (they are never answers, and they would cost time).

Output: an integer (``"1500"``, ``"-3"``); otherwise a plain decimal when the value has a
finite decimal expansion (``"0.5"``, ``"-3.25"``); otherwise the reduced fraction
``"p/q"`` (``"1/3"``, ``"-2/7"``). Never an exponent, a comma or ``"-0"``; equal values
give equal strings, and every output canonicalizes to itself.

Not understood (use ``regex`` or ``text``): powers, roots and constants (``2^{10}``,
``\\sqrt{2}``, ``\\pi``), decimal commas, space-grouped thousands, number and scale words
("twelve", "1.5 million" → 1.5), times (``3:45`` → 45), European ``1.234,5``.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Final

from monitor.core.canon.base import INVALID, QueryContext
from monitor.core.errors import ConfigError

__all__ = ["NumericCanonicalizer", "format_number"]

MAX_DIGITS: Final = 1000
"""Longest run of digits read or written."""

MAX_EXPONENT: Final = 1000
"""Largest absolute decimal exponent read."""

_MAX_BITS: Final = 3400  # a little more than MAX_DIGITS decimal digits; keeps str() cheap
_MINUS: Final = frozenset("-\u2212\uff0d\ufe63")
_SIGN: Final = "[-+\u2212\uff0d\ufe63]"
_SLASH: Final = "[/\u2044\u2215]"
_VULGAR: Final[dict[str, tuple[int, int]]] = {
    "¼": (1, 4),
    "½": (1, 2),
    "¾": (3, 4),
    "⅐": (1, 7),
    "⅑": (1, 9),
    "⅒": (1, 10),
    "⅓": (1, 3),
    "⅔": (2, 3),
    "⅕": (1, 5),
    "⅖": (2, 5),
    "⅗": (3, 5),
    "⅘": (4, 5),
    "⅙": (1, 6),
    "⅚": (5, 6),
    "⅛": (1, 8),
    "⅜": (3, 8),
    "⅝": (5, 8),
    "⅞": (7, 8),
}

# Every alternative is linear: the lookbehinds stop a match from starting inside a run
# of digits, so a run is consumed once per alternative and the scan stays O(n).
_PREFIX: Final = (
    r"(?<![A-Za-z_\d/\u2044\u2215])(?<!\d\.)"  # not glued to a word, number or slash
    rf"(?P<sign1>{_SIGN})?"
    r"(?:[$€£¥₹₩₽][ ]?)?"
    rf"(?P<sign2>{_SIGN})?"
)
_MIXED: Final = rf"(?P<whole>\d+)[ \u00a0](?P<mnum>\d+){_SLASH}(?P<mden>\d+)(?!{_SLASH}|\d|\.\d)"
_FRACTION: Final = rf"(?P<num>\d+){_SLASH}(?P<den>\d+)(?!{_SLASH}|\d|\.\d)"
_VULGAR_RE: Final = rf"(?:(?P<vwhole>\d+)[ ]?)?(?P<vulgar>[{''.join(_VULGAR)}])"
_DECIMAL: Final = (
    r"(?:(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.(?P<frac>\d+))?|\.(?P<frac_only>\d+))"
    r"(?:[eE](?P<exp>[-+\u2212]?\d+)"
    r"|[ ]?(?:[x×*·]|\\times|\\cdot)[ ]?10\^\{?(?P<exp10>[-+\u2212]?\d+)\}?)?"
)
_PERCENT: Final = r"(?P<pct>[ ]?(?:\\?%|(?i:percent|per[ ]cent)\b))?"

_NUMBER: Final = re.compile(
    _PREFIX + f"(?:{_MIXED}|{_FRACTION}|{_VULGAR_RE}|{_DECIMAL})" + _PERCENT
)
_NUMBER_NO_MIXED: Final = re.compile(
    _PREFIX + f"(?:{_FRACTION}|{_VULGAR_RE}|{_DECIMAL})" + _PERCENT
)

_LATEX_FRAC: Final = re.compile(
    r"\\[dt]?frac\s*(?:"
    r"\{\s*(?P<a>[-+\u2212]?\d+(?:\.\d+)?)\s*\}\s*\{\s*(?P<b>[-+\u2212]?\d+(?:\.\d+)?)\s*\}"
    r"|(?P<c>\d)(?P<d>\d))"
)
_LATEX_CLEANUP: Final = re.compile(
    r"\{,\}|(?<=\d)\\,(?=\d{3})|\\[!;:]|\\left\b|\\right\b|\^\{?\\circ\}?|\\(?=[%$])"
)
_BOX: Final = re.compile(r"\\(?:boxed|fbox)\b")
_ANSWER_PHRASE: Final = re.compile(
    r"\b(?:final\s+answer|answer)\b"
    r"(?:\s+|[*_:=$(\[{~≈\"'`]|\\[(\[]|\\approx\b|approx\."
    r"|\b(?:is|was|would|will|should|be|equals|equal\s+to|of|approx|approximately|about"
    r"|around|roughly|exactly|precisely|therefore|thus|then|just|simply|only)\b){0,16}+",
    re.IGNORECASE,
)
_HEADING_TAIL: Final = re.compile(r"[ \t]*[.):][ \t]*[^\W\d]")


def format_number(value: Fraction) -> str | None:
    """The canonical string of ``value``, or ``None`` if it would be too long to read back.

    Integers as integers, finite decimals as plain decimals, others as ``"p/q"``.
    """
    num, den = value.numerator, value.denominator
    sign = "-" if num < 0 else ""
    num = abs(num)
    if num.bit_length() > _MAX_BITS or den.bit_length() > _MAX_BITS:
        return None
    if den == 1:
        text = str(num)
        return sign + text if len(text) <= MAX_DIGITS else None
    twos = (den & -den).bit_length() - 1
    rest = den >> twos
    fives = 0
    while rest % 5 == 0:
        rest //= 5
        fives += 1
    if rest == 1:
        places = max(twos, fives)
        digits = str(num * 10**places // den).rjust(places + 1, "0")
        whole, frac = digits[:-places], digits[-places:].rstrip("0")
        if len(whole) <= MAX_DIGITS and len(frac) <= MAX_DIGITS:
            return f"{sign}{whole}.{frac}"
    top, bottom = str(num), str(den)
    if len(top) <= MAX_DIGITS and len(bottom) <= MAX_DIGITS:
        return f"{sign}{top}/{bottom}"
    return None


def _int(digits: str) -> int | None:
    """``int(digits)`` for a digit run of at most :data:`MAX_DIGITS` (any script)."""
    return int(digits) if len(digits) <= MAX_DIGITS else None


def _exponent(text: str) -> int | None:
    value = _int(text.lstrip("-+\u2212"))
    if value is None or value > MAX_EXPONENT:
        return None
    return -value if text[:1] in _MINUS else value


def _is_proper(match: re.Match[str]) -> bool:
    """Whether a mixed-number match has a proper fraction part (``0 < a < b``)."""
    num, den = _int(match["mnum"]), _int(match["mden"])
    return num is not None and den is not None and 0 < num < den


def _unsigned_value(m: re.Match[str]) -> Fraction | None:
    if m["whole"] is not None:
        parts = _int(m["whole"]), _int(m["mnum"]), _int(m["mden"])
        if parts[0] is None or parts[1] is None or not parts[2]:
            return None
        return parts[0] + Fraction(parts[1], parts[2])
    if m["num"] is not None:
        num, den = _int(m["num"]), _int(m["den"])
        return None if num is None or not den else Fraction(num, den)
    if m["vulgar"] is not None:
        whole = _int(m["vwhole"]) if m["vwhole"] is not None else 0
        return None if whole is None else whole + Fraction(*_VULGAR[m["vulgar"]])
    int_part = (m["int"] or "0").replace(",", "")
    frac_part = m["frac"] or m["frac_only"] or ""
    mantissa = _int(int_part + frac_part) if len(frac_part) <= MAX_DIGITS else None
    if mantissa is None:
        return None
    exp_text = m["exp"] or m["exp10"]
    exponent = _exponent(exp_text) if exp_text is not None else 0
    if exponent is None:
        return None
    shift = exponent - len(frac_part)
    return Fraction(mantissa * 10**shift) if shift >= 0 else Fraction(mantissa, 10**-shift)


def _normalise_latex(text: str) -> str:
    """Rewrite the LaTeX that numbers come wrapped in into plain text."""
    if "\\" not in text and "{,}" not in text:
        return text
    text = _LATEX_CLEANUP.sub(lambda m: "," if m[0] in ("{,}", "\\,") else "", text)

    def frac(m: re.Match[str]) -> str:
        top, bottom = (m["a"], m["b"]) if m["a"] is not None else (m["c"], m["d"])
        if len(top) > MAX_DIGITS or len(bottom) > MAX_DIGITS:
            return m[0]
        den = Fraction(bottom.replace("\u2212", "-"))
        if den == 0:
            return m[0]
        value = Fraction(top.replace("\u2212", "-")) / den
        lead = " " if m.start() > 0 and text[m.start() - 1].isdigit() else ""
        return f"{lead}{value.numerator}/{value.denominator}"

    return _LATEX_FRAC.sub(frac, text)


def _box_content(text: str, start: int) -> str:
    """The argument of the ``\\boxed`` command whose name ends at ``start``."""
    i = start
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text) or text[i] != "{":
        return text[i:]
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return text[i + 1 :]


class NumericCanonicalizer:
    """The final number of an answer, exactly; see the module docstring for the rules."""

    redact_canonical_only: Final = True
    """A number keeps its digits, so the digit rules (cards, long numbers) match the
    canonical form; redacting the answer first would turn a 13-digit answer into an
    unreadable ``[number]`` (see :mod:`monitor.core.redaction`)."""

    def __init__(self, *, percent: str = "strip", marker: str | None = "####") -> None:
        if percent not in ("strip", "fraction"):
            raise ConfigError(f"numeric: percent must be 'strip' or 'fraction', not {percent!r}")
        if marker is not None and not marker.strip():
            raise ConfigError("numeric: marker must be a non-empty string or None")
        self._percent_fraction = percent == "fraction"
        self._marker = (
            re.compile(re.escape(marker) + r"[ \t]*(?:\*\*)?[ \t]*") if marker is not None else None
        )

    @property
    def name(self) -> str:
        return "numeric"

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        text = _normalise_latex(answer)
        value = self._extract(text)
        if value is None:
            return INVALID
        return format_number(value) or INVALID

    def _extract(self, text: str) -> Fraction | None:
        if self._marker is not None:
            found: Fraction | None = None
            for m in self._marker.finditer(text):
                token = _match_at(text, m.end())
                if token is None or _HEADING_TAIL.match(text, token.end()):
                    continue
                value = self._value(token)
                found = value if value is not None else found
            if found is not None:
                return found
        box: re.Match[str] | None = None
        for box in _BOX.finditer(text):  # noqa: B007 - the last box is wanted
            pass
        if box is not None:
            return self._last_number(_box_content(text, box.end()))
        phrase_value: Fraction | None = None
        for m in _ANSWER_PHRASE.finditer(text):
            token = _match_at(text, m.end())
            if token is not None:
                value = self._value(token)
                phrase_value = value if value is not None else phrase_value
        if phrase_value is not None:
            return phrase_value
        return self._last_number(text)

    def _last_number(self, text: str) -> Fraction | None:
        for token in reversed(_tokens(text)):
            value = self._value(token)
            if value is not None:
                return value
        return None

    def _value(self, m: re.Match[str]) -> Fraction | None:
        value = _unsigned_value(m)
        if value is None:
            return None
        if (m["sign1"] in _MINUS) != (m["sign2"] in _MINUS):
            value = -value
        if m["pct"] and self._percent_fraction:
            value /= 100
        return value


def _resolve(text: str, m: re.Match[str]) -> re.Match[str] | None:
    """``m``, re-read without the mixed-number form if its fraction is improper."""
    if m["whole"] is None or _is_proper(m):
        return m
    return _NUMBER_NO_MIXED.match(text, m.start())


def _match_at(text: str, pos: int) -> re.Match[str] | None:
    m = _NUMBER.match(text, pos)
    return _resolve(text, m) if m is not None else None


def _tokens(text: str) -> list[re.Match[str]]:
    """All number tokens of ``text``, left to right, in linear time."""
    tokens: list[re.Match[str]] = []
    pos = 0
    while (m := _NUMBER.search(text, pos)) is not None:
        token = _resolve(text, m)
        if token is None:  # pragma: no cover - the no-mixed pattern always matches a prefix
            pos = m.start() + 1
            continue
        tokens.append(token)
        pos = max(token.end(), token.start() + 1)
    return tokens
