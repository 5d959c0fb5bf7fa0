"""The chart's traffic values beyond one upstream: the proxy's routes (``traffic.routes``,
passed to relmon as given) and the OTLP/HTTP receiver (``traffic.otlp``, with its
container port, Service port and NetworkPolicy rule). Each rendered relmon.yaml is loaded
by relmon itself, so the chart and relmon agree on what the values mean; with the default
values neither appears."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from monitor.app.route_checks import route_problems
from monitor.config import Settings, load_settings
from tests.deploy.chart import (
    CHART,
    ROOT,
    application_chart,
    by_kind,
    relmon_config,
    render,
    validate_manifest,
)

OPENAI = "https://api.openai.com"
ANTHROPIC = "https://api.anthropic.com"
ROUTES = [
    {
        "name": "anthropic",
        "match": {"api": "anthropic.messages"},
        "upstream_url": ANTHROPIC,
        "upstream_read_timeout_s": 300,
    },
    {"match": {"path_prefix": "/internal/"}, "upstream_url": "http://model.llm.svc:8000"},
]
PROXY = {"traffic": {"mode": "proxy", "upstreamUrl": OPENAI, "routes": ROUTES}}
OTLP = {
    "enabled": True,
    "maxBodyBytes": 16_777_216,
    "forwardTo": "http://otel-collector.observability:4318",
    "joinSeconds": 2.5,
    "queueSize": 40_000,
}
COLLECTOR = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}


def loaded(docs: list[dict[str, Any]], tmp_path: Path) -> Settings:
    """relmon's settings from the rendered relmon.yaml (relmon's own loader)."""
    path = tmp_path / "relmon.yaml"
    path.write_text(yaml.safe_dump(relmon_config(docs)))
    return load_settings(path)


def lint_findings(values: dict[str, Any]) -> list[Any]:
    report = helm_python.lint(CHART, values, strict=True, kube_version="v1.30.0")
    return [*report["errors"], *report["messages"]]


def relmon_ports(docs: list[dict[str, Any]]) -> dict[str, int]:
    (deployment,) = by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def policy_ports(docs: list[dict[str, Any]]) -> dict[int, list[Any]]:
    (policy,) = by_kind(docs, "NetworkPolicy")
    return {rule["ports"][0]["port"]: rule["from"] for rule in policy["spec"]["ingress"]}


def test_routes_reach_relmon_as_given(tmp_path: Path) -> None:
    """OpenAI by default, Anthropic's Messages API and a path prefix routed elsewhere: the
    routes arrive unchanged and relmon reads the labels and upstreams it was given."""
    assert lint_findings(PROXY) == []
    docs = render(PROXY)
    for doc in docs:
        validate_manifest(doc)
    assert relmon_config(docs)["traffic"]["routes"] == ROUTES
    traffic = loaded(docs, tmp_path).traffic
    assert traffic.mode == "proxy" and traffic.upstream_url == OPENAI
    assert traffic.route_labels() == ["anthropic", "1"]
    assert [r.upstream_url for r in traffic.routes] == [ANTHROPIC, "http://model.llm.svc:8000"]
    assert [r.match.describe() for r in traffic.routes] == [
        "api anthropic.messages",
        "path_prefix /internal/",
    ]
    assert traffic.routes[0].upstream_read_timeout_s == 300.0
    assert traffic.routes[1].upstream_read_timeout_s is None  # traffic's own, 60
    assert route_problems(loaded(docs, tmp_path))[0] == []


def test_a_proxy_of_routes_alone_needs_no_default_upstream(tmp_path: Path) -> None:
    values = {"traffic": {"mode": "proxy", "routes": ROUTES[:1]}}
    traffic = loaded(render(values), tmp_path).traffic
    assert traffic.upstream_url is None and traffic.route_labels() == ["anthropic"]
    with pytest.raises(helm_python.HelmRenderError, match=r"upstreamUrl or traffic\.routes"):
        render({"traffic": {"mode": "proxy"}})
    with pytest.raises(helm_python.HelmRenderError, match=r"set traffic\.mode: proxy"):
        render({"traffic": {"mode": "mirror", "routes": ROUTES}})


def test_otlp_renders_its_port_service_policy_and_relmon_config(tmp_path: Path) -> None:
    values = {
        "traffic": {"otlp": OTLP},
        "networkPolicy": {"otlpFrom": [COLLECTOR]},
        "secret": {"reviewToken": "review-token-for-ci"},
    }
    assert lint_findings(values) == []
    docs = render(values)
    for doc in docs:
        validate_manifest(doc)
    assert relmon_ports(docs)["relmon-otlp"] == 4318
    (service,) = by_kind(docs, "Service")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["otlp"]["port"] == 4318 and ports["otlp"]["targetPort"] == "relmon-otlp"
    assert policy_ports(docs)[4318] == [COLLECTOR]
    assert policy_ports(docs)[9110] == [{"podSelector": {}}]  # the traffic port's own
    rendered = relmon_config(docs)["traffic"]["otlp"]
    assert "forward_timeout_s" not in rendered and "max_waiting_spans" not in rendered
    otlp = loaded(docs, tmp_path).traffic.otlp
    assert otlp.enabled and (otlp.host, otlp.port) == ("0.0.0.0", 4318)
    assert otlp.forward_to == OTLP["forwardTo"] and otlp.join_s == 2.5
    assert (otlp.max_body_bytes, otlp.queue_size) == (16_777_216, 40_000)
    assert (otlp.forward_timeout_s, otlp.max_waiting_spans) == (10.0, 10_000)  # relmon's


def test_otlp_alone_feeds_a_standalone_relmon_through_its_service(tmp_path: Path) -> None:
    """With traffic.mode off the receiver is the only source: it counts as one, and the
    pod's readiness must not take it out of its Service (/readyz/traffic, as a mirror)."""
    values = {"traffic": {"mode": "off", "otlp": {"enabled": True}}}
    docs = render(values)
    assert set(relmon_ports(docs)) == {"relmon-metrics", "relmon-review", "relmon-otlp"}
    (deployment,) = by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz/traffic"
    settings = loaded(docs, tmp_path)
    assert settings.traffic.mode == "off" and settings.traffic.otlp.enabled
    with pytest.raises(helm_python.HelmRenderError, match="needs a traffic source"):
        render({"traffic": {"mode": "off"}})


