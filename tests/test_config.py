"""Settings: YAML + environment, validation messages, masked secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.app.cli import main
from monitor.config import load_settings
from monitor.core.errors import ConfigError

GOOD = """
tasks:
  - name: triage
    match: {header: triage}
    canonicalizer: mcq
    endpoint: {base_url: "http://127.0.0.1:8000/v1", model: m1, api_key: sk-very-secret-key}
review: {token: review-secret}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "relmon.yaml"
    p.write_text(text)
    return p


def test_yaml_env_precedence_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELMON_METRICS__PORT", "19999")
    monkeypatch.setenv("RELMON_REVIEW_TOKEN", "from-env")
    s = load_settings(write(tmp_path, GOOD))
    assert s.metrics.port == 19999 and s.metrics.host == "127.0.0.1"
    assert s.traffic.host == "127.0.0.1" and s.review.host == "127.0.0.1"
    assert s.tasks[0].k_max == 20 and s.tasks[0].alphas[0] == 0.01
    assert s.resolved_review_token() == "from-env"


def test_check_config_masks_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--config", str(write(tmp_path, GOOD))]) == 0
    out = capsys.readouterr().out
    assert "sk-very-secret-key" not in out and "review-secret" not in out
    doc = json.loads(out)
    assert doc["tasks"][0]["endpoint"]["api_key"] == "**********"
    assert doc["review"]["token"] == "**********"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tasks: [{name: t, k0: 30, k_max: 20}]", "k0 (30) must be <= k_max (20)"),
        ("tasks: [{name: t, stopping_rule: magic}]", "unknown stopping rule"),
        ("tasks: [{name: t, alphas: [1.5]}]", "alpha must be in (0, 1)"),
        ("traffic: {mode: proxy}", "traffic: mode 'proxy' needs traffic.upstream_url"),
        ("tasks: [{name: t, bogus: 1}]", "tasks[0] (t).bogus: Extra inputs are not permitted"),
        (
            "tasks: [{name: arith, endpoint: {base_url: '127.0.0.1:8000/v1'}}]",
            "tasks[0] (arith).endpoint.base_url: must start with http:// or https://",
        ),
        (
            "traffic: {mode: proxy, upstream_url: 'localhost:8000'}",
            "traffic.upstream_url: must start with http:// or https://",
        ),
        ("tasks: [{name: t\n", "invalid YAML"),
        ("- just a list", "top level must be a mapping"),
    ],
)
def test_bad_config_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    with pytest.raises(ConfigError, match=r"relmon\.yaml"):
        load_settings(write(tmp_path, text))
    assert main(["check-config", "--config", str(tmp_path / "relmon.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("relmon: error: ") and err.count("\n") == 1
    assert expected in err
    assert "Traceback" not in err


def test_missing_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--config", "/no/such/file.yaml"]) == 2
    assert "cannot read" in capsys.readouterr().err
