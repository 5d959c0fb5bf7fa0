"""Redaction of what a reviewer is shown: regex rules applied to the query and the
candidate answers before a review item is stored or published (SQLite or Kafka). No I/O.

Shipped rules (:data:`BUILTIN_RULES`), each on by default and each replaced by a fixed
marker:

``email``      ``jane.doe@example.com`` → ``[email]``
``api_key``    ``sk-…``, ``pk_live_…``, ``AKIA…``, ``ghp_…``, ``xoxb-…`` → ``[secret]``
``bearer``     ``Bearer eyJhbGciOi…`` → ``Bearer [secret]``
``card``       13 to 19 digits (spaces or dashes allowed) that pass the Luhn check → ``[card]``
``phone``      ``+44 20 7946 0958``, ``(555) 123-4567``, ``555-123-4567`` → ``[phone]``
``long_number`` any other run of 13 or more digits (accounts, IBAN digits) → ``[number]``

A deployment adds its own rules (``name``, ``pattern``, ``replacement``) after the
shipped ones, or turns shipped ones off by listing only those it wants. Redacting
candidates keeps them distinct: two answers that become the same text are told apart
by their rank (``[email] (rank 2)``), so a verdict's ranks still mean what the
reviewer saw. Text that is not valid Unicode (lone surrogates) is repaired with
``?`` so that no store refuses it.

Answers are redacted twice (when ``answers`` is on): each raw answer *before* it is
canonicalized (:meth:`Redactor.redacts_before`), because a canonicalizer can destroy
what a rule matches (``text`` turns ``jane@example.com`` into ``janeexamplecom``) or
send the answer elsewhere (``llm`` asks a judge model); and the canonical classes
again when the review item is built (:meth:`Redactor.redact_consensus`). The class of
an answer is then ``canonicalize(redact(answer))``: a fixed, deterministic map like any
canonicalizer, so the conformal guarantee holds for it; answers that differ only in a
secret fall into one class. A canonicalizer whose canonical form keeps what the rules
match, or drops it, declares ``redact_canonical_only = True`` (``numeric``, ``mcq``,
``json``; ``regex`` when its ``then`` does): its raw answers are not redacted first,
since ``[number]`` in ``{"ts": 1700000000000}`` or ``2**50 = 1125899906842624`` would
make a valid answer unreadable, and only its canonical form is redacted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from monitor.core.canon.base import Canonicalizer, QueryContext
from monitor.core.consensus import Consensus
from monitor.core.errors import ConfigError

__all__ = ["BUILTIN_RULES", "RedactionRule", "Redactor", "luhn_valid"]


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum of a card number (digits only) is valid."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


@dataclass(frozen=True, slots=True)
class RedactionRule:
    """Replace every match of ``pattern`` with ``replacement`` (``\\1`` refers to groups);
    with ``accept``, only matches it returns true for. ``hint``, when set, is a cheap
    test that is false only for a text in which ``pattern`` cannot match (no ``@``, too
    few digits): the rule is then skipped, since most answers hold no secret."""

    name: str
    pattern: re.Pattern[str]
    replacement: str
    accept: Callable[[re.Match[str]], bool] | None = None
    hint: Callable[[str], bool] | None = None

    def apply(self, text: str) -> str:
        if self.hint is not None and not self.hint(text):
            return text
        if self.accept is None:
            return self.pattern.sub(self.replacement, text)
        accept = self.accept
        return self.pattern.sub(
            lambda m: m.expand(self.replacement) if accept(m) else m.group(0), text
        )


def _is_card(match: re.Match[str]) -> bool:
    digits = re.sub(r"\D", "", match.group(0))
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


# Hints of the shipped rules: exact necessary conditions, cheapest test first (a
# property test checks that a rule never matches where its hint is false).
_AKIA = re.compile("akia", re.IGNORECASE)
_DIGITS_4 = re.compile(r"(?:\D*+\d){4}")
_DIGITS_10 = re.compile(r"(?:\D*+\d){10}")
_DIGITS_13 = re.compile(r"(?:\D*+\d){13}")


def _email_hint(text: str) -> bool:
    return "@" in text


def _api_key_hint(text: str) -> bool:
    # Every alternative but AKIA + 16 has a "-" or "_". The rule is IGNORECASE, which
    # also matches a dotless i to I (str.lower() would not): search the same way.
    return "-" in text or "_" in text or (len(text) >= 20 and _AKIA.search(text) is not None)


def _bearer_hint(text: str) -> bool:
    # "bearer", a space and 8 characters; no other character matches b, e, a or r
    # under IGNORECASE, so lower() finds what the rule finds.
    return len(text) >= 15 and "bearer" in text.lower()


def _phone_hint(text: str) -> bool:
    # "+" and 4 digits at least, or 10 digits ("(555) 123-4567", "555-123-4567").
    if "+" in text and _DIGITS_4.match(text) is not None:
        return True
    return len(text) >= 10 and _DIGITS_10.match(text) is not None


def _digits_13_hint(text: str) -> bool:
    return len(text) >= 13 and _DIGITS_13.match(text) is not None


# fmt: off
BUILTIN_RULES: dict[str, RedactionRule] = {
    rule.name: rule
    for rule in (
        RedactionRule(
            "email", re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"), "[email]",
            hint=_email_hint,
        ),
        RedactionRule(
            "api_key",
            re.compile(
                r"\b(?:sk|pk|rk)[-_](?:live_|test_|proj-|ant-)?[A-Za-z0-9_-]{16,}"
                r"|\b(?:api|key|token|secret)[-_][A-Za-z0-9_-]{12,}"
                r"|\bAKIA[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{30,}\b"
                r"|\bxox[abposr]-[A-Za-z0-9-]{10,}",
                re.IGNORECASE,
            ),
            "[secret]",
            hint=_api_key_hint,
        ),
        RedactionRule(
            "bearer",
            re.compile(r"\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
            r"\1 [secret]",
            hint=_bearer_hint,
        ),
        RedactionRule(
            "card", re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"), "[card]", _is_card,
            hint=_digits_13_hint,
        ),
        RedactionRule(
            "phone",
            re.compile(
                r"(?<![\w+])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){1,4}"
                r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\d{3}[.-]\d{3}[.-]\d{4})(?![\w-])"
            ),
            "[phone]",
            hint=_phone_hint,
        ),
        RedactionRule(
            "long_number", re.compile(r"(?<!\d)(?:\d[ -]?){12,}\d(?!\d)"), "[number]",
            hint=_digits_13_hint,
        ),
    )
}
# fmt: on


def _repair(text: str) -> str:
    """Lone surrogates (from JSON ``\\ud800`` escapes) become ``?``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


