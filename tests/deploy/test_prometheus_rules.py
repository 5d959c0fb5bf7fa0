"""Alert and recording rules: generated from the SLO spec (byte-identical in deploy/ and
the chart), promtool check, promtool unit tests for every alert (firing and not firing)
and for the scenarios alerts are trusted on, runbook anchors, and the Alertmanager
example checked with amtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.app.cli import main as cli_main
from monitor.app.slo import ALERTS_FILE, RECORDING_FILE, generate, load_spec
from monitor.app.slo.alerts import reliability_groups
from monitor.app.slo.pipeline import pipeline_groups
from monitor.app.slo.recording import recording_groups

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted(PROM.glob("*.rules.yml"))
TESTS = PROM / "tests" / "relmon-alerts.test.yml"
RUNBOOK = ROOT / "deploy" / "RUNBOOK.md"
SPEC = ROOT / "deploy" / "slo" / "relmon-slo.yaml"


def run(*cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300, check=False)


def _rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


def recordings() -> list[dict[str, Any]]:
    return [r for r in _rules() if "record" in r]


def test_rule_files_pass_promtool_check() -> None:
    assert len(RULE_FILES) == 2
    result = run("promtool", "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_FILES)


def test_example_prometheus_config_passes_promtool() -> None:
    result = run("promtool", "check", "config", str(PROM / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------- generated from the SLO spec


@pytest.mark.parametrize("name", [RECORDING_FILE, ALERTS_FILE])
def test_rules_in_deploy_and_the_chart_are_what_the_spec_generates(name: str) -> None:
    text = generate(load_spec(SPEC))[name]
    assert (PROM / name).read_text(encoding="utf-8") == text, f"run relmon slo generate ({name})"
    chart_copy = ROOT / "helm" / "relmon" / "files" / "prometheus" / name
    assert chart_copy.read_bytes() == text.encode()


def test_slo_generate_check_passes_on_the_repository_and_fails_on_a_changed_spec(
    tmp_path: Path,
) -> None:
    """The command line: `relmon slo generate --check` is clean on deploy/, and a changed
    minimum volume changes the rules it writes."""
    assert cli_main(["slo", "generate", "--spec", str(SPEC), "--out", str(PROM), "--check"]) == 0
    spec = tmp_path / "slo.yaml"
    spec.write_text(SPEC.read_text().replace("min_reviews: 20", "min_reviews: 50"))
    assert cli_main(["slo", "generate", "--spec", str(spec), "--out", str(PROM), "--check"]) == 1
    assert cli_main(["slo", "generate", "--spec", str(spec), "--out", str(tmp_path)]) == 0
    assert ">= 50" in (tmp_path / ALERTS_FILE).read_text()


def test_generated_text_is_exactly_the_rule_model() -> None:
    """The hand-written YAML parses back to the rules generated (expressions, for:,
    labels and every annotation word), for the shipped rules and the test variant."""
    for spec in (load_spec(SPEC), load_spec(SPEC).scaled(60)):
        files = generate(spec)
        parsed = {
            rule.get("record") or rule["alert"]: rule
            for name in (RECORDING_FILE, ALERTS_FILE)
            for group in yaml.safe_load(files[name])["groups"]
            for rule in group["rules"]
        }
        for group in recording_groups(spec) + reliability_groups(spec) + pipeline_groups(spec):
            for rule in group.rules:
                got = parsed[rule.name]
                assert got["expr"].split() == rule.expr.split(), rule.name
                assert got.get("for") == rule.for_, rule.name
                assert got.get("labels", {}) == rule.labels, rule.name
                assert got.get("annotations", {}) == {
                    k: " ".join(v.split()) for k, v in rule.annotations.items()
                }, rule.name


def test_burn_factors_match_the_slo_period() -> None:
    """30-day period: 14.4 (1h/5m) and 6 (6h/30m) page, 3 (1d/2h) and 1 (3d/6h) ticket."""
    spec = load_spec(SPEC)
    assert spec.period == "30d"
    assert [(w.long, w.short, w.factor) for w in spec.page] == [
        ("1h", "5m", 14.4),
        ("6h", "30m", 6),
    ]
    assert [(w.long, w.short, w.factor) for w in spec.ticket] == [("1d", "2h", 3), ("3d", "6h", 1)]
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
            rf"relmon_replica:sli_error:ratio_rate{window} > {re.escape(factor)} \* "
            r"relmon_replica:error_budget:ratio",
            expr,
        ), (window, factor)
    period = {r["record"]: r["expr"] for r in recordings()}["slo:period_burn_rate:ratio"]
    assert "slo:sli_error:ratio_rate30d" in period  # the period the factors are for


def test_no_page_on_fewer_than_the_minimum_reviews() -> None:
    """Every critical reliability alert carries the spec's volume gate (>= 20): the burn
    pairs on reviewed items in their long window, the alarm on the window's items, the
    lower bound on effective items; RelmonTooFewReviews is a warning."""
    spec = load_spec(SPEC)
    assert spec.min_reviews >= 20
    exprs = {a["alert"]: a for a in alerts()}
    fast = exprs["RelmonErrorBudgetBurnFast"]["expr"]
    for w in spec.page:
        assert f"relmon_replica:reviews:increase{w.long} >= {spec.min_reviews}" in fast
    assert (
        f"relmon_calibration_items >= {spec.min_reviews}" in exprs["RelmonReliabilityAlarm"]["expr"]
    )
    segment = exprs["RelmonSegmentReliabilityAlarm"]["expr"]
    assert f"relmon_segment_calibration_items >= {spec.min_reviews}" in segment
    assert "segment)" in segment  # by deployment and segment
    below = exprs["RelmonReliabilityBelowTarget"]["expr"]
    assert f"relmon_calibration_effective_items >= {spec.min_effective_items}" in below
    assert spec.min_effective_items >= spec.min_reviews
    assert exprs["RelmonTooFewReviews"]["labels"]["severity"] == "warning"
    assert "too few reviews to know" in exprs["RelmonTooFewReviews"]["annotations"]["description"]
    critical = {n for n, a in exprs.items() if a["labels"]["severity"] == "critical"}
    assert critical == {
        "RelmonReliabilityBelowTarget",
        "RelmonReliabilityAlarm",
        "RelmonSegmentReliabilityAlarm",
        "RelmonErrorBudgetBurnFast",
        "RelmonDown",
        "RelmonAbsent",
    }


def test_rules_keep_deployment_and_replica_labels() -> None:
    """Reliability alerts aggregate by (cluster, namespace, job, model, task); process
    health by the replica (cluster, namespace, job, pod, instance); never by model and
    task alone, the aggregation that let one namespace hide another."""
    deployment = "by (cluster, namespace, job, model, task"
    process = "by (cluster, namespace, job, pod, instance"
    for rule in alerts() + recordings():
        name, expr = rule.get("alert") or rule["record"], rule["expr"]
        for clause in re.findall(r"\bby \(([^)]*)\)", expr):
            labels = [x.strip() for x in clause.split(",")]
            assert labels[:3] == ["cluster", "namespace", "job"], (name, clause)
        assert "by (model, task)" not in expr and "without" not in expr, name
    per_replica = {"RelmonModelErrorsHigh", "RelmonCircuitOpen", "RelmonEventsDropped"}
    per_replica |= {"RelmonEventsRejected", "RelmonSourceRestarting", "RelmonDown"}
    per_replica |= {"RelmonReviewItemsLost"}
    for rule in alerts():
        if rule["alert"] in per_replica:
            assert process in rule["expr"], rule["alert"]
        elif rule["alert"] not in {"RelmonAbsent", "RelmonKafkaConsumerLagGrowing"}:
            assert deployment in rule["expr"] or "slo:" in rule["expr"] or "relmon:" in rule["expr"]


def test_every_recording_rule_is_used() -> None:
    """By an alert, another recording rule or the dashboard: no dead rules."""
    users = "\n".join(a["expr"] for a in alerts() + recordings())
    users += (ROOT / "deploy" / "grafana" / "relmon.json").read_text()
    for rule in recordings():
        name = rule["record"]
        uses = len(re.findall(re.escape(name) + r"(?![\w:])", users))
        own = 1 if re.search(re.escape(name) + r"(?![\w:])", rule["expr"]) else 0
        assert uses - own >= 1, f"recording rule {name} is used nowhere"


def test_promtool_unit_tests_pass() -> None:
    result = run("promtool", "test", "rules", TESTS.name, cwd=TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_scenarios_cover_the_contract() -> None:
    """The scenarios the alerts are trusted on: low volume (no page, the warning
    instead), one failing deployment beside a healthy one (fires for the failing one,
    its namespace intact), one failing replica beside a healthy one, all healthy
    (nothing fires), the restart threshold at exactly 2 and at 3."""
    cases = yaml.safe_load(TESTS.read_text())["tests"]

    def fired(alertname: str) -> list[dict[str, str]]:
        return [
            e["exp_labels"]
            for case in cases
            for check in case.get("alert_rule_test", [])
            if check["alertname"] == alertname
            for e in check.get("exp_alerts", [])
        ]

    too_few = [labels["task"] for labels in fired("RelmonTooFewReviews")]
    assert "low" in too_few and "low" not in [x["task"] for x in fired("RelmonErrorBudgetBurnFast")]
    below = fired("RelmonReliabilityBelowTarget")
    assert [b["namespace"] for b in below if b["task"] == "shared"] == ["team-a"]
    assert "split" in [b["task"] for b in below] and "fresh" not in [b["task"] for b in below]
    healthy = [
        c
        for c in cases
        if sum(1 for ch in c.get("alert_rule_test", []) if not ch["exp_alerts"]) >= 19
    ]
    assert healthy and {ch["alertname"] for ch in healthy[0]["alert_rule_test"]} == {
        a["alert"] for a in alerts()
    }
    restarts = fired("RelmonSourceRestarting")
    assert [r["pod"] for r in restarts] == ["relmon-0"]


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


def _anchors() -> set[str]:
    """GitHub's heading anchors of deploy/RUNBOOK.md: lower case, spaces to dashes."""
    return {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#{2,3} (.+)$", RUNBOOK.read_text(), flags=re.M)
    }


