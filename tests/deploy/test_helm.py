"""The Helm chart, with the real Helm engine (helm-python-sdk) and kubernetes-validate:
lint (strict) and render of every ci/ scenario, every manifest validated against the
Kubernetes 1.30 schemas and the Prometheus Operator / KEDA CRDs' schemas, schema
violations rejected, the sidecar template used from an application chart, and the
PrometheusRule / dashboard generated from deploy/ (no drift). The chart's behaviour for
real clusters (shared store, sidecar, reproducible renders) is tested in
test_helm_cluster.py."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from monitor.app.validation import validate_settings
from monitor.config import load_settings
from tests.deploy.chart import (
    CHART,
    ROOT,
    SCENARIOS,
    application_chart,
    by_kind,
    relmon_config,
    render,
    validate_manifest,
    values_of,
)
from tests.kafka.tls import make_pki

ALL = [None, *SCENARIOS]
IDS = ["defaults", *(p.name.removesuffix("-values.yaml") for p in SCENARIOS)]


def test_the_ci_scenarios_exist() -> None:
    names = {p.name for p in SCENARIOS}
    assert {
        "standalone-kafka-values.yaml",
        "standalone-proxy-postgres-values.yaml",
        "sidecar-values.yaml",
        "sidecar-postgres-values.yaml",
        "metrics-off-values.yaml",
        "existing-secret-values.yaml",
    } <= names


@pytest.mark.parametrize("scenario", ALL, ids=IDS)
def test_lint_strict_has_no_findings(scenario: Path | None) -> None:
    report = helm_python.lint(CHART, values_of(scenario), strict=True, kube_version="v1.30.0")
    assert report["errors"] == [] and report["messages"] == [], report


@pytest.mark.parametrize("scenario", ALL, ids=IDS)
def test_every_rendered_manifest_is_valid_kubernetes(scenario: Path | None, tmp_path: Path) -> None:
    docs = render(values_of(scenario))
    assert docs
    for doc in docs:
        validate_manifest(doc)
    for rule in by_kind(docs, "PrometheusRule"):
        path = tmp_path / "rule.yml"
        path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        result = subprocess.run(
            ["promtool", "check", "rules", str(path)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    for monitor in by_kind(docs, "ServiceMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/part-of"
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
        service = by_kind(docs, "Service")[0]
        assert service["metadata"]["labels"]["app.kubernetes.io/part-of"] == "relmon"
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= service["metadata"]["labels"].items()
    for monitor in by_kind(docs, "PodMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert_pod_monitor_scrapes_relmon_as_job_relmon(monitor)
    for scaled in by_kind(docs, "ScaledObject"):
        assert scaled["apiVersion"] == "keda.sh/v1alpha1"
        trigger = scaled["spec"]["triggers"][0]
        assert trigger["type"] == "prometheus"
        # The metric relmon exports, on the traffic topic relmon.yaml consumes; each
        # partition counted once even while two replicas export it during a rebalance.
        traffic = relmon_config(docs)["kafka"]["traffic_topic"]
        assert trigger["metadata"]["query"] == (
            f'sum(max by (partition) (relmon_kafka_consumer_lag{{topic="{traffic}"}}))'
        )
        deployment = by_kind(docs, "Deployment")[0]
        assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert "replicas" not in deployment["spec"]  # KEDA owns the replica count


SECRET_MOUNTS = (
    "/etc/relmon/secrets/",
    "/etc/relmon/review-auth/",
    "/etc/relmon/store/",
    "/etc/relmon/kafka-tls/",
    "/var/lib/relmon/",
)
"""Where relmon.yaml's files live in the pod: the Secrets' mounts and the state volume."""


def secret_file_content(key: str, tmp_path: Path) -> bytes:
    """What a Secret of that kind holds (a throwaway CA for the Kafka TLS files)."""
    if key in {"ca_file", "cert_file", "key_file"}:
        pki = make_pki(tmp_path / "pki")
        source = {"ca_file": pki.ca, "cert_file": pki.client_cert, "key_file": pki.client_key}
        return source[key].read_bytes()
    if key == "tokens_file":
        return b"alice:0123456789abcdef0123\nbob:fedcba9876543210fedc\n"
    if key == "dsn_file":
        return b"postgresql://relmon:pw@db.llm.svc:5432/relmon\n"
    return b"s3cret-0123456789abcdef0123456789abcdef\n"


def point_files_at(node: Any, tmp_path: Path, mounts: set[str]) -> Any:
    """relmon.yaml with every file it names (a ``*_file`` key) written under tmp_path, after
    checking that the pod mounts the volume it lives on."""
    if isinstance(node, list):
        return [point_files_at(v, tmp_path, mounts) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key.endswith("_file") and isinstance(value, str):
            assert value.startswith(SECRET_MOUNTS), (key, value)
            assert any(value.startswith(m.rstrip("/") + "/") for m in mounts), (value, mounts)
            local = tmp_path / "files" / value.lstrip("/")
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(secret_file_content(key, tmp_path))
            out[key] = str(local)
        else:
            out[key] = point_files_at(value, tmp_path, mounts)
    return out


def relmon_container(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """relmon's container in the standalone Deployment (None in sidecar mode)."""
    for deployment in by_kind(docs, "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "relmon":
                return dict(container)
    return None


@pytest.mark.parametrize("scenario", ALL, ids=IDS)
def test_the_rendered_relmon_config_passes_relmons_own_validation(
    scenario: Path | None, tmp_path: Path
) -> None:
    """The ConfigMap's relmon.yaml, with the files it names in place (each on a volume the
    container mounts), passes the validation that ``relmon run`` and ``relmon
    check-config`` run."""
    values = values_of(scenario)
    docs = render(values)
    config = relmon_config(docs)
    container = relmon_container(docs)
    mounts = (
        {m["mountPath"] for m in container["volumeMounts"]}
        if container is not None
        else set(SECRET_MOUNTS)  # sidecar: checked on the application's pod elsewhere
    )
    path = tmp_path / "relmon.yaml"
    path.write_text(yaml.safe_dump(point_files_at(config, tmp_path, mounts)))
    settings = load_settings(path)
    assert settings.metrics.port == 9108 and str(settings.state_dir) == "/var/lib/relmon"
    assert settings.metrics.host == "0.0.0.0"  # Prometheus reaches it
    if values.get("mode") == "sidecar":
        assert settings.traffic.host == "127.0.0.1"  # the application sends from its pod
    else:
        assert settings.review.host == settings.traffic.host == "0.0.0.0"
    if settings.review.backend == "http" and settings.review.auth == "token":
        assert settings.review.token_file is not None or settings.review.tokens_file is not None
    assert validate_settings(settings) == []


def test_standalone_pod_is_locked_down_and_probed() -> None:
    docs = render(values_of(CHART / "ci" / "standalone-mirror-values.yaml"))
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # Fed through the Service: /readyz would lock it out of its own traffic (see below).
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz/traffic"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["args"] == ["run", "--config", "/etc/relmon/config/relmon.yaml"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/relmon/secrets"]["readOnly"] is True  # secrets as files
    assert "env" not in container  # nothing secret in the environment
    volumes = {v["name"]: v for v in pod["volumes"]}
    pvc = by_kind(docs, "PersistentVolumeClaim")[0]
    assert volumes["relmon-state"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # SQLite: one writer
    assert by_kind(docs, "PodDisruptionBudget") and by_kind(docs, "NetworkPolicy")


def readiness_path(values: dict[str, Any]) -> str:
    (deployment,) = by_kind(render(values), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    path: str = container["readinessProbe"]["httpGet"]["path"]
    return path


def test_readiness_follows_monitoring_only_where_traffic_does_not_depend_on_it() -> None:
    """/readyz (503 while a circuit breaker is open) only where relmon pulls its traffic
    from Kafka: the consumer keeps going while the pod is unready, so the next event's
    first call is the breaker's trial. A pod fed through its Service (mirror, proxy)
    would be removed from it, get no item, never send a trial and never recover."""
    kafka = values_of(CHART / "ci" / "standalone-kafka-values.yaml")
    assert readiness_path(kafka) == "/readyz"
    assert readiness_path({}) == "/readyz/traffic"  # the default: mirror via the Service
    mirror = values_of(CHART / "ci" / "standalone-mirror-values.yaml")
    assert readiness_path(mirror) == "/readyz/traffic"
    both = {"kafka": {"enabled": True}, "traffic": {"mode": "mirror"}}
    assert readiness_path(both) == "/readyz/traffic"  # the mirror half needs the Service
    proxy = {"traffic": {"mode": "proxy", "upstreamUrl": "http://model:8000"}}
    assert readiness_path(proxy) == "/readyz/traffic"  # in the live path
    assert readiness_path({**proxy, "probes": {"readinessPath": "/readyz"}}) == "/readyz"
    with pytest.raises(Exception, match="readinessPath"):
        render({"probes": {"readinessPath": "/metrics"}})


def test_existing_secret_is_mounted_and_no_secret_is_created() -> None:
    docs = render(values_of(CHART / "ci" / "existing-secret-values.yaml"))
    assert by_kind(docs, "Secret") == []
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["relmon-secrets"]["secret"]["secretName"] == "relmon-credentials"


def test_metrics_off_renders_no_monitoring_objects() -> None:
    docs = render(values_of(CHART / "ci" / "metrics-off-values.yaml"))
    kinds = {d["kind"] for d in docs}
    assert kinds.isdisjoint({"ServiceMonitor", "PodMonitor", "PrometheusRule"})
    assert "ConfigMap" in kinds
    dashboards = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"].get("labels", {})
    ]
    assert not dashboards
    # Scraped by annotations instead: they reach the pod, on the metrics port.
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9108"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"review": {"backend": "kafka"}}, "enabled"),
        ({"unknownKey": 1}, "unknownKey"),
        ({"mode": "daemonset"}, "mode"),
        ({"ports": {"metrics": 0, "review": 9109, "traffic": 9110}}, "metrics"),
        ({"config": {"tasks": []}}, "tasks"),
        ({"config": {"tasks": [{"name": "a"}], "metrics": {"port": 1}}}, "config"),
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "interval"),
        ({"metrics": {"podMonitor": {"interval": "often"}}}, "interval"),
        ({"metrics": {"podMonitor": {"podSelector": {"app": 1}}}}, "podSelector"),
        ({"listenHost": "0.0.0.0"}, "listenHost"),  # one host per listener: hosts.*
        ({"store": {"backend": "mysql"}}, "backend"),
        ({"image": {"repository": "r", "digest": "latest"}}, "digest"),
        ({"sidecar": {"appReplicas": 0}}, "appReplicas"),
        ({"review": {"backend": "http", "auth": {"mode": "oauth"}}}, "mode"),
        ({"metrics": {"podMonitor": {"labels": {"release": "x"}}}}, "labels"),
        ({"metrics": {"prometheusRule": {"disabledAlerts": ["up"]}}}, "disabledAlerts"),
        ({"kafka": {"maxEventBytes": 10}}, "maxEventBytes"),
    ],
)
def test_schema_violations_are_rejected(values: dict[str, Any], message: str) -> None:
    chart = helm_python.Chart.load(CHART)
    with pytest.raises(helm_python.HelmValuesError, match=message):
        chart.validate_schema(values)
    with pytest.raises(helm_python.HelmValuesError):
        chart.render(values, name="rel", namespace="llm")


