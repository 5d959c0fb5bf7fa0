"""A tiny custom canonicalizer, imported by path in the registry tests."""

from __future__ import annotations

from monitor.core.canon import INVALID, QueryContext

__all__ = ["NotACanonicalizer", "UpperCanon", "make_upper"]


class UpperCanon:
    """Upper-cases the answer; ``strip`` removes surrounding whitespace first."""

    def __init__(self, *, strip: bool = True) -> None:
        self.strip = strip

    @property
    def name(self) -> str:
        return "tests.canon.custom_canon:UpperCanon"

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        text = answer.strip() if self.strip else answer
        return text.upper() or INVALID


def make_upper(**options: bool) -> UpperCanon:
    """A factory function rather than a class."""
    return UpperCanon(**options)


class NotACanonicalizer:
    """Has no ``canonicalize`` method."""

    name = "nope"