class Redactor:
    """Rules applied in order to every text a reviewer will see."""

    def __init__(self, rules: Sequence[RedactionRule], *, answers: bool = True) -> None:
        self.rules = tuple(rules)
        self.answers = answers

    def __repr__(self) -> str:
        return f"Redactor(rules={[r.name for r in self.rules]!r}, answers={self.answers!r})"

    @classmethod
    def default(cls) -> Redactor:
        """Every shipped rule, on queries and answers."""
        return cls(list(BUILTIN_RULES.values()))

    @classmethod
    def from_config(
        cls,
        builtin: Iterable[str],
        custom: Iterable[tuple[str, str, str]] = (),
        *,
        answers: bool = True,
    ) -> Redactor:
        """Shipped rules by name, then ``(name, pattern, replacement)`` custom ones;
        a :class:`~monitor.core.errors.ConfigError` naming the rule for an unknown name or a
        bad pattern."""
        rules = []
        for name in builtin:
            if name not in BUILTIN_RULES:
                raise ConfigError(
                    f"unknown shipped rule {name!r}; shipped: {', '.join(BUILTIN_RULES)}"
                )
            rules.append(BUILTIN_RULES[name])
        for name, pattern, replacement in custom:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"rule {name!r}: not a regular expression: {exc}") from None
            rules.append(RedactionRule(name, compiled, replacement))
        return cls(rules, answers=answers)

    def redact(self, text: str) -> str:
        text = _repair(text)
        for rule in self.rules:
            text = rule.apply(text)
        return text

    def redacts_before(self, canonicalizer: object) -> bool:
        """Whether the raw answers for ``canonicalizer`` are redacted before it sees them:
        with ``answers`` on and some rule, unless it declares ``redact_canonical_only``."""
        return (
            self.answers
            and bool(self.rules)
            and not getattr(canonicalizer, "redact_canonical_only", False)
        )

    def redact_all(self, texts: Iterable[str], done: dict[str, str] | None = None) -> list[str]:
        """:meth:`redact` of each text, in order. A text repeated is redacted once (the K
        answers of an item often are the same string); ``done`` keeps the redacted texts
        from one call to the next (an item's batches)."""
        if done is None:
            done = {}
        out = []
        for text in texts:
            redacted = done.get(text)
            if redacted is None:
                redacted = done[text] = self.redact(text)
            out.append(redacted)
        return out

    def for_verdicts(self, canonicalizer: Canonicalizer | None) -> Canonicalizer | None:
        """``canonicalizer`` as a verdict's typed ``correct_answer`` must meet it to be
        compared with the stored candidates: redacted before (as the answers were) and
        after (as the candidates were). Itself when ``answers`` is off."""
        if canonicalizer is None or not self.answers:
            return canonicalizer
        return _RedactedCanonicalizer(canonicalizer, self)

    def redact_consensus(self, consensus: Consensus) -> Consensus:
        """The candidates as a reviewer sees them: redacted (when ``answers``), distinct."""
        if not self.answers and all(_repair(c) == c for c in consensus.classes):
            return consensus
        seen: set[str] = set()
        shown = []
        for rank, cls in enumerate(consensus.classes, start=1):
            base = text = self.redact(cls) if self.answers else _repair(cls)
            extra = 0
            while text in seen:  # "[email]" twice: tell them apart by rank
                extra += 1
                text = f"{base} (rank {rank})" + ("" if extra == 1 else f" #{extra}")
            seen.add(text)
            shown.append(text)
        return Consensus(tuple(shown), consensus.counts)


class _RedactedCanonicalizer:
    """A pure canonicalizer between two redactions (see :meth:`Redactor.for_verdicts`)."""

    def __init__(self, inner: Canonicalizer, redactor: Redactor) -> None:
        self._inner = inner
        self._redactor = redactor
        self._before = redactor.redacts_before(inner)

    @property
    def name(self) -> str:
        return self._inner.name

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        redact = self._redactor.redact
        return redact(self._inner.canonicalize(redact(answer) if self._before else answer, context))
