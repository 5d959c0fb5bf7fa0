"""The multiple-choice canonicalizer on messy, real-world answers."""

from __future__ import annotations

import pytest

from monitor.core.canon import INVALID, McqCanonicalizer, QueryContext
from monitor.core.errors import ConfigError

CANON = McqCanonicalizer()
CAPITALS = QueryContext(
    query="What is the capital of France?",
    options={"A": "London", "B": "Paris", "C": "Paris, Texas", "D": "Berlin"},
)


def canon(answer: str, context: QueryContext | None = None) -> str:
    return CANON.canonicalize(answer, context)


@pytest.mark.parametrize(
    "answer",
    [
        "B",
        "b",
        "(B)",
        "B)",
        "B.",
        "[B]",
        "**B**",
        " B \n",
        "Answer: B",
        "The answer is (B).",
        "answer is B",
        "answer is b.",
        "The answer is (b)",
        "Option B",
        "option (b)",
        "B) Paris",
        "B. Paris",
        "B: Paris",
        "(B) Paris",
        "**B.** Paris",
        "Option B - Paris",
        "**Answer:** B",
        "The correct option is B.",
        "The answer is option B because Paris is the capital.",
        "After careful thought, I'd go with B.",
        "Final answer: **(B)**",
    ],
)
def test_forms_of_b(answer: str) -> None:
    assert canon(answer) == "B"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # the article and the pronoun are not options
        ("A good choice is C", "C"),
        ("I think the answer is A", "A"),
        ("I think it's D.", "D"),
        ("A careful reading shows that C fits best.", "C"),
        ("A is correct.", "A"),
        ("The answer is a bit subtle, but D.", "D"),
        # the last explicit statement beats other letters
        ("The answer is B. Option C is tempting but wrong, and so is D.", "B"),
        ("Initially the answer is A... wait, re-reading: the answer is C.", "C"),
        # without a statement, the last letter mentioned
        ("Options B and C are wrong; D is right.", "D"),
        (
            "Let's go through them.\nA) wrong: London is in the UK.\n"
            "B) correct: Paris is the capital.\nSo (B).",
            "B",
        ),
        ("Vitamin B12 is found in D", "D"),
        ("The U.S. and the U.K. agree on C", "C"),
        ("A T-shirt costs C dollars", "C"),
        # letters outside the valid set
        ("The answer is K", INVALID),
        ("K", INVALID),
        # refusals and junk
        ("I cannot answer that.", INVALID),
        ("I'm not sure.", INVALID),
        ("", INVALID),
        ("  \n ", INVALID),
        ("The answer is the third one", INVALID),
    ],
)
def test_messy_answers(answer: str, expected: str) -> None:
    assert canon(answer) == expected


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Paris", "B"),
        ("paris.", "B"),
        ("  PARIS!  ", "B"),
        ("The capital is Paris", "B"),
        ("I'd say Paris, Texas", "C"),  # the longer option contains the shorter one
        ("Berlin", "D"),
        ("B", "B"),
        ("The answer is D (Berlin)", "D"),
        ("Berlin or London", INVALID),  # two options mentioned
        ("Rome", INVALID),
        ("E", INVALID),  # not among the options
        ("The answer is E", INVALID),
    ],
)
def test_with_options(answer: str, expected: str) -> None:
    assert canon(answer, CAPITALS) == expected


def test_option_keys_restrict_and_extend_letters() -> None:
    two = QueryContext(options={"a": "yes", "b": "no"})
    assert canon("C", two) == INVALID
    assert canon("No.", two) == "B"
    extended = QueryContext(options={"K": "kappa", "L": "lambda"})
    assert canon("L", extended) == "L"


def test_letters_option() -> None:
    four = McqCanonicalizer(letters="abcd")
    assert four.canonicalize("E") == INVALID
    assert four.canonicalize("Answer: d") == "D"
    assert four.canonicalize("Vitamin E helps, so C") == "C"


@pytest.mark.parametrize("letters", ["", "AB1", "ABA", "ÄB"])
def test_bad_letters(letters: str) -> None:
    with pytest.raises(ConfigError):
        McqCanonicalizer(letters=letters)


def test_name() -> None:
    assert CANON.name == "mcq"


EQUIVALENCE = {
    "B": ["B", "(b)", "**B**", "Answer: B", "The answer is B.", "B) Paris", "Paris"],
    "D": ["D", "[D]", "answer is d", "D. Berlin", "Berlin", "I'd pick option D"],
}


@pytest.mark.parametrize(
    ("expected", "form"), [(e, form) for e, forms in EQUIVALENCE.items() for form in forms]
)
def test_equivalence_classes(expected: str, form: str) -> None:
    assert canon(form, CAPITALS) == expected


def test_long_answer() -> None:
    reasoning = "We consider each option in turn and weigh the evidence carefully. " * 1600
    assert len(reasoning) > 100_000
    assert canon(reasoning + "\nThe answer is C.") == "C"
    assert canon(reasoning + "\nParis, of course.", CAPITALS) == "B"


# Linear takes ~1 s on a loaded machine; a quadratic scan of these ~200 kB inputs takes
# minutes. 30 s leaves room for a CI machine 5x slower than usual.
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "answer",
    [
        "A " * 100_000,
        "A a " * 50_000,
        "answer is " * 20_000,
        "option " * 28_000,
        "(" * 200_000,
        "answer" + " " * 200_000,
        "U.S." * 50_000,
    ],
)
def test_adversarial_inputs_stay_linear(answer: str) -> None:
    assert canon(answer, CAPITALS) in {"A", "B", "C", "D", INVALID}
