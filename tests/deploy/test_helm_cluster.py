"""The chart on a real cluster: one monitor per deployment (a shared PostgreSQL store,
several replicas refused without one), the sidecar (native, a review Service and
Ingress, no fsGroup, a host per listener), reproducible renders, pods that roll when
their configuration changes, NetworkPolicy and Prometheus Operator objects as
kube-prometheus-stack needs them, and the values relmon's configuration has. Every
rendered document is validated (tests.deploy.chart.validate_manifest)."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path
from typing import Any

import helm_python
import pydantic
import pytest
import yaml

from monitor.config import Settings
from tests.deploy.chart import (
    CHART,
    ROOT,
    SCENARIOS,
    application_chart,
    by_kind,
    relmon_config,
    render,
    render_bytes,
    validate_manifest,
    values_of,
)

POSTGRES = {"store": {"backend": "postgres", "existingSecret": "relmon-db"}}
KAFKA = {"review": {"backend": "kafka"}, "kafka": {"enabled": True}, "traffic": {"mode": "off"}}
TOKEN = {"secret": {"reviewToken": "review-token-for-tests"}}
SIDECAR = {"mode": "sidecar", "sidecar": {"podSelector": {"app.kubernetes.io/name": "my-app"}}}


def valid(values: dict[str, Any], chart: Path = CHART) -> list[dict[str, Any]]:
    """The rendered documents, each validated."""
    docs = render(values, chart=chart)
    for doc in docs:
        validate_manifest(doc)
    return docs


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(docs, "Deployment")
    return dict(deployment["spec"]["template"]["spec"])


def relmon_of(spec: dict[str, Any]) -> dict[str, Any]:
    (relmon,) = [
        c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == "relmon"
    ]
    return relmon


def refused(values: dict[str, Any]) -> str:
    """The render's error message (the schema's or the templates')."""
    with pytest.raises(helm_python.HelmError) as info:
        render(values)
    return str(info.value)


# ------------------------------------------------------------------ the shared store


def test_the_dsn_comes_from_an_existing_secret_as_a_file_never_the_configmap() -> None:
    docs = valid({**POSTGRES, **TOKEN, "store": {**POSTGRES["store"], "dsnKey": "uri"}})
    config = relmon_config(docs)
    assert config["store"] == {
        "backend": "postgres",
        "dsn_file": "/etc/relmon/store/dsn",
        "sync_s": 2,
    }
    spec = pod_spec(docs)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["relmon-store"]["secret"]["secretName"] == "relmon-db"
    # Only the DSN's key is mounted (a CloudNativePG app Secret holds many).
    assert volumes["relmon-store"]["secret"]["items"] == [{"key": "uri", "path": "dsn"}]
    mounts = {m["name"]: m for m in relmon_of(spec)["volumeMounts"]}
    assert mounts["relmon-store"] == {
        "name": "relmon-store",
        "mountPath": "/etc/relmon/store",
        "readOnly": True,
    }
    assert "postgresql://" not in json.dumps(docs)
    # store.syncSeconds is store.sync_s.
    docs = render({**POSTGRES, **TOKEN, "store": {**POSTGRES["store"], "syncSeconds": 0.5}})
    assert relmon_config(docs)["store"]["sync_s"] == 0.5
    # Or RELMON_STORE__DSN from a secretKeyRef in extraEnv.
    env = {
        "name": "RELMON_STORE__DSN",
        "valueFrom": {"secretKeyRef": {"name": "db", "key": "uri"}},
    }
    docs = valid({"store": {"backend": "postgres"}, "extraEnv": [env], **TOKEN})
    assert "dsn_file" not in relmon_config(docs)["store"]
    assert relmon_of(pod_spec(docs))["env"] == [env]


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"store": {"backend": "postgres"}}, "store.existingSecret"),
        ({"store": {"existingSecret": "db"}}, "store.backend is not postgres"),
        (
            {
                **POSTGRES,
                "extraEnv": [{"name": "RELMON_STORE__DSN", "value": "postgresql://x"}],
            },
            "given twice",
        ),
    ],
)
def test_an_incomplete_store_is_refused_with_what_to_set(values: dict[str, Any], says: str) -> None:
    assert says in refused({**values, **TOKEN})


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCount": 3},
        {"keda": {"enabled": True}, "kafka": {"enabled": True}},
        {"mode": "sidecar"},
        {"mode": "sidecar", "sidecar": {"appReplicas": 3}},
    ],
    ids=["replicas", "keda", "sidecar", "sidecar-3-app-replicas"],
)
def test_several_pods_without_a_shared_store_are_refused(values: dict[str, Any]) -> None:
    """SQLite keeps one pod's state: the message names the values that fix it."""
    message = refused({**values, **TOKEN})
    assert "store.backend: postgres" in message or "replicaCount" in message
    if "replicaCount" not in values and "keda" not in values:
        assert "store.backend: postgres" in message and "review.backend: kafka" in message
        assert "sidecar.appReplicas: 1" in message


