"""The JSON canonicalizer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.core.canon import INVALID, JsonCanonicalizer
from monitor.core.canon.jsonc import canonical_json

CANON = JsonCanonicalizer()


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ('{"b": 1, "a": 2}', '{"a":2,"b":1}'),
        ('  {"a": [1, 2, {"z": null, "y": true}]}\n', '{"a":[1,2,{"y":true,"z":null}]}'),
        ('{"x": 1.0, "y": [2.0, 2.5, -0.0], "z": 1e3}', '{"x":1,"y":[2,2.5,0],"z":1000}'),
        ('{"city": "Zürich"}', '{"city":"Zürich"}'),
        ('{"city": "Z\\u00fcrich"}', '{"city":"Zürich"}'),
        ('{"a": 1, "a": 2}', '{"a":2}'),
        ("[3, 1, 2]", "[3,1,2]"),
        ("42", "42"),
        ("4.20", "4.2"),
        ('"Paris"', '"Paris"'),
        ("true", "true"),
        ("null", "null"),
        # fenced blocks
        ('Here you go:\n```json\n{"name": "Ada", "age": 36}\n```\nAnything else?', None),
        ('```\n{"name": "Ada", "age": 36.0}\n```', None),
        ('```python\nx = {"a": 1}\n```\n```JSON\n{"age":36,"name":"Ada"}\n```', None),
        # embedded in prose
        ('Sure! The record is {"age": 36, "name": "Ada"} as requested.', None),
        ('Broken {first, then the real one: {"name": "Ada", "age": 36}', None),
        ('Text with "quotes" and {"name": "Ada }", "age": 36}', '{"age":36,"name":"Ada }"}'),
        ('Escapes: {"s": "a \\" } b", "n": 1}', '{"n":1,"s":"a \\" } b"}'),
        ('See [1, 2] and later {"a": 1}', "[1,2]"),  # the first span that parses
        # rejected
        ('{"x": NaN}', INVALID),
        ('{"x": Infinity}', INVALID),
        ("[-Infinity]", INVALID),
        ('{"x": 1e999}', INVALID),
        ("{'a': 1}", INVALID),
        ('{"a": 1,}', INVALID),
        ("I cannot answer that.", INVALID),
        ("Paris", INVALID),
        ("", INVALID),
        ("   ", INVALID),
        ("```json\n{oops}\n```", INVALID),
    ],
)
def test_answers(answer: str, expected: str | None) -> None:
    assert CANON.canonicalize(answer) == (expected or '{"age":36,"name":"Ada"}')


def test_equivalence_class() -> None:
    forms = [
        '{"name": "Ada", "age": 36}',
        '{"age":36,"name":"Ada"}',
        '{\n  "age": 36.0,\n  "name": "Ada"\n}',
        'Result:\n```json\n{"name":"Ada","age":3.6e1}\n```',
        'The JSON is {"name": "Ada", "age": 36}.',
    ]
    assert {CANON.canonicalize(f) for f in forms} == {'{"age":36,"name":"Ada"}'}
    assert CANON.canonicalize('{"name": "Ada", "age": 37}') != CANON.canonicalize(forms[0])
    assert CANON.canonicalize('{"name": "ada", "age": 36}') != CANON.canonicalize(forms[0])


def test_booleans_are_not_numbers() -> None:
    assert CANON.canonicalize("[true, 1, 1.0]") == "[true,1,1]"


def test_deep_nesting_is_invalid_not_a_crash() -> None:
    assert CANON.canonicalize("[" * 100_000 + "]" * 100_000) == INVALID


def test_huge_integer_is_invalid_not_a_crash() -> None:
    assert CANON.canonicalize("1" * 10_000) == INVALID


def test_name() -> None:
    assert CANON.name == "json"


# Linear takes ~1 s on a loaded machine; a quadratic scan of these ~200 kB inputs takes
# minutes. 30 s leaves room for a CI machine 5x slower than usual.
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "answer",
    [
        "{" * 200_000,
        "[" * 200_000,
        '{"' * 100_000,
        "{}" * 100_000,
        "```\n" * 50_000,
        "```json\n{" * 25_000,
        "[" * 64 + "1," * 100_000 + "x" + "]" * 64,
        '{"a": "' + "\\" * 200_000,
    ],
)
def test_adversarial_inputs_stay_linear(answer: str) -> None:
    result = CANON.canonicalize(answer)
    assert result == INVALID or json.loads(result) is not None


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@given(JSON_VALUES, st.booleans())
def test_canonical_form_is_stable(value: object, indent: bool) -> None:
    text = json.dumps(value, indent=2 if indent else None)
    first = CANON.canonicalize(text)
    assert first != INVALID
    assert CANON.canonicalize(first) == first
    assert canonical_json(first) == first
    assert CANON.canonicalize(f"Here it is:\n```json\n{text}\n```") == first