def test_the_template_refuses_several_sqlite_writers_even_without_the_schema(
    tmp_path: Path,
) -> None:
    chart = tmp_path / "relmon"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").unlink()
    with pytest.raises(helm_python.HelmRenderError, match="single writer"):
        render({"replicaCount": 3}, chart=chart)
    with pytest.raises(helm_python.HelmRenderError, match=r"keda.enabled .* shared store"):
        render({"keda": {"enabled": True}, "kafka": {"enabled": True}}, chart=chart)
    assert by_kind(render({"replicaCount": 1}, chart=chart), "Deployment")
    # With a shared store the state volume is an emptyDir: no claim for several pods.
    kafka = {"replicaCount": 2, "review": {"backend": "kafka"}, "kafka": {"enabled": True}}
    docs = render({**kafka, "persistence": {"enabled": True}}, chart=chart)
    assert by_kind(docs, "PersistentVolumeClaim") == []


def test_names_are_truncated_to_63_characters() -> None:
    name = "a-very-long-release-name-that-goes-on-and-on-past-the-dns-limit"
    docs = render({"metrics": {"dashboard": {"enabled": True}}}, name=name)
    assert {"PersistentVolumeClaim", "ConfigMap"} <= {d["kind"] for d in docs}
    for doc in docs:
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]