def test_template_messages_name_what_to_set_without_the_schema(tmp_path: Path) -> None:
    """The templates refuse the same as the schema (a chart used without its schema)."""
    chart = tmp_path / "relmon"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").unlink()
    with pytest.raises(helm_python.HelmRenderError) as info:
        render({"replicaCount": 3, **TOKEN}, chart=chart)
    message = str(info.value)
    assert "replicaCount 3 needs a shared store" in message
    assert "store.backend: postgres with store.existingSecret" in message
    assert "review.backend: kafka" in message


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCount": 3, **POSTGRES, **TOKEN},
        {"replicaCount": 3, **KAFKA},
        {**SIDECAR, **POSTGRES, **TOKEN},
        {**SIDECAR, **KAFKA},
        {**SIDECAR, **TOKEN, "sidecar": {**SIDECAR["sidecar"], "appReplicas": 1}},
    ],
    ids=["postgres", "kafka", "sidecar-postgres", "sidecar-kafka", "sidecar-one-app-replica"],
)
def test_several_pods_with_a_shared_store_render(values: dict[str, Any]) -> None:
    docs = valid(values)
    assert relmon_config(docs)["store"]["backend"] in {"sqlite", "postgres"}


def test_a_standalone_proxy_on_postgres_rolls_without_losing_capacity() -> None:
    """Several proxy replicas in the live path: RollingUpdate that starts a new pod before
    stopping an old one, a PodDisruptionBudget, no claim (the state is the database)."""
    docs = valid(values_of(CHART / "ci" / "standalone-proxy-postgres-values.yaml"))
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert by_kind(docs, "PersistentVolumeClaim") == []
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    assert volumes["relmon-state"] == {"name": "relmon-state", "emptyDir": {}}
    relmon = relmon_of(pod_spec(docs))
    assert relmon["readinessProbe"]["httpGet"]["path"] == "/readyz/traffic"
    assert relmon_config(docs)["traffic"]["upstream_url"] == "http://vllm.llm.svc:8000"
    # SQLite keeps Recreate: never two writers, not even during a rollout.
    (deployment,) = by_kind(render({}), "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_persistence_is_on_for_a_standalone_sqlite_install_only() -> None:
    docs = valid({})
    (claim,) = by_kind(docs, "PersistentVolumeClaim")
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    assert volumes["relmon-state"]["persistentVolumeClaim"] == {
        "claimName": claim["metadata"]["name"]
    }
    for values in ({"replicaCount": 2, **POSTGRES, **TOKEN}, {**KAFKA}):
        assert by_kind(render(values), "PersistentVolumeClaim") == []
    docs = render(values_of(CHART / "ci" / "sidecar-values.yaml"))
    assert by_kind(docs, "PersistentVolumeClaim") == []
    existing = render({"persistence": {"existingClaim": "kept"}})
    assert by_kind(existing, "PersistentVolumeClaim") == []
    volumes = {v["name"]: v for v in pod_spec(existing)["volumes"]}
    assert volumes["relmon-state"]["persistentVolumeClaim"] == {"claimName": "kept"}


# ------------------------------------------------------------------------ sidecar


def sidecar_app(tmp_path: Path, relmon: dict[str, Any]) -> list[dict[str, Any]]:
    """deploy/helm's application chart with these relmon values, validated."""
    values = yaml.safe_dump({"relmon": relmon})
    return valid({}, chart=application_chart(tmp_path, values=values))


def test_a_sidecar_next_to_a_three_replica_app_on_postgres(tmp_path: Path) -> None:
    """deploy/helm as shipped: a 3-replica application, relmon a native sidecar in each
    pod, one PostgreSQL store; the pod carries no fsGroup; every document valid."""
    app = application_chart(tmp_path)
    report = helm_python.lint(app, {}, strict=True, with_subcharts=True, kube_version="v1.30.0")
    assert report["errors"] == [], report
    assert [m["error"] for m in report["messages"]] == ["icon is recommended"]  # the test's app
    docs = valid({}, chart=app)
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    spec = deployment["spec"]["template"]["spec"]
    assert "fsGroup" not in spec.get("securityContext", {})
    relmon = relmon_of(spec)
    assert spec["initContainers"] == [relmon] and relmon["restartPolicy"] == "Always"
    assert relmon["securityContext"]["runAsUser"] == 10001  # its own user, not the pod's
    assert relmon["securityContext"]["runAsNonRoot"] is True
    config = relmon_config(docs)
    assert config["store"]["backend"] == "postgres"
    assert config["store"]["dsn_file"] == "/etc/relmon/store/dsn"
    assert config["review"]["token_file"] == "/etc/relmon/review-auth/token"
    # Readable by relmon's user without an fsGroup: only relmon's container mounts them.
    for volume in spec["volumes"]:
        if "secret" in volume:
            assert volume["secret"]["defaultMode"] == 0o444, volume
    # No Deployment, ServiceAccount or NetworkPolicy of relmon's own in sidecar mode.
    kinds = [d["kind"] for d in docs]
    assert kinds.count("Deployment") == 1
    assert "ServiceAccount" not in kinds and "NetworkPolicy" not in kinds
    # The pod rolls when relmon's configuration changes.
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert set(annotations) == {"checksum/relmon-config"}


def test_the_review_service_reaches_the_page_in_the_application_pods(tmp_path: Path) -> None:
    docs = valid(values_of(CHART / "ci" / "sidecar-postgres-values.yaml"))
    (service,) = by_kind(docs, "Service")
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "my-app"}
    assert service["spec"]["ports"] == [
        {"name": "review", "port": 9109, "targetPort": "relmon-review", "protocol": "TCP"}
    ]
    (ingress,) = by_kind(docs, "Ingress")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    (rule,) = ingress["spec"]["rules"]
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": service["metadata"]["name"], "port": {"name": "review"}}
    assert ingress["spec"]["tls"][0]["secretName"] == "relmon-review-tls"
    # Reached through the Service: review binds all addresses, traffic stays in the pod.
    config = relmon_config(docs)
    assert config["review"]["host"] == "0.0.0.0"
    assert config["traffic"]["host"] == "127.0.0.1"
    assert config["metrics"]["host"] == "0.0.0.0"
    # Without the Service, review stays on loopback too (unless hosts.review says).
    values = {**SIDECAR, **POSTGRES, **TOKEN, "service": {"enabled": False}}
    docs = valid(values)
    assert by_kind(docs, "Service") == []
    assert relmon_config(docs)["review"]["host"] == "127.0.0.1"
    docs = render({**values, "hosts": {"review": "0.0.0.0", "traffic": "0.0.0.0"}})
    assert relmon_config(docs)["review"]["host"] == relmon_config(docs)["traffic"]["host"]
    # A review Service needs the application's pod labels and a reachable review port.
    assert "sidecar.podSelector" in refused({"mode": "sidecar", **POSTGRES, **TOKEN})
    loopback = {**SIDECAR, **POSTGRES, **TOKEN, "hosts": {"review": "127.0.0.1"}}
    assert "hosts.review" in refused(loopback)
    ingress_alone = {**SIDECAR, **POSTGRES, **TOKEN, "service": {"enabled": False}}
    ingress_alone["review"] = {"ingress": {"enabled": True}}
    assert "service.enabled" in refused(ingress_alone)
    # No review API (Kafka backend): no review Service, no review port.
    docs = valid({**SIDECAR, **KAFKA})
    assert by_kind(docs, "Service") == []
    app = sidecar_app(tmp_path, {**SIDECAR, **KAFKA})
    ports = {p["name"] for p in relmon_of(pod_spec(app))["ports"]}
    assert ports == {"relmon-metrics"}


