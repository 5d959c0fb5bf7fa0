"""The README and docs/ cannot drift: their configuration examples are validated verbatim,
every configuration key and metric is documented, links resolve, and they stand alone."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from pydantic import BaseModel

from monitor.app.cli import build_parser, main
from monitor.app.validation import validate_settings
from monitor.config import Settings, load_settings
from monitor.engine.metrics import Metrics
from tests.kafka.tls import make_pki

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Owned and landed separately (deployment files): links into them are not checked here.
EXTERNAL_DIRS = ("helm/",)
FRAGMENT_BASE = {"tasks": [{"name": "example", "endpoint": {"model": "m"}}]}
SECRET_FILE_KEYS = {"api_key_file", "token_file", "password_file"}
KEY_VALUE_FILE_KEYS = {"headers_file"}  # key=value lines (otel.headers_file)
TLS_FILE_KEYS = {"ca_file": "ca", "cert_file": "client_cert", "key_file": "client_key"}
"""Kafka TLS files in examples: pointed at a throwaway CA and client certificate."""


def yaml_blocks() -> list[Any]:
    params = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for i, match in enumerate(re.finditer(r"```yaml\n(.*?)```", text, re.DOTALL)):
            line = text[: match.start()].count("\n") + 1
            params.append(pytest.param(match.group(1), id=f"{path.name}:{line}:{i}"))
    return params


def _secret_files(node: Any, tmp_path: Path) -> Any:
    """Point secret-file paths (e.g. a Kubernetes mount) at temporary files holding a secret."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in KEY_VALUE_FILE_KEYS and isinstance(value, str):
                f = tmp_path / f"secret-{len(list(tmp_path.iterdir()))}"
                f.write_text("authorization=Bearer s3cret-value\n")
                out[key] = str(f)
            elif key in SECRET_FILE_KEYS and isinstance(value, str):
                f = tmp_path / f"secret-{len(list(tmp_path.iterdir()))}"
                f.write_text("s3cret-value\n")
                out[key] = str(f)
            elif key in TLS_FILE_KEYS and isinstance(value, str):
                out[key] = str(getattr(make_pki(tmp_path / "pki"), TLS_FILE_KEYS[key]))
            else:
                out[key] = _secret_files(value, tmp_path)
        return out
    if isinstance(node, list):
        return [_secret_files(v, tmp_path) for v in node]
    return node


def test_the_docs_hold_configuration_examples() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"```yaml\n", readme), "the README shows a configuration"
    assert len(yaml_blocks()) >= 2


@pytest.mark.parametrize("block", yaml_blocks())
def test_every_yaml_example_passes_check_config(
    block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each ```yaml block, verbatim (a fragment without tasks gets one example task), goes
    through `relmon check-config`, which is the validation `relmon run` runs."""
    for key in list(os.environ):
        if key.upper().startswith("RELMON_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("RELMON_REVIEW_TOKEN", "example-token")  # as the docs say to
    if "password_file" not in block:  # the docs give the password one way or the other
        monkeypatch.setenv("RELMON_KAFKA__SASL__PASSWORD", "example-password")
    data = yaml.safe_load(block)
    assert isinstance(data, dict), "a configuration example is a mapping"
    rewritten = _secret_files(data, tmp_path / "secrets" if _mkdir(tmp_path) else tmp_path)
    if rewritten == data and "tasks" in data:
        path = tmp_path / "example.yaml"
        path.write_text(block)  # byte for byte
    else:
        path = tmp_path / "example.yaml"
        path.write_text(yaml.safe_dump({**FRAGMENT_BASE, **rewritten}))
    assert main(["check-config", "--config", str(path)]) == 0, capsys.readouterr().err
    settings = load_settings(path)
    validate_settings(settings)
    for key in data:
        assert key in Settings.model_fields, key


def _mkdir(tmp_path: Path) -> bool:
    (tmp_path / "secrets").mkdir(exist_ok=True)
    return True


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    return {p.split("\n", 1)[0].strip(): p for p in parts[1:]}


def _documented(model: type[BaseModel], section: str, prefix: str = "") -> list[str]:
    missing = []
    for name, field in model.model_fields.items():
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel) and prefix == "":
            missing += _documented(nested, section, f"{name}.")
        elif f"`{prefix}{name}`" not in section:
            missing.append(f"{prefix}{name}")
    return missing


def test_every_configuration_key_is_in_the_reference() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    sections = _sections(text)
    fields = Settings.model_fields
    missing = []
    for name, field in fields.items():
        model = field.annotation
        if name == "tasks":
            sub = Settings.model_fields["tasks"].annotation.__args__[0]  # type: ignore[union-attr]
            missing += [f"tasks[].{m}" for m in _documented(sub, sections["`tasks[]`"])]
        elif isinstance(model, type) and issubclass(model, BaseModel) and f"`{name}`" in sections:
            missing += [f"{name}.{m}" for m in _documented(model, sections[f"`{name}`"], "")]
        elif isinstance(model, type) and issubclass(model, BaseModel):
            missing += [f"{name}.{m}" for m in model.model_fields if f"`{name}.{m}`" not in text]
        elif f"`{name}`" not in sections["Top level"]:
            missing.append(name)
    assert not missing, (
        f"configuration keys missing from docs/configuration.md (add a table row): {missing}"
    )


def _exposed_name(family: Metric) -> str:
    return (
        f"{family.name}_total"
        if isinstance(family, CounterMetricFamily) or (family.type == "counter")
        else family.name
    )


def test_every_metric_is_in_the_reference() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.init_task("m", "t", [0.1], ["ok"])
    metrics.init_source("mirror")
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    names = {_exposed_name(f) for f in registry.collect()}
    assert "relmon_budget_utilization" in names and "relmon_reliability_level" in names
    missing = sorted(n for n in names if not re.search(rf"`{n}(`|\{{)", text))
    assert not missing, f"metrics missing from docs/metrics.md (add a table row): {missing}"


def test_docs_stand_alone() -> None:
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for banned in ("shared/", "DESIGN", "§"):
            assert banned not in text, f"{path.name} refers to {banned!r}: explain it instead"


def test_relative_links_resolve() -> None:
    broken = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            resolved = (path.parent / target).resolve()
            if any(str(resolved.relative_to(ROOT)).startswith(d) for d in EXTERNAL_DIRS):
                continue
            if not resolved.exists():
                broken.append(f"{path.name}: {target}")
    assert not broken, broken


def test_readme_keeps_its_two_commands_and_table_of_contents() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make demo" in readme and "make test" in readme
    assert ".venv/bin/relmon" in readme
    assert readme.index("relmon check-config") < readme.index("relmon run --config")
    headings = re.findall(r"^## (.+)$", readme, flags=re.MULTILINE)
    toc = re.findall(r"^- \[(.+?)\]\(#", readme, flags=re.MULTILINE)
    assert toc == [h for h in headings if h != "Contents"]


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action.choices.values():
                found += _all_parsers(choice)
    return found


def test_help_texts_have_no_raw_markup() -> None:
    for parser in _all_parsers(build_parser()):
        text = parser.format_help()
        assert "``" not in text, parser.prog


def test_rule_help_lists_every_rule() -> None:
    from monitor.core.stopping import available_rules

    stopping = next(p for p in _all_parsers(build_parser()) if p.prog.endswith("stopping"))
    help_text = " ".join(stopping.format_help().split())
    for rule in available_rules():
        assert rule in help_text.split("--rule RULE", 2)[-1].split("--", 1)[0], rule
