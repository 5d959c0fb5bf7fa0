"""The ``regex`` canonicalizer: extract with a pattern, then canonicalize what it caught.

Options:

* ``pattern`` (required) — a Python regular expression. What it extracts: the named
  group ``answer`` if the pattern has one, else group 1 if it has groups, else the whole
  match. A match in which that group did not take part is skipped.
* ``which`` — ``"last"`` (default) or ``"first"`` match.
* ``flags`` — letters among ``i`` (ignore case), ``m`` (multiline), ``s`` (dot matches
  newline), ``x`` (verbose), ``a`` (ASCII classes).
* ``then`` — the canonicalizer applied to the extract: a registered name or import
  path (default ``"text"``), built with ``then_options``; or a canonicalizer object.
  Names are resolved by the registry (``get_canonicalizer("regex", then="numeric")``);
  the class itself takes the built object (default: :class:`TextCanonicalizer`).

No match → :data:`INVALID`. A pattern that does not compile, unknown flags or a bad
``which`` raise :class:`~monitor.core.errors.ConfigError` at construction. The pattern runs
on every answer: the user who writes it keeps it free of catastrophic backtracking.
"""

from __future__ import annotations

import re
from typing import Final

from monitor.core.canon.base import INVALID, Canonicalizer, QueryContext
from monitor.core.canon.text import TextCanonicalizer
from monitor.core.errors import ConfigError

__all__ = ["RegexCanonicalizer"]

_FLAGS: Final = {
    "i": re.IGNORECASE,
    "m": re.MULTILINE,
    "s": re.DOTALL,
    "x": re.VERBOSE,
    "a": re.ASCII,
}


class RegexCanonicalizer:
    """Pattern extraction followed by another canonicalizer; see the module docstring."""

    def __init__(
        self,
        *,
        pattern: str | None = None,
        then: Canonicalizer | None = None,
        which: str = "last",
        flags: str = "",
    ) -> None:
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError("regex: the option 'pattern' is required (a regular expression)")
        if which not in ("first", "last"):
            raise ConfigError(f"regex: which must be 'first' or 'last', not {which!r}")
        unknown = sorted(set(flags) - set(_FLAGS))
        if unknown:
            raise ConfigError(f"regex: unknown flags {''.join(unknown)!r}; use some of 'imsxa'")
        bits = 0
        for letter in flags:
            bits |= _FLAGS[letter]
        try:
            self._pattern = re.compile(pattern, bits)
        except re.error as exc:
            raise ConfigError(f"regex: bad pattern {pattern!r}: {exc}") from exc
        if "answer" in self._pattern.groupindex:
            self._group: int | str = "answer"
        else:
            self._group = 1 if self._pattern.groups else 0
        self._first = which == "first"
        self._then: Canonicalizer = then if then is not None else TextCanonicalizer()

    @property
    def name(self) -> str:
        return "regex"

    @property
    def redact_canonical_only(self) -> bool:
        """As ``then`` declares (see :mod:`monitor.core.redaction`)."""
        return bool(getattr(self._then, "redact_canonical_only", False))

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        extract: str | None = None
        for m in self._pattern.finditer(answer):
            group = m.group(self._group)
            if group is not None:
                extract = group
                if self._first:
                    break
        if extract is None:
            return INVALID
        return self._then.canonicalize(extract, context)