@pytest.mark.parametrize("native", [True, False], ids=["native", "container"])
def test_native_sidecar_and_its_fallback(tmp_path: Path, native: bool) -> None:
    """Each include renders relmon only in its own case (the application's template has
    both), so switching sidecar.native moves relmon between the two lists."""
    relmon = {**SIDECAR, **POSTGRES, **TOKEN, "sidecar": {**SIDECAR["sidecar"], "native": native}}
    spec = pod_spec(sidecar_app(tmp_path, relmon))
    container = relmon_of(spec)
    if native:
        assert spec["initContainers"] == [container] and container["restartPolicy"] == "Always"
        assert [c["name"] for c in spec["containers"]] == ["app"]
        # The application does not wait for relmon: no startup probe; liveness waits.
        assert "startupProbe" not in container
        assert container["livenessProbe"]["initialDelaySeconds"] == 120
    else:
        assert "initContainers" not in spec
        assert [c["name"] for c in spec["containers"]] == ["app", "relmon"]
        assert "restartPolicy" not in container
        assert container["startupProbe"]["httpGet"]["path"] == "/readyz/traffic"
    # Mirrored traffic: relmon's readiness never decides the application pod's.
    assert "readinessProbe" not in container


@pytest.mark.parametrize("listener", ["metrics", "review", "traffic"])
def test_a_standalone_service_never_points_at_a_loopback_listener(listener: str) -> None:
    message = refused({**TOKEN, "hosts": {listener: "127.0.0.1"}})
    assert f"hosts.{listener}: 0.0.0.0" in message
    docs = valid({**TOKEN, "hosts": {listener: "127.0.0.1"}, "service": {"enabled": False}})
    assert relmon_config(docs)[listener]["host"] == "127.0.0.1"


