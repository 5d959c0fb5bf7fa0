"""Alert and recording rules: promtool check, promtool unit tests for every alert (firing
and not firing), runbook anchors, and the Alertmanager example checked with amtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted(PROM.glob("*.rules.yml"))
TESTS = PROM / "tests" / "relmon-alerts.test.yml"
RUNBOOK = ROOT / "deploy" / "RUNBOOK.md"
RUNBOOK_BASE = "https://relmon.example/deploy/RUNBOOK.md#"


def run(*cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300, check=False)


def alerts() -> list[dict[str, Any]]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(r for r in group["rules"] if "alert" in r)
    return out


def test_rule_files_pass_promtool_check() -> None:
    assert len(RULE_FILES) == 2
    result = run("promtool", "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_FILES)


def test_example_prometheus_config_passes_promtool() -> None:
    result = run("promtool", "check", "config", str(PROM / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    result = run("promtool", "test", "rules", TESTS.name, cwd=TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    names = {a["alert"] for a in alerts()}
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


def test_every_alert_has_severity_summary_description_and_a_runbook_section() -> None:
    anchors = {
        re.sub(r"[^a-z0-9-]", "", h.strip().lower().replace(" ", "-"))
        for h in re.findall(r"^## (.+)$", RUNBOOK.read_text(), flags=re.M)
    }
    for alert in alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in {"critical", "warning"}, name
        ann = alert["annotations"]
        assert ann["summary"] and ann["description"], name
        assert ann["runbook_url"] == RUNBOOK_BASE + name.lower(), name
        assert name.lower() in anchors, f"no RUNBOOK.md section for {name}"


def test_burn_rate_rules_use_the_sre_workbook_windows() -> None:
    exprs = {a["alert"]: a["expr"] for a in alerts()}
    fast, slow = exprs["RelmonErrorBudgetBurnFast"], exprs["RelmonErrorBudgetBurnSlow"]
    for window, factor, expr in (
        ("1h", "14.4", fast),
        ("5m", "14.4", fast),
        ("6h", "6", fast),
        ("30m", "6", fast),
        ("1d", "3", slow),
        ("2h", "3", slow),
        ("3d", "1", slow),
        ("6h", "1", slow),
    ):
        assert re.search(
            rf"slo:sli_error:ratio_rate{window}\)\s*> on \(model, task\) \({factor} \*", expr
        ), (window, factor)


def test_a_broken_rule_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests bite: a burn-rate factor off by 10x makes them fail."""
    for path in RULE_FILES:
        shutil.copy(path, tmp_path / path.name)
    alerts_file = tmp_path / "relmon-alerts.rules.yml"
    text = alerts_file.read_text()
    assert "(6 * slo:error_budget:ratio)" in text
    alerts_file.write_text(
        text.replace("(6 * slo:error_budget:ratio)", "(60 * slo:error_budget:ratio)")
    )
    (tmp_path / "tests").mkdir()
    shutil.copy(TESTS, tmp_path / "tests" / TESTS.name)
    result = run("promtool", "test", "rules", TESTS.name, cwd=tmp_path / "tests")
    assert result.returncode != 0
    assert "RelmonErrorBudgetBurnFast" in result.stdout + result.stderr


def test_alertmanager_example_passes_amtool_and_routes_by_severity() -> None:
    config = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
    result = run("amtool", "check-config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    for labels, receiver in (
        (("severity=critical", "alertname=RelmonReliabilityAlarm"), "relmon-page"),
        (("severity=warning", "alertname=RelmonCircuitOpen"), "relmon-tickets"),
    ):
        routed = run("amtool", "config", "routes", "test", f"--config.file={config}", *labels)
        assert routed.returncode == 0, routed.stderr
        assert routed.stdout.strip() == receiver