def test_a_sidecar_receives_otlp_on_loopback_without_a_service_port(tmp_path: Path) -> None:
    app_values = yaml.safe_load((ROOT / "deploy" / "helm" / "sidecar-values.yaml").read_text())
    app_values["relmon"]["traffic"]["otlp"] = {"enabled": True}
    docs = render({}, chart=application_chart(tmp_path, values=yaml.safe_dump(app_values)))
    (deployment,) = by_kind(docs, "Deployment")
    (relmon,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert {"name": "relmon-otlp", "containerPort": 4318, "protocol": "TCP"} in relmon["ports"]
    (service,) = by_kind(docs, "Service")
    assert [p["name"] for p in service["spec"]["ports"]] == ["review"]
    otlp = loaded(docs, tmp_path).traffic.otlp
    assert otlp.enabled and (otlp.host, otlp.port) == ("127.0.0.1", 4318)


def test_default_values_render_no_routes_and_no_otlp(tmp_path: Path) -> None:
    docs = render({})
    traffic = relmon_config(docs)["traffic"]
    assert "routes" not in traffic and "otlp" not in traffic
    assert "relmon-otlp" not in relmon_ports(docs)
    (service,) = by_kind(docs, "Service")
    assert "otlp" not in {p["name"] for p in service["spec"]["ports"]}
    assert 4318 not in policy_ports(docs)
    settings = loaded(docs, tmp_path)
    assert settings.traffic.routes == [] and not settings.traffic.otlp.enabled


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"ports": {"otlp": 9110}, "traffic": {"otlp": {"enabled": True}}}, "port of its own"),
        (
            {"hosts": {"otlp": "127.0.0.1"}, "traffic": {"otlp": {"enabled": True}}},
            "hosts.otlp",
        ),
    ],
)
def test_the_template_refuses_an_otlp_listener_that_cannot_work(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(values)


@pytest.mark.parametrize(
    "traffic",
    [
        {"routes": [{"match": {"api": "anthropic.messages"}}]},  # no upstream_url
        {"routes": [{"match": "anthropic.messages", "upstream_url": ANTHROPIC}]},
        {"routes": [{"match": {"api": "openai.chat"}, "upstream_url": f"{OPENAI}/v1"}]},
        {"otlp": {"enabled": True, "port": 4318}},  # the port is ports.otlp
        {"otlp": {"enabled": True, "joinSeconds": 301}},
        {"otlp": {"enabled": True, "forwardTo": "otel:4318"}},
        {"otlp": {"enabled": "yes"}},
    ],
)
def test_schema_rejects_bad_routes_and_otlp_values(traffic: dict[str, Any]) -> None:
    chart = helm_python.Chart.load(CHART)
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema({"traffic": {"mode": "proxy", "upstreamUrl": OPENAI, **traffic}})