@pytest.mark.parametrize(("kube", "refused_there"), [("v1.28.9", True), ("v1.29.0", False)])
def test_a_native_sidecar_is_refused_on_a_cluster_older_than_1_29(
    tmp_path: Path, kube: str, refused_there: bool
) -> None:
    """There the API server would drop restartPolicy, and relmon, an init container that
    never exits, would keep the application's pods from ever starting. helm install sees
    the cluster's version in .Capabilities; the render here cannot be given one (helm lint
    can, but reports a template's fail only in its log), so the test puts it in the copy
    of the chart's check."""
    chart = tmp_path / "relmon"
    shutil.copytree(CHART, chart)
    check = chart / "templates" / "_validate.tpl"
    text = check.read_text()
    assert text.count(".Capabilities.KubeVersion.Version") == 2
    check.write_text(text.replace(".Capabilities.KubeVersion.Version", f'"{kube}"'))
    values = values_of(CHART / "ci" / "sidecar-values.yaml")
    if refused_there:
        with pytest.raises(helm_python.HelmRenderError, match=r"set sidecar\.native: false"):
            render(values, chart=chart)
    else:
        assert by_kind(render(values, chart=chart), "ConfigMap")
    fallback = {**values, "sidecar": {**values["sidecar"], "native": False}}
    assert by_kind(render(fallback, chart=chart), "ConfigMap")
    assert by_kind(render(TOKEN, chart=chart), "Deployment")  # standalone: no matter