FREEFORM = {"config", "resources", "podSecurityContext", "securityContext"}
"""Keys whose contents are examples of a Kubernetes or relmon structure, not chart keys."""


def test_values_yaml_comments_every_key() -> None:
    """Every chart key has a comment line right above it."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str]] = []
    checked = 0
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w-]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        inside_freeform = any(key in FREEFORM for _, key in stack)
        stack.append((indent, match.group(2)))
        if inside_freeform:
            continue
        checked += 1
        assert lines[i - 1].strip().startswith("#"), f"values.yaml line {i + 1}: {line}"
    assert checked > 60


def leaf_values(node: Any, path: str = "") -> list[str]:
    """Dotted paths of the values a user sets (a freeform or list value counts as one)."""
    if not isinstance(node, dict) or not node or path.rsplit(".", maxsplit=1)[-1] in FREEFORM:
        return [path]
    return [leaf for key, value in node.items() for leaf in leaf_values(value, f"{path}.{key}")]


def test_the_chart_readme_lists_every_value() -> None:
    """helm/relmon/README.md's table has a row for every value of values.yaml."""
    readme = (CHART / "README.md").read_text()
    rows = set(re.findall(r"^\| `([\w.]+)` \|", readme, flags=re.M))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    leaves = {leaf.lstrip(".") for leaf in leaf_values(values)}
    assert leaves - rows == set(), "values missing from the chart's README"
    assert rows - leaves == set(), "rows of the chart's README that are no value"


