"""docs/deploy.md and deploy/RUNBOOK.md stand alone and name files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "deploy.md", ROOT / "deploy" / "RUNBOOK.md"]


def test_docs_name_only_files_that_exist() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    paths = set(re.findall(r"`((?:deploy|helm)/[\w./-]+|Dockerfile)`", text))
    assert len(paths) > 10
    for path in paths:
        assert (ROOT / path.rstrip("/")).exists(), path


def test_docs_list_every_alert() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    for path in sorted((ROOT / "deploy" / "prometheus").glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    assert f"`{rule['alert']}`" in text, rule["alert"]


def test_docs_do_not_refer_to_internal_notes() -> None:
    for path in DOCS:
        text = path.read_text()
        assert "DESIGN" not in text and "shared/" not in text and "§" not in text, path