def test_a_proxying_sidecar_is_waited_for(tmp_path: Path) -> None:
    """With traffic.mode proxy the application's requests pass through relmon: the native
    sidecar's startup probe holds the application until relmon takes traffic, and its
    readiness counts for the pod's."""
    relmon = {
        **SIDECAR,
        **POSTGRES,
        **TOKEN,
        "traffic": {"mode": "proxy", "upstreamUrl": "http://127.0.0.1:8000"},
    }
    container = relmon_of(pod_spec(sidecar_app(tmp_path, relmon)))
    assert container["startupProbe"]["httpGet"]["path"] == "/readyz/traffic"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz/traffic"
    assert "initialDelaySeconds" not in container["livenessProbe"]


# ---------------------------------------------------------- reproducible renders


@pytest.mark.parametrize("scenario", [None, *SCENARIOS], ids=lambda p: p.name if p else "defaults")
def test_the_same_values_render_the_same_bytes(scenario: Path | None) -> None:
    """Argo CD and Flux compare renders: nothing random, nothing looked up."""
    values = values_of(scenario)
    first = render_bytes(values)
    assert render_bytes(values) == first
    # Also as a fresh install and as an upgrade.
    chart = helm_python.Chart.load(CHART)
    for flags in ({"is_install": True}, {"is_upgrade": True, "revision": 7}):
        assert chart.render(values, name="rel", namespace="llm", **flags) == first


def test_no_template_generates_or_looks_up_anything() -> None:
    for path in sorted((CHART / "templates").iterdir()):
        text = path.read_text()
        for word in (
            "lookup",
            "randAlpha",
            "randAlphaNum",
            "randNumeric",
            "randBytes",
            "uuidv4",
            "now",
        ):
            assert not re.search(rf"\b{word}\b", text), (path.name, word)


def test_a_review_token_is_created_in_the_pod_when_none_is_given() -> None:
    """One standalone SQLite pod given no token: an init container creates it at the
    first start on the claim, where relmon reads it; the manifests hold no token."""
    docs = valid({})
    assert by_kind(docs, "Secret") == []  # nothing to put in one: no empty Secret
    spec = pod_spec(docs)
    (init,) = spec["initContainers"]
    assert init["name"] == "relmon-review-token"
    assert init["securityContext"] == relmon_of(spec)["securityContext"]
    assert init["volumeMounts"] == [{"name": "relmon-state", "mountPath": "/var/lib/relmon"}]
    assert "/var/lib/relmon/review-token" in init["command"][-1]
    assert relmon_config(docs)["review"]["token_file"] == "/var/lib/relmon/review-token"
    # Given one way or another, there is no init container.
    for values in (
        TOKEN,
        {"secret": {"create": False, "existingSecret": "mine"}},
        {"review": {"auth": {"existingSecret": "reviewers", "tokenKey": "t"}}},
        {"review": {"auth": {"mode": "proxy", "trustedProxies": ["10.0.0.0/8"]}}},
    ):
        assert "initContainers" not in pod_spec(valid(values)), values


def test_a_review_token_must_be_given_for_several_pods() -> None:
    for values in ({"replicaCount": 2, **POSTGRES}, {**SIDECAR, **POSTGRES}):
        message = refused(values)
        assert "secret.reviewToken" in message and "review.auth.existingSecret" in message


def test_review_auth_values_reach_relmon() -> None:
    values = {
        "review": {
            "leaseSeconds": 300,
            "undoSeconds": 0,
            "auth": {"existingSecret": "reviewers", "tokenKey": "", "tokensKey": "lines"},
        }
    }
    docs = valid(values)
    review = relmon_config(docs)["review"]
    assert review["tokens_file"] == "/etc/relmon/review-auth/tokens"
    assert "token_file" not in review
    assert (review["lease_s"], review["undo_s"], review["auth"]) == (300, 0, "token")
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    assert volumes["relmon-review-auth"]["secret"]["items"] == [{"key": "lines", "path": "tokens"}]
    proxy = {
        "review": {
            "auth": {
                "mode": "proxy",
                "proxyHeaders": ["X-Forwarded-Email"],
                "trustedProxies": ["10.0.0.0/8"],
            }
        }
    }
    review = relmon_config(valid(proxy))["review"]
    assert review["auth"] == "proxy" and "token_file" not in review
    assert review["proxy_headers"] == ["X-Forwarded-Email"]
    assert review["trusted_proxies"] == ["10.0.0.0/8"]
    both = {**TOKEN, "review": {"auth": {"existingSecret": "r", "tokenKey": "t"}}}
    assert "given twice" in refused(both)


