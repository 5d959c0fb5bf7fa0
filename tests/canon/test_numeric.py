"""The numeric canonicalizer on messy, real-world answers."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.core.canon import INVALID, NumericCanonicalizer
from monitor.core.canon.numeric import format_number
from monitor.core.errors import ConfigError

CANON = NumericCanonicalizer()
FRACTION_PERCENT = NumericCanonicalizer(percent="fraction")
CANONICAL_FORM = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]*[1-9])?|-?[1-9][0-9]*/[1-9][0-9]*")


def canon(answer: str) -> str:
    return CANON.canonicalize(answer)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("42", "42"),
        ("42.0", "42"),
        ("42.50", "42.5"),
        ("1,000", "1000"),
        ("1,234,567", "1234567"),
        ("$42", "42"),
        ("€42", "42"),
        ("£1,250.75", "1250.75"),
        ("42 dollars", "42"),
        ("-3.5", "-3.5"),
        ("−3.5", "-3.5"),
        ("－3.5", "-3.5"),
        ("+7", "7"),
        (".5", "0.5"),
        ("1/2", "0.5"),
        ("3/4", "0.75"),
        ("1/3", "1/3"),
        ("-2/6", "-1/3"),
        ("4/2", "2"),
        ("2 1/2", "2.5"),
        ("-2 1/2", "-2.5"),
        ("1.5e3", "1500"),
        ("2.5E-3", "0.0025"),
        ("1.5 × 10^3", "1500"),
        ("6.02 x 10^23", "602000000000000000000000"),
        ("42%", "42"),
        ("42 percent", "42"),
        ("-0", "0"),
        ("-0.000", "0"),
        ("42kg", "42"),
        ("42.", "42"),
        ("0.1", "0.1"),
        ("007", "7"),
        ("1e-7", "0.0000001"),
        ("½", "0.5"),
        ("2½", "2.5"),
        ("-$5", "-5"),
        ("$-5", "-5"),
        ("٤٢", "42"),
        ("４２", "42"),
        ("答案是42", "42"),
    ],
)
def test_surface_forms(answer: str, expected: str) -> None:
    assert canon(answer) == expected


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # chain of thought ending in the number
        (
            "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.",
            "72",
        ),
        ("First, 3 * 4 = 12. Then 12 + 5 = 17. So she has 17 apples left.", "17"),
        # GSM8K marker, and it wins over later numbers
        ("Janet has 16 eggs... 16 - 3 - 4 = 9, 9 * 2 = 18\n#### 18", "18"),
        ("<<3*4=12>>12 cups\n#### 1,234\nHope that helps, 2 of us checked.", "1234"),
        ("#### $18 per day", "18"),
        # a numbered markdown heading is not a GSM8K marker
        ("#### 1. Understand the problem\nWe need 6 boxes.\n#### 2. Solve\nSo 42.", "42"),
        # LaTeX boxes win over everything but the marker
        ("The probability is $\\boxed{\\frac{3}{4}}$.", "0.75"),
        ("We get \\boxed{2\\dfrac{1}{2}} hours, not 3.", "2.5"),
        ("So \\boxed{x = 5} and y = 7.", "5"),
        ("\\boxed{1{,}000} items, checked 3 times", "1000"),
        ("\\boxed{-\\frac{1}{3}}", "-1/3"),
        ("\\boxed{12\\%} then 99", "12"),
        ("$\\boxed{5 \\text{ cm}}$ (scale 1:100)", "5"),
        ("\\boxed 7", "7"),
        # explicit answer phrases beat the last number
        ("The answer is 5. Step 6 double-checks it.", "5"),
        ("**Final Answer:** $1,234.50 (from 3 invoices)", "1234.5"),
        ("Answer: -3.5 degrees, measured at 2 pm", "-3.5"),
        ("The answer is approximately 3.14 for r = 1.", "3.14"),
        ("The answer is approx. 7 trips.", "7"),
        ("First answer is 3. On reflection the answer is 4 (not 5).", "4"),
        ("The answer would be **42** (from 6 x 7).", "42"),
        ("The answer is equal to 1/3 of 9", "1/3"),
        ("The final answer is $\\frac{1}{2}$ of 10", "0.5"),
        ("I think the answer to question 3 is 8", "8"),
        # markdown bold, currency, percent in prose
        ("She earns **$1,250.00** a week.", "1250"),
        ("Prices rose by 12.5% over 3 years... final: 37.5%", "37.5"),
        ("3 1/2 cups of flour", "3.5"),
        ("Add 3 4/2 cups", "2"),
        # hyphens and slashes are not signs or numbers
        ("GPT-4 answered 3-5", "5"),
        ("Updated on 12/25/2024", "12"),
        ("Version v2 of H2O", INVALID),
        ("1.2.3", "1.2"),
        # refusals and junk
        ("I cannot answer that.", INVALID),
        ("I'm sorry, but I can't help with that request.", INVALID),
        ("", INVALID),
        ("   \n\t  ", INVALID),
        ("\\boxed{\\text{no solution}} although 5 appears", INVALID),
        ("1/0", INVALID),
        ("The answer is 1e5000", INVALID),
    ],
)
def test_messy_answers(answer: str, expected: str) -> None:
    assert canon(answer) == expected


EQUIVALENCE_CLASSES = {
    "0.5": [
        "1/2",
        "0.5",
        ".5",
        "0.50",
        "½",
        "5e-1",
        "\\frac{1}{2}",
        "$\\boxed{\\dfrac{1}{2}}$",
        "The answer is 1/2.",
        "#### 0.5",
        "It is 2/4 of the cake",
    ],
    "1234": [
        "1234",
        "1,234",
        "$1,234.00",
        "#### 1,234",
        "1.234e3",
        "The total is **1,234** dollars.",
        "1234.0",
        "Answer: 1234 apples",
        "\\boxed{1{,}234}",
    ],
    "-3.5": ["-3.5", "−3.5", "-7/2", "-3 1/2", "-3.50", "The answer is -3½.", "-$3.50"],
    "1/3": ["1/3", "2/6", "\\frac{1}{3}", "\\boxed{\\tfrac{1}{3}}", "Answer: ⅓", "3/9 of them"],
    "0": ["0", "-0", "+0", "0.0", "-0.00", "0/7", "0e5", "The answer is 0."],
}


@pytest.mark.parametrize(
    ("expected", "form"),
    [(expected, form) for expected, forms in EQUIVALENCE_CLASSES.items() for form in forms],
)
def test_equivalence_classes(expected: str, form: str) -> None:
    assert canon(form) == expected


def test_equivalence_classes_are_distinct() -> None:
    classes = {
        expected: {canon(f) for f in forms} for expected, forms in EQUIVALENCE_CLASSES.items()
    }
    assert all(len(found) == 1 for found in classes.values())
    assert len({next(iter(found)) for found in classes.values()}) == len(classes)
    assert canon("0.51") not in classes
    assert canon("1,235") != canon("1,234")


def test_percent_as_fraction() -> None:
    assert FRACTION_PERCENT.canonicalize("42%") == "0.42"
    assert FRACTION_PERCENT.canonicalize("The rate is 12.5 percent") == "0.125"
    assert FRACTION_PERCENT.canonicalize("\\boxed{50\\%}") == "0.5"
    assert FRACTION_PERCENT.canonicalize("50%") == FRACTION_PERCENT.canonicalize("0.5")
    assert FRACTION_PERCENT.canonicalize("1/3%") == "1/300"
    assert FRACTION_PERCENT.canonicalize("42") == "42"


def test_marker_options() -> None:
    assert NumericCanonicalizer(marker=None).canonicalize("#### 18\nthen 3 more") == "3"
    custom = NumericCanonicalizer(marker="ANSWER>>")
    assert custom.canonicalize("work: 5 + 6\nANSWER>> 11\nchecked twice") == "11"
    assert custom.canonicalize("#### 18\nthen 3 more") == "3"


@pytest.mark.parametrize("options", [{"percent": "keep"}, {"marker": ""}, {"marker": "  "}])
def test_bad_options(options: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        NumericCanonicalizer(**options)


def test_name() -> None:
    assert CANON.name == "numeric"


def test_long_chain_of_thought_is_read_to_the_end() -> None:
    filler = "We add 3 and 4 to get 7, carry the 1. " * 2700  # about 100 KB
    assert len(filler) > 100_000
    assert canon(filler + "So the total is 1,234,567.") == "1234567"
    assert canon(filler + "#### 99\n" + filler) == "99"


ADVERSARIAL = {
    "digits": "1" * 200_000,
    "commas": "1," * 100_000,
    "groups": "1" + ",000" * 50_000 + "0",
    "dots": "1." * 100_000,
    "slashes": "1/" * 100_000,
    "mixed": "1 1/" * 50_000,
    "exponents": "1e" * 100_000,
    "minus": "-" * 200_000,
    "currency": "-$" * 100_000,
    "hashes": "#" * 200_000,
    "headings": "#### 1. a\n" * 20_000,
    "boxes": "\\boxed{" * 28_000,
    "fracs": "\\frac{1}{" * 25_000,
    "phrases": "answer is " * 20_000,
    "gap": "answer" + " " * 200_000,
    "percent": "1 %" * 66_000,
    "times": "1 x 10^" * 28_000,
}


# Linear takes ~1 s on a loaded machine; a quadratic scan of these ~200 kB inputs takes
# minutes. 30 s leaves room for a CI machine 5x slower than usual.
@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_inputs_stay_linear(name: str) -> None:
    result = canon(ADVERSARIAL[name])
    assert result == INVALID or CANONICAL_FORM.fullmatch(result)


def test_output_is_never_exponent_or_negative_zero() -> None:
    for answer in ["1e-20", "-0.0e5", "1.5e300", "-1e-3", "0.000001", "-1/1000000"]:
        result = canon(answer)
        assert "e" not in result
        assert result != "-0"
        assert CANONICAL_FORM.fullmatch(result)


def test_format_number() -> None:
    assert format_number(Fraction(7, 8)) == "0.875"
    assert format_number(Fraction(-1, 3)) == "-1/3"
    assert format_number(Fraction(10**1000)) is None
    assert format_number(Fraction(1, 3**3000)) is None


# fmt: off
NUMBERISH = st.lists(
    st.sampled_from(
        [
            "1", "23", "456", "0", ",", ",000", ".", ".5", "/", "-", "−", "+", "$", "%",
            " ", "e", "e-", "x 10^", "\\frac{1}{2}", "\\boxed{", "}", "answer is ",
            "#### ", "½", "٣", "a", "\n", "**",
        ]
    ),
    max_size=12,
).map("".join)
# fmt: on


@given(st.one_of(NUMBERISH, st.text(max_size=40)))
def test_canonicalization_is_idempotent(answer: str) -> None:
    for canonicalizer in (CANON, FRACTION_PERCENT):
        first = canonicalizer.canonicalize(answer)
        if first != INVALID:
            assert CANONICAL_FORM.fullmatch(first), first
            assert canonicalizer.canonicalize(first) == first


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_integers_round_trip(n: int) -> None:
    assert canon(str(n)) == str(n)
    assert canon(f"{n:,}") == str(n)
    assert canon(f"The answer is {n:,}.") == str(n)
    assert canon(f"#### {n}") == str(n)


@given(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.integers(min_value=0, max_value=12),
    st.integers(min_value=0, max_value=12),
)
def test_finite_decimals_round_trip(numerator: int, twos: int, fives: int) -> None:
    value = Fraction(numerator, 2**twos * 5**fives)
    as_fraction = canon(f"{value.numerator}/{value.denominator}")
    assert Fraction(as_fraction) == value
    assert "/" not in as_fraction
    places = max(twos, fives)
    as_decimal = f"{value.numerator * 10**places // value.denominator}e-{places}"
    assert canon(as_decimal) == as_fraction


@given(st.fractions(max_denominator=10**6))
def test_any_fraction_round_trips(value: Fraction) -> None:
    result = canon(f"{value.numerator}/{value.denominator}")
    assert Fraction(result) == value
    assert canon(result) == result