def test_every_alert_has_severity_summary_description_and_a_runbook_section() -> None:
    base = load_spec(SPEC).runbook_base_url
    assert base.endswith("/deploy/RUNBOOK.md") and base.startswith("https://")
    anchors = _anchors()
    for alert in alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in {"critical", "warning"}, name
        ann = alert["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}, name
        assert ann["summary"] and ann["description"], name
        url, _, anchor = ann["runbook_url"].partition("#")
        assert url == base and anchor == name.lower(), name
        assert anchor in anchors, f"no RUNBOOK.md section for {name}"


def test_a_broken_rule_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests bite: a burn-rate factor off by 10x makes them fail."""
    for path in RULE_FILES:
        shutil.copy(path, tmp_path / path.name)
    alerts_file = tmp_path / "relmon-alerts.rules.yml"
    text = alerts_file.read_text()
    assert "> 6 * relmon_replica:error_budget:ratio" in text
    alerts_file.write_text(
        text.replace(
            "> 6 * relmon_replica:error_budget:ratio", "> 60 * relmon_replica:error_budget:ratio"
        )
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
        (("severity=critical", "alertname=RelmonErrorBudgetBurnFast"), "relmon-page"),
        (("severity=warning", "alertname=RelmonTooFewReviews"), "relmon-tickets"),
        (("severity=warning", "alertname=RelmonCircuitOpen"), "relmon-tickets"),
    ):
        routed = run("amtool", "config", "routes", "test", f"--config.file={config}", *labels)
        assert routed.returncode == 0, routed.stderr
        assert routed.stdout.strip() == receiver


def test_alertmanager_example_reads_secrets_from_files_and_groups_by_deployment() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    assert config["route"]["group_by"] == ["cluster", "namespace", "model", "task"]
    receivers = {r["name"]: r for r in config["receivers"]}
    (pager,) = receivers["relmon-page"]["pagerduty_configs"]
    assert pager["routing_key_file"].startswith("/") and "routing_key" not in pager
    for name in ("relmon-page", "relmon-tickets"):
        for slack in receivers[name]["slack_configs"]:
            assert slack["api_url_file"].startswith("/") and "api_url" not in slack
    text = (ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text()
    assert "hooks.slack.com" not in text and "example.internal" not in text


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
    """A reliability page mutes the warnings of its own deployment only; one replica down
    mutes only its own per-replica alerts, never the deployment's alerts that the other
    replicas keep evaluating; relmon absent mutes relmon's alerts of the same cluster."""
    deployment = {"job": "relmon", "namespace": "llm", "model": "m", "task": "t"}
    replica = {"job": "relmon", "namespace": "llm", "pod": "relmon-0", "instance": "10.0.0.7:9108"}
    down = {"alertname": "RelmonDown", "severity": "critical", **replica}
    absent = {"alertname": "RelmonAbsent", "severity": "critical", "job": "relmon"}
    page = {"alertname": "RelmonErrorBudgetBurnFast", "severity": "critical", **deployment}
    reliability = {**page, "alertname": "RelmonReliabilityBelowTarget"}
    slow = {**page, "alertname": "RelmonErrorBudgetBurnSlow", "severity": "warning"}
    too_few = {**slow, "alertname": "RelmonTooFewReviews"}
    coverage = {**slow, "alertname": "RelmonCoverageBelowPromise", "alpha": "0.1"}
    circuit = {**slow, **replica, "alertname": "RelmonCircuitOpen"}
    dropped_here = {
        "alertname": "RelmonEventsDropped",
        "severity": "warning",
        **replica,
        "source": "mirror",
    }
    dropped_elsewhere = {**dropped_here, "pod": "relmon-1", "instance": "10.0.0.8:9108"}
    # the page mutes its deployment's warnings, not another namespace's or task's
    for target in (slow, too_few, coverage):
        assert inhibited(target, [page]), target["alertname"]
        assert not inhibited({**target, "namespace": "other"}, [page])
        assert not inhibited({**target, "task": "other"}, [page])
    assert not inhibited(circuit, [page])  # why monitoring stopped stays visible
    assert not inhibited(reliability, [page])  # pages never mute pages
    # a process page (RelmonDown, no model) mutes no deployment warning through it
    assert not inhibited(dropped_elsewhere, [down]) and not inhibited(slow, [down])
    for target in (reliability, coverage, dropped_elsewhere):
        assert not inhibited(target, [down]), target["alertname"]
    assert inhibited(dropped_here, [down]) and inhibited(circuit, [down])
    assert not inhibited(down, [down, absent]) and not inhibited(absent, [down, absent])
    for target in (reliability, coverage, dropped_here):
        assert inhibited(target, [absent]), target["alertname"]
    # several Prometheus servers sharing the Alertmanager (an external label per cluster)
    assert not inhibited({**reliability, "cluster": "b"}, [{**absent, "cluster": "a"}])
    assert not inhibited({**dropped_here, "cluster": "b"}, [{**down, "cluster": "a"}])
    assert not inhibited({**slow, "cluster": "b"}, [{**page, "cluster": "a"}])
    assert inhibited({**reliability, "cluster": "a"}, [{**absent, "cluster": "a"}])


# -------------------------------------------------------------------------- Sloth


def test_sloth_spec_is_the_same_slo_in_sloths_format(tmp_path: Path) -> None:
    """deploy/slo/sloth.yaml, checked structurally (Sloth's prometheus/v1 schema) and its
    queries with promtool, with every window Sloth renders."""
    sloth = yaml.safe_load((ROOT / "deploy" / "slo" / "sloth.yaml").read_text())
    assert sloth["version"] == "prometheus/v1" and sloth["service"]
    assert set(sloth) <= {"version", "service", "labels", "slos"}
    spec = load_spec(SPEC)
    rules = []
    for slo in sloth["slos"]:
        assert set(slo) <= {"name", "objective", "description", "sli", "alerting", "labels"}
        assert re.fullmatch(r"[a-z0-9-]+", slo["name"])
        assert 0 < slo["objective"] < 100
        events = slo["sli"]["events"]
        assert set(events) == {"error_query", "total_query"}
        assert 'outcome="rejected"' in events["error_query"]
        for query in events.values():
            assert "{{.window}}" in query and "relmon_top_answers_total" in query
            assert "by (cluster, namespace, job, model, task)" in query
            for window in ("5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d"):
                expr = query.replace("{{.window}}", window)
                rules.append({"record": f"sloth:check_{len(rules)}", "expr": expr})
        alerting = slo["alerting"]
        assert re.fullmatch(r"[A-Za-z]+", alerting["name"])
        # Sloth cannot gate on volume: its page alert must stay off, its ticket warns.
        assert alerting["page_alert"] == {"disable": True}
        assert alerting["ticket_alert"]["labels"]["severity"] == "warning"
        url, _, anchor = alerting["annotations"]["runbook_url"].partition("#")
        assert url == spec.runbook_base_url and anchor in _anchors()
    path = tmp_path / "sloth-queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "sloth", "rules": rules}]}))
    result = run("promtool", "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