# ------------------------------------------------------- pods roll, nothing stale


def checksums(values: dict[str, Any]) -> dict[str, str]:
    (deployment,) = by_kind(render(values), "Deployment")
    return {
        k: v
        for k, v in deployment["spec"]["template"]["metadata"]["annotations"].items()
        if k.startswith("checksum/")
    }


def test_config_and_secret_changes_roll_the_pods() -> None:
    base = checksums(TOKEN)
    assert set(base) == {"checksum/relmon-config", "checksum/relmon-secret"}
    budget = {**TOKEN, "config": {**values_of(None).get("config", {})}}
    budget["config"] = {
        "tasks": [{"name": "t", "endpoint": {"model": "m"}}],
        "budget": {"calls_per_minute": 60},
    }
    changed = checksums(budget)
    assert changed["checksum/relmon-config"] != base["checksum/relmon-config"]
    assert changed["checksum/relmon-secret"] == base["checksum/relmon-secret"]
    rotated = checksums({"secret": {"reviewToken": "another-token"}})
    assert rotated["checksum/relmon-secret"] != base["checksum/relmon-secret"]
    assert rotated["checksum/relmon-config"] == base["checksum/relmon-config"]
    assert checksums({**TOKEN, "replicaCount": 1}) == base  # unchanged values, no roll


def test_no_subpath_mount_anywhere(tmp_path: Path) -> None:
    """A subPath mount never sees an update of its ConfigMap or Secret."""
    rendered = [
        *(render(values_of(s)) for s in SCENARIOS),
        render({}, chart=application_chart(tmp_path)),
    ]
    for docs in rendered:
        assert "subPath" not in json.dumps(docs)
    (deployment,) = by_kind(render({}), "Deployment")
    mounts = {m["name"]: m for m in relmon_of(pod_spec([deployment]))["volumeMounts"]}
    assert mounts["relmon-config"]["mountPath"] == "/etc/relmon/config"


# --------------------------------------------------- NetworkPolicy and Prometheus