# ---------------------------------------------------- generated from deploy/ (no drift)


@pytest.mark.parametrize("name", ["relmon-recording.rules.yml", "relmon-alerts.rules.yml"])
def test_chart_rule_files_are_byte_equal_to_deploy_prometheus(name: str) -> None:
    chart_copy = CHART / "files" / "prometheus" / name
    assert chart_copy.read_bytes() == (ROOT / "deploy" / "prometheus" / name).read_bytes()


def test_chart_dashboard_is_byte_equal_to_deploy_grafana() -> None:
    chart_copy = CHART / "files" / "grafana" / "relmon.json"
    assert chart_copy.read_bytes() == (ROOT / "deploy" / "grafana" / "relmon.json").read_bytes()


def test_prometheus_rule_holds_exactly_the_deploy_rules() -> None:
    base = "https://wiki.internal/relmon/RUNBOOK.md"
    values = {"metrics": {"prometheusRule": {"enabled": True, "runbookBaseUrl": base}}}
    (rule,) = by_kind(render(values), "PrometheusRule")
    expected = []
    for name in ("relmon-recording.rules.yml", "relmon-alerts.rules.yml"):
        text = (ROOT / "deploy" / "prometheus" / name).read_text()
        text = text.replace("https://relmon.example/deploy/RUNBOOK.md", base)
        expected.extend(yaml.safe_load(text)["groups"])
    assert rule["spec"]["groups"] == expected
    dashboard = by_kind(render({"metrics": {"dashboard": {"enabled": True}}}), "ConfigMap")
    (dash,) = [d for d in dashboard if d["metadata"]["name"].endswith("-dashboard")]
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(dash["data"]["relmon.json"])
    assert board == json.loads((ROOT / "deploy" / "grafana" / "relmon.json").read_text())


