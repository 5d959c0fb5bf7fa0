"""deploy/mirror examples: nginx checked by the real nginx (``nginx -t``, then a live
mirror into a real ``relmon run``), Envoy and Istio checked against their documented
field names. (The Dockerfile: test_dockerfile.py.)"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from monitor.app.demo.model import QuestionBank, SimulatedModel
from tests.e2e.test_run_drain import TOKEN, free_port, wait_ready, write_config
from tests.waiting import accepts_tcp, wait_until

ROOT = Path(__file__).resolve().parents[2]
MIRROR = ROOT / "deploy" / "mirror"


def nginx_prefix(tmp_path: Path, conf: str) -> Path:
    """A self-contained nginx prefix with the example included in http { }."""
    (tmp_path / "conf.d").mkdir(parents=True)
    (tmp_path / "logs").mkdir()
    (tmp_path / "conf.d" / "llm.conf").write_text(conf)
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"""daemon off;
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/logs/error.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {tmp_path}/body;
    proxy_temp_path {tmp_path}/proxy;
    fastcgi_temp_path {tmp_path}/fastcgi;
    uwsgi_temp_path {tmp_path}/uwsgi;
    scgi_temp_path {tmp_path}/scgi;
    include conf.d/llm.conf;
}}
"""
    )
    return main


def nginx(main: Path, *args: str) -> list[str]:
    log = main.parent / "logs" / "error.log"
    return ["nginx", "-p", str(main.parent), "-c", str(main), "-e", str(log), *args]


def test_nginx_example_passes_nginx_t(tmp_path: Path) -> None:
    conf = (MIRROR / "nginx.conf").read_text()
    assert re.search(r"^\s*mirror /_relmon_mirror;", conf, flags=re.M)
    main = nginx_prefix(tmp_path, conf)
    result = subprocess.run(
        nginx(main, "-t"), check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr
    # And a broken copy is refused, so the check can fail.
    broken = nginx_prefix(
        tmp_path / "broken", conf.replace("mirror_request_body on;", "mirror_request_body maybe;")
    )
    result = subprocess.run(
        nginx(broken, "-t"), check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0


def _sample_value(text: str, name: str, labels: dict[str, str]) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


@pytest.mark.timeout(180)
async def test_nginx_mirrors_live_traffic_into_relmon(tmp_path: Path) -> None:
    """The example, only its ports changed, serves from the model and feeds relmon."""
    bank = QuestionBank(size=10, seed=2)
    model = SimulatedModel(drift_after_s=None, bank=bank)
    model_url = await model.start()
    model_port = int(re.search(r":(\d+)/", model_url).group(1))  # type: ignore[union-attr]
    ports = {"metrics": free_port(), "review": free_port(), "traffic": free_port()}
    nginx_port = free_port()
    conf = (
        (MIRROR / "nginx.conf")
        .read_text()
        .replace("127.0.0.1:8000", f"127.0.0.1:{model_port}")
        .replace("127.0.0.1:9110", f"127.0.0.1:{ports['traffic']}")
        .replace("listen 8080;", f"listen 127.0.0.1:{nginx_port};")
        .replace("X-Relmon-Task support", "X-Relmon-Task arithmetic")
    )
    main = nginx_prefix(tmp_path / "nginx", conf)
    config = tmp_path / "relmon.yaml"
    write_config(config, model_url, ports, tmp_path / "state")
    env = {**os.environ, "RELMON_REVIEW_TOKEN": TOKEN}
    relmon = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-m", "monitor", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    web = subprocess.Popen(nginx(main), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
    try:
        await wait_ready(f"http://127.0.0.1:{ports['metrics']}/readyz", relmon)
        await wait_until(  # nginx may still be starting
            accepts_tcp(nginx_port), what="nginx to listen", interval_s=0.1, alive=web
        )
        n = 5
        async with aiohttp.ClientSession() as session:
            for question, _ in bank.questions[:n]:
                body = {"model": "sim-arith-1", "messages": [{"role": "user", "content": question}]}
                async with session.post(
                    f"http://127.0.0.1:{nginx_port}/v1/chat/completions",
                    json=body,
                    headers={"Authorization": "Bearer app-key"},
                ) as resp:
                    assert resp.status == 200  # the model's answer, not relmon's 202
                    answer = await resp.json()
                assert answer["choices"][0]["message"]["content"]
            labels = {"source": "mirror", "decision": "sampled"}

            async def all_mirrored() -> bool:
                async with session.get(f"http://127.0.0.1:{ports['metrics']}/metrics") as resp:
                    text = await resp.text()
                return _sample_value(text, "relmon_traffic_events_total", labels) == n

            await wait_until(
                all_mirrored,
                timeout_s=60,
                what=f"the {n} mirrored requests counted by relmon",
                interval_s=0.5,
            )
    finally:
        web.terminate()
        relmon.terminate()
        await asyncio.to_thread(web.wait, 30)
        await asyncio.to_thread(relmon.wait, 30)
        await model.stop()


# ---------------------------------------------------------------- Envoy and Istio

# Field names from the Envoy v3 API reference (config.route.v3.RouteAction and
# RouteAction.RequestMirrorPolicy, config.core.v3.RuntimeFractionalPercent,
# type.v3.FractionalPercent) and Istio's networking.istio.io VirtualService reference
# (HTTPRoute, Destination, PortSelector, Percent, Headers).
ENVOY_MIRROR_FIELDS = {
    "cluster",
    "cluster_header",
    "runtime_fraction",
    "trace_sampled",
    "disable_shadow_host_suffix_append",
}
ENVOY_FRACTION_DENOMINATORS = {"HUNDRED", "TEN_THOUSAND", "MILLION"}
ISTIO_HTTP_ROUTE_FIELDS = {
    "name", "match", "route", "redirect", "directResponse", "delegate", "rewrite",
    "timeout", "retries", "fault", "mirror", "mirrors", "mirrorPercentage", "corsPolicy",
    "headers",
}  # fmt: skip


def test_envoy_example_mirrors_chat_completions_to_relmon() -> None:
    config: dict[str, Any] = yaml.safe_load((MIRROR / "envoy.yaml").read_text())
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    assert hcm["name"] == "envoy.filters.network.http_connection_manager"
    routes = hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    chat = next(r for r in routes if r["match"].get("prefix") == "/v1/chat/completions")
    policies = chat["route"]["request_mirror_policies"]
    assert len(policies) == 1
    (policy,) = policies
    assert set(policy) <= ENVOY_MIRROR_FIELDS
    fraction = policy["runtime_fraction"]["default_value"]
    assert fraction["denominator"] in ENVOY_FRACTION_DENOMINATORS
    assert fraction["numerator"] == 100
    relmon = clusters[policy["cluster"]]
    endpoint = relmon["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"]["port_value"] == 9110
    assert relmon["load_assignment"]["cluster_name"] == policy["cluster"]
    assert clusters[chat["route"]["cluster"]]["name"] != policy["cluster"]


def test_istio_example_mirrors_chat_completions_to_relmon() -> None:
    vs: dict[str, Any] = yaml.safe_load((MIRROR / "istio-virtualservice.yaml").read_text())
    assert vs["apiVersion"] in {"networking.istio.io/v1", "networking.istio.io/v1beta1"}
    assert vs["kind"] == "VirtualService"
    routes = vs["spec"]["http"]
    for route in routes:
        assert set(route) <= ISTIO_HTTP_ROUTE_FIELDS, set(route) - ISTIO_HTTP_ROUTE_FIELDS
    chat = routes[0]
    assert chat["match"][0]["uri"]["prefix"] == "/v1/chat/completions"
    assert set(chat["mirror"]) <= {"host", "subset", "port"}
    assert chat["mirror"]["port"] == {"number": 9110}
    assert 0 < chat["mirrorPercentage"]["value"] <= 100
    assert chat["route"][0]["destination"]["host"] != chat["mirror"]["host"]
    assert set(chat["headers"]["request"]) <= {"set", "add", "remove"}
