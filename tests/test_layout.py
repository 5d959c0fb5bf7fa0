"""The house rules a reader relies on (docs/architecture.md), checked on the source:
modules small enough to read in one sitting, functions short, every module's public
names declared. The floors themselves are import-linter's job (``make lint``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    p for top in ("monitor", "adapters") for p in (ROOT / top).rglob("*.py") if p.is_file()
)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_sources_are_found() -> None:
    names = {_name(p) for p in SOURCES}
    assert {"monitor/core/conformal.py", "monitor/engine/service.py"} <= names
    assert {"adapters/sqlite/store.py", "monitor/app/runner.py"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=_name)
def test_module_is_small_and_declares_its_names(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{_name(path)}: {lines} lines > {MAX_MODULE_LINES}"
    tree = ast.parse(text)
    long = [
        f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"
    if path.name != "__main__.py":
        declared = any(
            isinstance(node, ast.Assign | ast.AnnAssign)
            and any(
                isinstance(t, ast.Name) and t.id == "__all__"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
            for node in tree.body
        )
        assert declared, f"{_name(path)}: no __all__"


def test_every_module_docs_architecture_names_exists() -> None:
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:monitor|adapters)/[\w/]+(?:\.py|/))`", text))
    assert len(named) > 30
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def _imports_tests(tree: ast.AST) -> list[str]:
    """The ``import tests...`` / ``from tests... import`` statements in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [
            f"line {node.lineno}: {name}"
            for name in names
            if name == "tests" or name.startswith("tests.")
        ]
    return found


def test_bench_does_not_import_the_tests() -> None:
    """bench/ stands on its own (bench/benchlib.py, bench/pgcluster.py): no script there
    imports the ``tests`` package."""
    scripts = sorted((ROOT / "bench").rglob("*.py"))
    assert any(p.name == "store_replicas_bench.py" for p in scripts)
    offenders = {
        _name(path): found
        for path in scripts
        if (found := _imports_tests(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert not offenders, f"bench/ must not import the tests package: {offenders}"