def test_prometheus_in_its_own_namespace_may_scrape() -> None:
    (policy,) = by_kind(valid(TOKEN), "NetworkPolicy")
    metrics = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 9108)
    assert {"podSelector": {}} in metrics["from"]  # the same namespace
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    } in metrics["from"]
    # The review and traffic ports do not admit it.
    for rule in policy["spec"]["ingress"]:
        if rule is not metrics:
            assert rule["from"] == [{"podSelector": {}}]
    values = {
        **TOKEN,
        "networkPolicy": {
            "prometheus": {
                "namespaceSelector": {"matchLabels": {"team": "observability"}},
                "podSelector": {},
            }
        },
    }
    (policy,) = by_kind(valid(values), "NetworkPolicy")
    assert {
        "namespaceSelector": {"matchLabels": {"team": "observability"}},
        "podSelector": {},
    } in policy["spec"]["ingress"][0]["from"]
    off = {**TOKEN, "networkPolicy": {"prometheus": {"enabled": False}}}
    (policy,) = by_kind(valid(off), "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {}}]


def test_monitors_and_rules_take_labels_relabelings_and_disabled_alerts() -> None:
    docs = valid(values_of(CHART / "ci" / "sidecar-postgres-values.yaml"))
    (monitor,) = by_kind(docs, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["relabelings"][0] == {
        "action": "replace",
        "targetLabel": "job",
        "replacement": "relmon",
    }
    assert endpoint["relabelings"][1]["targetLabel"] == "node"
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert "RelmonKafkaConsumerLagGrowing" not in alerts and "RelmonDown" in alerts
    shipped = yaml.safe_load(
        (CHART / "files" / "prometheus" / "relmon-alerts.rules.yml").read_text()
    )
    every = {r["alert"] for g in shipped["groups"] for r in g["rules"] if "alert" in r}
    assert "RelmonSegmentReliabilityAlarm" in every and len(every) >= 19
    # every shipped alert but the one disabled in these values, each once
    assert len(alerts) == len(set(alerts)) and set(alerts) == every - {
        "RelmonKafkaConsumerLagGrowing"
    }
    assert "RelmonDwon" in refused(
        {"metrics": {"prometheusRule": {"enabled": True, "disabledAlerts": ["RelmonDwon"]}}}
    )
    docs = valid(values_of(CHART / "ci" / "standalone-proxy-postgres-values.yaml"))
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["metricRelabelings"] == [
        {"action": "labeldrop", "regex": "instance_id"}
    ]
    assert "podMonitor" in refused(
        {**SIDECAR, **POSTGRES, **TOKEN, "metrics": {"serviceMonitor": {"enabled": True}}}
    )


def test_the_crd_check_catches_an_unknown_field_and_a_wrong_type() -> None:
    """validate_manifest holds custom resources to their CRD's schema."""
    (monitor,) = by_kind(
        render({**TOKEN, "metrics": {"podMonitor": {"enabled": True}}}), "PodMonitor"
    )
    validate_manifest(monitor)
    typo = json.loads(json.dumps(monitor))
    typo["spec"]["podMetricsEndpoints"][0]["metricRelabeling"] = []
    with pytest.raises(AssertionError, match="does not know"):
        validate_manifest(typo)
    wrong = json.loads(json.dumps(monitor))
    wrong["spec"]["podMetricsEndpoints"] = "relmon-metrics"
    with pytest.raises(pydantic.ValidationError):
        validate_manifest(wrong)


def test_nothing_unused_is_rendered() -> None:
    """No ServiceAccount where no pod of relmon's own runs, no Service without a port
    anyone uses, no empty Secret, no review port without a review API."""
    sidecar = render({**SIDECAR, **KAFKA})
    assert {d["kind"] for d in sidecar} == {"ConfigMap"}
    assert by_kind(render({**TOKEN, "serviceAccount": {"create": False}}), "ServiceAccount") == []
    docs = valid(KAFKA)
    assert by_kind(docs, "Secret") == []
    (service,) = by_kind(docs, "Service")
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    assert [p["name"] for p in relmon_of(pod_spec(docs))["ports"]] == ["relmon-metrics"]
    (policy,) = by_kind(docs, "NetworkPolicy")
    assert [r["ports"][0]["port"] for r in policy["spec"]["ingress"]] == [9108]


# ------------------------------------------------------------- pod and image values


def test_image_digest_volumes_spread_and_component_label() -> None:
    docs = valid(values_of(CHART / "ci" / "standalone-proxy-postgres-values.yaml"))
    spec = pod_spec(docs)
    relmon = relmon_of(spec)
    assert relmon["image"] == (
        "registry.example.com/relmon@sha256:0123456789abcdef0123456789abcdef"
        "0123456789abcdef0123456789abcdef"
    )
    assert {"name": "ca-bundle", "configMap": {"name": "internal-ca"}} in spec["volumes"]
    assert {
        "name": "ca-bundle",
        "mountPath": "/etc/ssl/internal",
        "readOnly": True,
    } in relmon["volumeMounts"]
    (constraint,) = spec["topologySpreadConstraints"]
    (deployment,) = by_kind(docs, "Deployment")
    assert (
        constraint["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    )
    assert constraint["topologyKey"] == "topology.kubernetes.io/zone"
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/component"] == "monitor", doc["kind"]
    assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == (
        "monitor"
    )
    assert "app.kubernetes.io/component" not in deployment["spec"]["selector"]["matchLabels"]
    (container,) = pod_spec(render({})).get("containers")
    assert container["image"] == "ghcr.io/relmon/relmon:0.1.0"  # the tag: appVersion


def test_relmons_settings_have_values() -> None:
    """The settings of the sections the chart manages: traffic, kafka, review, store;
    a task's reask passes through config.tasks."""
    values = {
        **KAFKA,
        "traffic": {"mode": "mirror", "taskHeader": "X-Task", "maxBodyBytes": 2048},
        "kafka": {"enabled": True, "maxEventBytes": 4096},
    }
    config = relmon_config(valid(values))
    assert config["traffic"]["task_header"] == "X-Task"
    assert config["traffic"]["max_body_bytes"] == 2048
    assert config["kafka"]["max_event_bytes"] == 4096
    # Tuning left to relmon's defaults unless given.
    left = {"upstream_read_timeout_s", "client_send_timeout_s", "uvloop", "data_plane"}
    left |= {"offer_batch_s"}
    assert not left & config["traffic"].keys()
    assert "max_leases_per_reviewer" not in relmon_config(render(TOKEN))["review"]
    proxy = {
        **TOKEN,
        "traffic": {
            "mode": "proxy",
            "upstreamUrl": "http://vllm:8000",
            "upstreamConnectTimeoutSeconds": 2,
            "upstreamReadTimeoutSeconds": 300,
            "clientSendTimeoutSeconds": 90,
            "upstreamPoolSize": 64,
            "uvloop": False,
            "dataPlane": "process",
            "offerBatchSeconds": 0.2,
        },
        "review": {"maxLeasesPerReviewer": 5},
    }
    docs = valid(proxy)
    config = relmon_config(docs)
    assert {
        k: config["traffic"][k] for k in config["traffic"] if k.startswith(("upstream", "uv"))
    } == {
        "upstream_url": "http://vllm:8000",
        "upstream_connect_timeout_s": 2,
        "upstream_read_timeout_s": 300,
        "upstream_pool_size": 64,
        "uvloop": False,
    }
    assert config["review"]["max_leases_per_reviewer"] == 5
    settings = Settings.model_validate(config)  # relmon's schema takes every key
    assert settings.traffic.upstream_read_timeout_s == 300
    assert settings.traffic.client_send_timeout_s == 90
    assert settings.traffic.data_plane == "process"
    assert settings.traffic.offer_batch_s == 0.2
    assert settings.review.max_leases_per_reviewer == 5
    # The proxy forwards each request's own path: an upstream with a path is refused.
    assert "upstreamUrl" in refused({**proxy, "traffic": {"upstreamUrl": "http://vllm:8000/v1"}})
    docs = render(values_of(CHART / "ci" / "standalone-proxy-postgres-values.yaml"))
    (task,) = relmon_config(docs)["tasks"]
    assert task["reask"] == {"min_temperature": 0.7, "set": {"max_tokens": 128}, "drop": ["tools"]}


def test_docs_deploy_names_the_values_for_real_clusters() -> None:
    """docs/deploy.md names the values the chart has for real clusters (the chart's
    README lists every value: test_helm.py)."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    for key in (
        "store.backend",
        "store.existingSecret",
        "store.dsnKey",
        "store.syncSeconds",
        "sidecar.native",
        "sidecar.podSelector",
        "sidecar.appReplicas",
        "hosts.metrics",
        "review.auth.existingSecret",
        "review.ingress",
        "networkPolicy.prometheus",
        "additionalLabels",
        "disabledAlerts",
        "image.digest",
        "extraVolumes",
        "topologySpreadConstraints",
        "secret.queryHashKey",
        "kafka.maxEventBytes",
        "traffic.routes",
        "traffic.otlp.enabled",
        "networkPolicy.otlpFrom",
    ):
        assert f"`{key}" in text, key


def test_secrets_hold_only_what_the_values_give() -> None:
    values = {
        "secret": {
            "reviewToken": "tok",
            "queryHashKey": "k" * 32,
            "apiKeys": {"triage": "sk-1"},
        }
    }
    (secret,) = by_kind(valid(values), "Secret")
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == {"review-token": "tok", "query-hash-key": "k" * 32, "api-key-triage": "sk-1"}