# ------------------------------------------------------------------------- sidecar


def relmon_in(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """relmon's container in a pod spec: a native sidecar or a plain container."""
    (relmon,) = [
        c
        for c in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
        if c["name"] == "relmon"
    ]
    return relmon


def test_sidecar_template_adds_relmon_to_an_application_pod(tmp_path: Path) -> None:
    """An application chart with relmon as a dependency includes the sidecar templates."""
    docs = render({}, chart=application_chart(tmp_path))
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["app"]
    assert [c["name"] for c in pod["initContainers"]] == ["relmon"]  # native sidecar
    relmon = relmon_in(pod)
    assert relmon["restartPolicy"] == "Always"
    # Mirrored traffic: relmon's readiness must not decide the application pod's.
    assert "readinessProbe" not in relmon
    volumes = {v["name"] for v in pod["volumes"]}
    mounts = {m["name"] for m in relmon["volumeMounts"]}
    assert mounts <= volumes
    config = by_kind(docs, "ConfigMap")[0]
    assert {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v} == {
        config["metadata"]["name"]
    }
    for doc in docs:
        validate_manifest(doc)


def assert_pod_monitor_scrapes_relmon_as_job_relmon(
    monitor: dict[str, Any], pod: dict[str, Any] | None = None
) -> None:
    """The PodMonitor scrapes relmon's metrics port under job="relmon", the job the alert
    rules match (up{job="relmon"}); with ``pod`` (a pod template), it selects that pod."""
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "relmon-metrics" and endpoint["path"] == "/metrics"
    assert {"action": "replace", "targetLabel": "job", "replacement": "relmon"} in endpoint[
        "relabelings"
    ]
    rules = (ROOT / "deploy" / "prometheus" / "relmon-alerts.rules.yml").read_text()
    assert 'up{job="relmon"}' in rules
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}
    if pod is None:
        return
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector and selector.items() <= pod["metadata"]["labels"].items()
    relmon = relmon_in(pod["spec"])
    containers = [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
    names = [p["name"] for c in containers for p in c.get("ports", [])]
    assert names.count("relmon-metrics") == 1  # relmon's container only
    assert "relmon-metrics" in {p["name"] for p in relmon["ports"]}


def test_a_pod_monitor_scrapes_relmon_without_a_service(tmp_path: Path) -> None:
    """The sidecar has no Service, so no ServiceMonitor can find it: the PodMonitor
    selects the application's pods and relmon's port in them, as job "relmon"."""
    # Standalone: the Deployment's own pods by default.
    docs = render({"metrics": {"podMonitor": {"enabled": True}}})
    (monitor,) = by_kind(docs, "PodMonitor")
    (deployment,) = by_kind(docs, "Deployment")
    assert_pod_monitor_scrapes_relmon_as_job_relmon(monitor, deployment["spec"]["template"])
    assert by_kind(render({}), "PodMonitor") == []  # off by default
    # Sidecar: the application chart of deploy/helm/, with relmon as a dependency.
    docs = render({}, chart=application_chart(tmp_path))
    (monitor,) = by_kind(docs, "PodMonitor")
    (deployment,) = by_kind(docs, "Deployment")
    assert_pod_monitor_scrapes_relmon_as_job_relmon(monitor, deployment["spec"]["template"])
    assert by_kind(docs, "ServiceMonitor") == []
    (service,) = by_kind(docs, "Service")  # the review port only: metrics go by the PodMonitor
    assert [p["name"] for p in service["spec"]["ports"]] == ["review"]
    # The ci scenario (linted strict) has one too.
    (monitor,) = by_kind(render(values_of(CHART / "ci" / "sidecar-values.yaml")), "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "my-app"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {
                "mode": "sidecar",
                "sidecar": {"appReplicas": 1},
                "secret": {"reviewToken": "t"},
                "service": {"enabled": False},
            },
            "podSelector",
        ),
        ({"hosts": {"metrics": "127.0.0.1"}}, "loopback"),
        ({"serviceMonitor": {"enabled": True}}, "not both"),
    ],
)
def test_the_template_refuses_a_pod_monitor_that_cannot_work(
    values: dict[str, Any], message: str
) -> None:
    values = {**values, "metrics": {"podMonitor": {"enabled": True}}}
    if "serviceMonitor" in values:
        values["metrics"]["serviceMonitor"] = values.pop("serviceMonitor")
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(values)


