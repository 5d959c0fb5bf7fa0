"""The regex canonicalizer."""

from __future__ import annotations

from typing import Any

import pytest

from monitor.core.canon import INVALID, RegexCanonicalizer, TextCanonicalizer, get_canonicalizer
from monitor.core.errors import ConfigError


def test_named_group_then_text() -> None:
    canon = RegexCanonicalizer(pattern=r"Capital:\s*(?P<answer>[^\n]+)")
    assert canon.canonicalize("Thinking...\nCapital: The City of PARIS.\n") == "city of paris"
    assert canon.name == "regex"


def test_first_group_is_used_without_a_named_one() -> None:
    canon = RegexCanonicalizer(pattern=r"(\w+) is the capital")
    assert canon.canonicalize("Paris is the capital, Lyon is not") == "paris"


def test_whole_match_without_groups() -> None:
    canon = get_canonicalizer("regex", pattern=r"\b[A-Z]{3}\b", then="text")
    assert canon.canonicalize("Flights from CDG and LHR") == "lhr"


def test_which_first_and_last() -> None:
    text = "ID: 17 ... later ID: 42"
    assert RegexCanonicalizer(pattern=r"ID: (\d+)").canonicalize(text) == "42"
    assert RegexCanonicalizer(pattern=r"ID: (\d+)", which="first").canonicalize(text) == "17"


def test_then_numeric_with_options() -> None:
    canon = get_canonicalizer(
        "regex",
        pattern=r"rate=(?P<answer>\S+)",
        then="numeric",
        then_options={"percent": "fraction"},
    )
    assert canon.canonicalize("growth rate=12.5% (approx 13)") == "0.125"


def test_then_mcq_sees_the_context() -> None:
    from monitor.core.canon import QueryContext

    canon = get_canonicalizer("regex", pattern=r"<choice>(.*?)</choice>", then="mcq", flags="s")
    context = QueryContext(options={"A": "yes", "B": "no"})
    assert canon.canonicalize("<choice>\nNo\n</choice>", context) == "B"


def test_then_an_object() -> None:
    canon = RegexCanonicalizer(pattern=r"\[(.*)\]", then=TextCanonicalizer(articles=False))
    assert canon.canonicalize("[The End]") == "the end"


def test_flags() -> None:
    assert RegexCanonicalizer(pattern=r"answer: (\w+)").canonicalize("ANSWER: yes") == INVALID
    assert RegexCanonicalizer(pattern=r"answer: (\w+)", flags="i").canonicalize("ANSWER: yes") == (
        "yes"
    )
    multiline = RegexCanonicalizer(pattern=r"^>(.+)$", flags="m", which="first")
    assert multiline.canonicalize("intro\n>first\n>second") == "first"


def test_unmatched_group_is_skipped() -> None:
    canon = RegexCanonicalizer(pattern=r"x=(\d+)|y=(?:\d+)")
    assert canon.canonicalize("x=1 y=2") == "1"
    assert canon.canonicalize("y=2") == INVALID


@pytest.mark.parametrize("answer", ["no match here", "", "   "])
def test_no_match_is_invalid(answer: str) -> None:
    assert RegexCanonicalizer(pattern=r"Answer: (\d+)").canonicalize(answer) == INVALID


def test_empty_extract_goes_through_the_inner_canonicalizer() -> None:
    assert RegexCanonicalizer(pattern=r"Answer:(\s*)").canonicalize("Answer:  ") == INVALID


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"pattern": ""},
        {"pattern": "("},
        {"pattern": "[a-"},
        {"pattern": "x", "which": "middle"},
        {"pattern": "x", "flags": "iq"},
        {"pattern": "x", "then": "nonexistent"},
        {"pattern": "x", "then": "numeric", "then_options": {"percent": "no"}},
        {"pattern": "x", "then": TextCanonicalizer(), "then_options": {"articles": False}},
    ],
)
def test_bad_configuration(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        get_canonicalizer("regex", **options)


def test_long_answer() -> None:
    canon = get_canonicalizer("regex", pattern=r"FINAL: (\d+)", then="numeric")
    filler = "step, " * 20_000
    assert canon.canonicalize(filler + "FINAL: 1234" + filler) == "1234"
