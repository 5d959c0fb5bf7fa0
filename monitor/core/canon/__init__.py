"""Canonicalization: raw answers to canonical classes (paper §3.2, appendix A).

Pure, per-answer canonicalizers (``numeric``, ``mcq``, ``text``, ``json``, ``regex``)
and a registry that builds them by name or import path. Each module's docstring states
its deliberate parsing rules.
"""

from monitor.core.canon.base import (
    INVALID,
    AsyncCanonicalizer,
    Canonicalizer,
    QueryContext,
    as_async,
    per_answer,
)
from monitor.core.canon.jsonc import JsonCanonicalizer
from monitor.core.canon.mcq import McqCanonicalizer
from monitor.core.canon.numeric import NumericCanonicalizer
from monitor.core.canon.regex import RegexCanonicalizer
from monitor.core.canon.registry import (
    available_canonicalizers,
    get_canonicalizer,
    parse_canonicalizer_options,
    register_canonicalizer,
)
from monitor.core.canon.text import TextCanonicalizer

__all__ = [
    "INVALID",
    "AsyncCanonicalizer",
    "Canonicalizer",
    "JsonCanonicalizer",
    "McqCanonicalizer",
    "NumericCanonicalizer",
    "QueryContext",
    "RegexCanonicalizer",
    "TextCanonicalizer",
    "as_async",
    "available_canonicalizers",
    "get_canonicalizer",
    "parse_canonicalizer_options",
    "per_answer",
    "register_canonicalizer",
]
