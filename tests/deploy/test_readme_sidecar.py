"""The README's Kubernetes section, rendered: installed alone in sidecar mode the chart
renders no relmon container, and an application chart with relmon as a dependency
(``repository: file://../relmon``, ``helm dependency update``) renders relmon in its
pod, which the README's ``helm template ... | grep`` line shows."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import helm_python

from tests.deploy.chart import CHART, ROOT, by_kind, render, render_bytes, values_of


def readme_helm_template() -> tuple[list[str], str]:
    """The README's ``helm template`` command (its arguments) and the pattern it greps."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Run it on Kubernetes", 1)[1].split("\n## ", 1)[0]
    (line,) = [ln for ln in section.splitlines() if ln.startswith("helm template ")]
    command, grep = line.split("|", 1)
    grep_args = shlex.split(grep)
    assert grep_args[:2] == ["grep", "-E"], grep_args
    return shlex.split(command), grep_args[2]


def test_the_chart_alone_in_sidecar_mode_renders_no_relmon_container() -> None:
    docs = render(values_of(CHART / "ci" / "sidecar-values.yaml"))
    kinds = {d["kind"] for d in docs}
    assert {"ConfigMap", "Service"} <= kinds
    assert not kinds & {"Deployment", "StatefulSet", "DaemonSet", "Pod"}, kinds


def test_the_readme_helm_template_shows_relmon_in_the_applications_pod(tmp_path: Path) -> None:
    argv, pattern = readme_helm_template()
    assert argv[:4] == ["helm", "template", "my-app", "./my-app"], argv
    shutil.copytree(CHART, tmp_path / "relmon")
    app = tmp_path / "my-app"
    (app / "templates").mkdir(parents=True)
    (app / "Chart.yaml").write_text(
        "apiVersion: v2\nname: my-app\nversion: 1.0.0\ndependencies:\n"
        "  - name: relmon\n    version: 0.1.0\n    repository: file://../relmon\n"
    )
    shutil.copy(ROOT / "deploy" / "helm" / "sidecar-values.yaml", app / "values.yaml")
    shutil.copy(
        ROOT / "deploy" / "helm" / "app-deployment.yaml", app / "templates" / "deployment.yaml"
    )
    helm_python.dependency_update(app)  # helm dependency update ./my-app
    files = render_bytes({}, name="my-app", chart=app)
    shown = [
        line
        for path, text in sorted(files.items())
        if not path.endswith("NOTES.txt")
        for line in text.splitlines()
        if re.search(pattern, line)
    ]
    assert "kind: Deployment" in shown and "kind: ConfigMap" in shown, shown
    assert any(line.strip() == "- name: relmon" for line in shown), shown
    (deployment,) = by_kind(render({}, name="my-app", chart=app), "Deployment")
    (relmon,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert relmon["name"] == "relmon" and relmon["restartPolicy"] == "Always"