def test_the_query_hash_key_comes_from_the_values_or_each_pod() -> None:
    """secret.queryHashKey: one key for every replica, in the chart's Secret; without it
    (nothing is generated at render time) each pod generates its own in its state volume."""
    key = "0123456789abcdef0123456789abcdef"
    for values in ({}, {"review": {"backend": "kafka"}, "kafka": {"enabled": True}}):
        docs = render({**values, "secret": {"queryHashKey": key}})
        [secret] = by_kind(docs, "Secret")
        assert base64.b64decode(secret["data"]["query-hash-key"]).decode() == key
        assert relmon_config(docs)["query_hash_key_file"] == "/etc/relmon/secrets/query-hash-key"
        assert key not in json.dumps(by_kind(docs, "ConfigMap"))
        assert "query_hash_key_file" not in relmon_config(render(values))
    docs = render(values_of(CHART / "ci" / "existing-secret-values.yaml"))
    assert "query_hash_key_file" not in relmon_config(docs)


def test_a_tasks_endpoint_settings_reach_relmon_unchanged(tmp_path: Path) -> None:
    """The chart copies ``config.tasks`` as given (the schema does not list endpoint keys):
    e.g. the circuit breaker's settings arrive in relmon.yaml and pass relmon's validation."""
    endpoint = {
        "base_url": "http://llm.default.svc:8000/v1",
        "model": "my-model",
        "circuit_breaker": {"failures": 2, "cooldown_s": 7.5},
        "retries": {"error": 1},
    }
    values = {"config": {"tasks": [{"name": "t", "endpoint": endpoint}]}}
    values["secret"] = {"reviewToken": "review-token-for-ci"}
    assert helm_python.lint(CHART, values, strict=True, kube_version="v1.30.0")["errors"] == []
    text = by_kind(render(values), "ConfigMap")[0]["data"]["relmon.yaml"]
    assert yaml.safe_load(text)["tasks"] == [{"name": "t", "endpoint": endpoint}]
    path = tmp_path / "relmon.yaml"
    path.write_text(text)
    breaker = load_settings(path).tasks[0].endpoint.circuit_breaker
    assert (breaker.failures, breaker.cooldown_s) == (2, 7.5)


