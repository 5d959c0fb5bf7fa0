"""The canonicalizer registry and command-line options."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import monitor.core.canon as canon_pkg
from monitor.core.canon import (
    INVALID,
    Canonicalizer,
    JsonCanonicalizer,
    McqCanonicalizer,
    NumericCanonicalizer,
    QueryContext,
    RegexCanonicalizer,
    TextCanonicalizer,
    as_async,
    available_canonicalizers,
    get_canonicalizer,
    parse_canonicalizer_options,
    register_canonicalizer,
    registry,
)
from monitor.core.errors import ConfigError
from tests.canon.custom_canon import UpperCanon


@pytest.fixture
def clean_registry() -> Iterator[None]:
    saved = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


def test_builtin_names() -> None:
    assert available_canonicalizers() == ["json", "mcq", "numeric", "regex", "text", "tool_call"]


@pytest.mark.parametrize(
    ("spec", "options", "cls"),
    [
        ("numeric", {}, NumericCanonicalizer),
        ("numeric", {"percent": "fraction"}, NumericCanonicalizer),
        ("mcq", {"letters": "ABCD"}, McqCanonicalizer),
        ("text", {"articles": False}, TextCanonicalizer),
        ("json", {}, JsonCanonicalizer),
        ("regex", {"pattern": r"(\d+)", "then": "numeric"}, RegexCanonicalizer),
    ],
)
def test_builtins(spec: str, options: dict[str, Any], cls: type) -> None:
    built = get_canonicalizer(spec, **options)
    assert isinstance(built, cls)
    assert isinstance(built, Canonicalizer)
    assert built.name == spec


@pytest.mark.parametrize(
    "spec",
    [
        "tests.canon.custom_canon:UpperCanon",
        "tests.canon.custom_canon.UpperCanon",
        "tests.canon.custom_canon:make_upper",
    ],
)
def test_custom_by_import_path(spec: str) -> None:
    built = get_canonicalizer(spec, strip=False)
    assert isinstance(built, UpperCanon)
    assert built.canonicalize(" paris ") == " PARIS "
    assert get_canonicalizer(spec).canonicalize(" paris ") == "PARIS"


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        ("numerik", {}, "unknown name"),
        ("", {}, "unknown name"),
        ("no.such.module:Thing", {}, "cannot import"),
        ("tests.canon.custom_canon:Missing", {}, "no attribute"),
        ("tests.canon.custom_canon.", {}, "not a registered name"),
        ("tests.canon.custom_canon:NotACanonicalizer", {}, "lacks"),
        ("builtins:dict", {}, "lacks"),
        ("tests.canon.custom_canon:UpperCanon", {"shout": True}, "bad options"),
        ("numeric", {"precision": 3}, "bad options"),
        ("numeric", {"percent": "keep"}, "percent"),
        ("regex", {}, "pattern"),
        ("regex", {"pattern": "(unclosed"}, "bad pattern"),
        ("regex", {"pattern": "x", "then": "numerik"}, "unknown name"),
    ],
)
def test_errors(spec: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        get_canonicalizer(spec, **options)
    text = str(caught.value)
    assert "\n" not in text
    if "unknown" in message or "import" in message:
        assert "json, mcq, numeric, regex, text" in text


@pytest.mark.usefixtures("clean_registry")
def test_register() -> None:
    register_canonicalizer("upper", UpperCanon)
    assert "upper" in available_canonicalizers()
    assert get_canonicalizer("upper").canonicalize("ok ") == "OK"
    assert get_canonicalizer("regex", pattern=r"<(.*)>", then="upper").canonicalize("<x>") == "X"
    with pytest.raises(ConfigError, match="already registered"):
        register_canonicalizer("upper", UpperCanon)
    register_canonicalizer("upper", TextCanonicalizer, replace=True)
    assert get_canonicalizer("upper").canonicalize("OK!") == "ok"


@pytest.mark.usefixtures("clean_registry")
@pytest.mark.parametrize("name", ["", "Upper", "my.canon", "a:b", "1st", "with space"])
def test_register_bad_names(name: str) -> None:
    with pytest.raises(ConfigError):
        register_canonicalizer(name, UpperCanon)


@pytest.mark.usefixtures("clean_registry")
def test_registered_factory_must_build_a_canonicalizer() -> None:
    register_canonicalizer("broken", lambda: "not a canonicalizer")  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match="lacks"):
        get_canonicalizer("broken")


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ([], {}),
        (["percent=fraction"], {"percent": "fraction"}),
        (["articles=false"], {"articles": False}),
        (["letters=ABCD", "limit=3"], {"letters": "ABCD", "limit": 3}),
        ([r"pattern=Answer: (\d+)"], {"pattern": r"Answer: (\d+)"}),
        (["pattern=a=b"], {"pattern": "a=b"}),
        (['then_options={"percent": "fraction"}'], {"then_options": {"percent": "fraction"}}),
        (["marker=null"], {"marker": None}),
        (["value=NaN"], {"value": "NaN"}),
        (["empty="], {"empty": ""}),
        ([" key =1.5"], {"key": 1.5}),
    ],
)
def test_parse_options(pairs: list[str], expected: dict[str, Any]) -> None:
    assert parse_canonicalizer_options(pairs) == expected


@pytest.mark.parametrize("pairs", [["percent"], ["=x"], ["bad-key=1"], ["a=1", "a=2"]])
def test_parse_options_errors(pairs: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_canonicalizer_options(pairs)


def test_cli_options_build_a_canonicalizer() -> None:
    options = parse_canonicalizer_options(
        [r"pattern=Total: (\S+)", "then=numeric", 'then_options={"percent": "fraction"}']
    )
    built = get_canonicalizer("regex", **options)
    assert built.canonicalize("Total: 50% of 10") == "0.5"


async def test_as_async_wraps_a_pure_canonicalizer() -> None:
    wrapped = as_async(get_canonicalizer("mcq"))
    context = QueryContext(options={"A": "yes", "B": "no"})
    assert wrapped.name == "mcq"
    assert await wrapped.canonicalize_many(["B", "yes", "maybe"], context) == ["B", "A", INVALID]
    assert as_async(wrapped) is wrapped


def test_package_exports() -> None:
    for name in canon_pkg.__all__:
        assert hasattr(canon_pkg, name)
    assert {"INVALID", "get_canonicalizer", "register_canonicalizer"} <= set(canon_pkg.__all__)


def test_names_ignore_case_and_spaces() -> None:
    assert isinstance(get_canonicalizer(" Numeric "), NumericCanonicalizer)
