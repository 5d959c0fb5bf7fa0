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


def _matches(matcher: str, labels: dict[str, str]) -> bool:
    match = re.fullmatch(r'\s*(\w+)\s*(=~|!~|!=|=)\s*"(.*)"\s*', matcher)
    assert match, matcher
    name, op, value = match.groups()
    actual = labels.get(name, "")
    if op in ("=~", "!~"):
        found = re.fullmatch(value, actual) is not None  # Alertmanager anchors regexes
        return found if op == "=~" else not found
    return (actual == value) if op == "=" else (actual != value)


def inhibited(target: dict[str, str], firing: list[dict[str, str]]) -> bool:
    """Alertmanager's inhibition: a firing source alert matching a rule's source matchers
    mutes a target matching its target matchers when every ``equal`` label has the same
    value on both, a missing label counting as the empty value."""
    config = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    for rule in config.get("inhibit_rules", []):
        if not all(_matches(m, target) for m in rule["target_matchers"]):
            continue
        for source in firing:
            if source is target or not all(_matches(m, source) for m in rule["source_matchers"]):
                continue
            if all(source.get(n, "") == target.get(n, "") for n in rule.get("equal", [])):
                return True
    return False


def test_alertmanager_inhibition_is_scoped_to_what_is_down() -> None:
    """One replica down mutes only its own per-replica alerts, never the model/task alerts
    that the other replicas keep evaluating; relmon absent mutes relmon's alerts of the
    same cluster only; a fast burn mutes the slow burn of its own task only."""
    # Labels as the rules produce them: up{job="relmon"} keeps its target's labels;
    # absent() keeps job; model/task alerts aggregate by (model, task[, alpha]);
    # per-replica alerts by (job, instance, source).
    down = {
        "alertname": "RelmonDown",
        "severity": "critical",
        "job": "relmon",
        "instance": "10.0.0.7:9108",
        "namespace": "llm",
        "pod": "rel-relmon-0",
    }
    absent = {"alertname": "RelmonAbsent", "severity": "critical", "job": "relmon"}
    reliability = {
        "alertname": "RelmonReliabilityBelowTarget",
        "severity": "critical",
        "model": "m",
        "task": "t",
    }
    coverage = {
        "alertname": "RelmonCoverageBelowPromise",
        "severity": "warning",
        "model": "m",
        "task": "t",
        "alpha": "0.1",
    }
    dropped_here = {
        "alertname": "RelmonEventsDropped",
        "severity": "warning",
        "job": "relmon",
        "instance": "10.0.0.7:9108",
        "source": "mirror",
    }
    dropped_elsewhere = {**dropped_here, "instance": "10.0.0.8:9108"}
    for target in (reliability, coverage, dropped_elsewhere):
        assert not inhibited(target, [down]), target["alertname"]
    assert inhibited(dropped_here, [down])
    assert not inhibited(down, [down, absent]) and not inhibited(absent, [down, absent])
    for target in (reliability, coverage, dropped_here):
        assert inhibited(target, [absent]), target["alertname"]
    # several Prometheus servers sharing the Alertmanager (an external label per cluster)
    assert not inhibited({**reliability, "cluster": "b"}, [{**absent, "cluster": "a"}])
    assert not inhibited({**dropped_here, "cluster": "b"}, [{**down, "cluster": "a"}])
    assert inhibited({**reliability, "cluster": "a"}, [{**absent, "cluster": "a"}])
    fast = {
        "alertname": "RelmonErrorBudgetBurnFast",
        "severity": "critical",
        "model": "m",
        "task": "t",
    }
    slow = {**fast, "alertname": "RelmonErrorBudgetBurnSlow", "severity": "warning"}
    assert inhibited(slow, [fast])
    assert not inhibited({**slow, "task": "other"}, [fast])