def test_kafka_security_comes_from_the_secrets() -> None:
    """SASL_SSL with a client certificate: the password only in the chart's Secret (read
    from a file), the TLS files from the user's Secret, mounted read-only."""
    values = values_of(CHART / "ci" / "kafka-secured-values.yaml")
    docs = render(values)
    [secret] = by_kind(docs, "Secret")
    password = values["secret"]["kafkaSaslPassword"]
    assert base64.b64decode(secret["data"]["kafka-sasl-password"]).decode() == password
    for doc in docs:
        if doc["kind"] != "Secret":
            assert password not in json.dumps(doc), doc["kind"]
    kafka = yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["relmon.yaml"])["kafka"]
    assert kafka["security_protocol"] == "SASL_SSL"
    assert kafka["sasl"] == {
        "mechanism": "SCRAM-SHA-512",
        "username": "relmon",
        "password_file": "/etc/relmon/secrets/kafka-sasl-password",
    }
    assert kafka["tls"] == {
        "ca_file": "/etc/relmon/kafka-tls/ca.crt",
        "cert_file": "/etc/relmon/kafka-tls/user.crt",
        "key_file": "/etc/relmon/kafka-tls/user.key",
        "check_hostname": True,
    }
    assert kafka["session_timeout_ms"] == 45000 and kafka["heartbeat_interval_ms"] == 15000
    assert kafka["max_poll_interval_ms"] == 600000 and "rebalance_timeout_ms" not in kafka
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["relmon-kafka-tls"]["secret"]["secretName"] == "relmon-kafka-tls"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["relmon-kafka-tls"] == {
        "name": "relmon-kafka-tls",
        "mountPath": "/etc/relmon/kafka-tls",
        "readOnly": True,
    }
    # Defaults: plain Kafka, no TLS volume, no SASL, aiokafka's group timeouts.
    docs = render({"review": {"backend": "kafka"}, "kafka": {"enabled": True}})
    kafka = yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["relmon.yaml"])["kafka"]
    assert kafka["security_protocol"] == "PLAINTEXT"
    assert not {"tls", "sasl", "session_timeout_ms"} & kafka.keys()
    assert kafka["auto_offset_reset"] == "earliest"
    docs = render({"kafka": {"enabled": True, "autoOffsetReset": "latest"}})
    kafka = yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["relmon.yaml"])["kafka"]
    assert kafka["auto_offset_reset"] == "latest"
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    assert "relmon-kafka-tls" not in {v["name"] for v in pod["volumes"]}
    # TLS with the system's CAs: no Secret to mount, no file.
    docs = render({"kafka": {"enabled": True, "securityProtocol": "SSL"}})
    kafka = yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["relmon.yaml"])["kafka"]
    assert kafka["tls"] == {"check_hostname": True}


SECURED = {"review": {"backend": "kafka"}, "kafka": {"enabled": True}}


@pytest.mark.parametrize(
    ("kafka", "secret", "message"),
    [
        ({"securityProtocol": "SASL_SSL"}, {}, "needs kafka.sasl.mechanism"),
        (
            {"securityProtocol": "SASL_SSL", "sasl": {"mechanism": "PLAIN", "username": "u"}},
            {},
            "needs the password",
        ),
        ({"sasl": {"mechanism": "PLAIN", "username": "u"}}, {}, "kafka.sasl is set"),
        ({"tls": {"existingSecret": "s"}}, {}, "kafka.tls.existingSecret is set"),
        (
            {"securityProtocol": "SSL", "tls": {"existingSecret": "s", "certKey": "tls.crt"}},
            {},
            "go together",
        ),
    ],
)
def test_the_template_refuses_incomplete_kafka_security(
    kafka: dict[str, Any], secret: dict[str, Any], message: str
) -> None:
    values = {**SECURED, "kafka": {"enabled": True, **kafka}, "secret": secret}
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(values)


@pytest.mark.parametrize(
    "kafka",
    [
        {"securityProtocol": "TLS"},
        {"sasl": {"mechanism": "SCRAM-SHA-1"}},
        {"sessionTimeoutMs": 0},
        {"tls": {"caFile": "/x"}},
    ],
)
def test_schema_rejects_bad_kafka_security_values(kafka: dict[str, Any]) -> None:
    chart = helm_python.Chart.load(CHART)
    with pytest.raises(helm_python.HelmValuesError):
        chart.validate_schema({"kafka": kafka})


@pytest.mark.parametrize("backend", ["http", "kafka"])
def test_review_outbox_max_items_reaches_relmon_yaml_for_every_review_backend(
    backend: str,
) -> None:
    """review.outboxMaxItems arrives as review.outbox_max_items (any backend); unset, the
    key is left to relmon's default."""
    kafka = {"enabled": True} if backend == "kafka" else {}
    for given, expected in ((25000, 25000), (None, None)):
        values = {"review": {"backend": backend, "outboxMaxItems": given}, "kafka": kafka}
        text = by_kind(render(values), "ConfigMap")[0]["data"]["relmon.yaml"]
        assert yaml.safe_load(text)["review"].get("outbox_max_items") == expected
