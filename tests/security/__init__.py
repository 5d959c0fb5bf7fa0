"""A real ``relmon run`` process for the security tests, and a model that answers with
distinctive text (an answer and an e-mail address that must never reach a log or a
metric label, and must reach a reviewer only redacted).

:class:`ModelThread` runs its aiohttp server on a thread of its own, so tests can make
blocking calls (raw sockets, schemathesis) while relmon keeps re-asking it.
:class:`RelmonProcess` writes a config, starts ``python -m monitor run``, waits for
``/readyz`` and stops it with SIGTERM; its stderr and stdout go to files the tests read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port
from tests.waiting import wait_until_sync

TOKEN = "security-test-token-0123456789"
PROMPT = "PROMPT-quokka-4412: write to alice.quokka@example.com or call +44 20 7946 0958"
ANSWER = "ANSWER-okapi-5521, mail carol.okapi@example.org, card 4111 1111 1111 1111"
SECRETS = ("quokka", "okapi", "alice.", "carol", "7946 0958", "79460958", "4111 1111", "41111111")
"""Fragments of the prompt and answer that must not appear where they must not. The
phone and card numbers are 8 digits long, with their space or without: a bare "4111"
turned up in a log line's microsecond timestamp (…15.324111Z) and failed a clean log."""


class ModelThread:
    """An OpenAI-compatible model on its own thread that always answers ``ANSWER``."""

    def __init__(self, answer: str = ANSWER) -> None:
        self.answer = answer
        self.calls = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls += 1
        n = int(body.get("n") or 1)
        return web.json_response(
            {
                "id": f"m-{self.calls}",
                "object": "chat.completion",
                "choices": [
                    {"index": i, "message": {"role": "assistant", "content": self.answer}}
                    for i in range(n)
                ],
            }
        )

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    def start(self) -> str:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


class RelmonProcess:
    """``relmon run`` on free ports with one task (``chat``, text answers, every event
    sampled and reviewed, three samples an item)."""

    def __init__(
        self,
        tmp: Path,
        model_url: str,
        *,
        extra: str = "",
        state: Path | None = None,
        traffic: str = "mode: mirror",
    ):
        self.tmp = tmp
        self.state = state or tmp / "state"
        self.ports = {"metrics": free_port(), "review": free_port(), "traffic": free_port()}
        self.config = tmp / "relmon.yaml"
        self.config.write_text(
            f"""
tasks:
  - name: chat
    canonicalizer: text
    endpoint: {{base_url: "{model_url}", model: pii-model, concurrency: 4, timeout_s: 10}}
    k_max: 3
    k0: 3
    sampling_rate: 1.0
    review_rate: 1.0
metrics: {{port: {self.ports["metrics"]}}}
review: {{port: {self.ports["review"]}}}
traffic: {{port: {self.ports["traffic"]}, {traffic}}}
state_dir: "{self.state}"
log_format: json
{extra}
"""
        )
        self.stderr_path = tmp / f"stderr-{self.ports['metrics']}.log"
        self.stdout_path = tmp / f"stdout-{self.ports['metrics']}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, port: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[port]}{path}"

    def start(self, deadline_s: float = 60.0) -> RelmonProcess:
        env = {**os.environ, "RELMON_REVIEW_TOKEN": TOKEN}
        with self.stderr_path.open("wb") as err, self.stdout_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "monitor", "run", "--config", str(self.config)],
                stdout=out,
                stderr=err,
                env=env,
            )
        wait_until_sync(  # every port is up
            lambda: get(self.url("metrics", "/readyz"))[0] == 200,
            timeout_s=deadline_s,
            what="relmon's /readyz to answer 200",
            alive=self.proc,
            ignore=(OSError,),
            detail=lambda: self.stderr()[-3000:],
        )
        return self

    def stop(self) -> int:
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def metrics(self) -> str:
        return get(self.url("metrics", "/metrics"))[1].decode()

    def metric(self, name: str, **labels: str) -> float:
        """One sample's value from /metrics (0 when absent)."""
        for family in text_string_to_metric_families(self.metrics()):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return 0.0

    def mirror(self, content: Any, request_id: str, **extra: Any) -> int:
        body = {"model": "pii-model", "messages": [{"role": "user", "content": content}]}
        status, _ = post(
            self.url("traffic", "/v1/chat/completions"),
            json.dumps(body | extra).encode(),
            {"X-Request-Id": request_id},
        )
        return status


@contextlib.contextmanager
def clean_log(proc: RelmonProcess) -> Iterator[None]:
    """What ``proc`` logs meanwhile: JSON lines, no traceback, nothing failed."""
    start = len(proc.stderr_path.read_bytes())
    yield
    new = proc.stderr_path.read_bytes()[start:].decode("utf-8", "replace")
    bad = [
        line
        for line in log_lines(new)
        if "exception" in line
        or line.get("event") in ("item_failed", "traffic_sink_failed", "traffic_event_failed")
        or line.get("level") in ("error", "critical")
    ]
    assert not bad, bad[:3]
    assert "Traceback" not in new


def log_lines(text: str) -> list[dict[str, Any]]:
    """Every line of a log as a JSON object; AssertionError naming the first that is not."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON log line: {line[:200]!r}") from None
        assert isinstance(obj, dict), line[:200]
        out.append(obj)
    return out


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    return _call(urllib.request.Request(url, headers=headers or {}))


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    h = {"Content-Type": "application/json", **(headers or {})}
    return _call(urllib.request.Request(url, data=body, headers=h, method="POST"))


def _call(request: urllib.request.Request) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:  # its socket closed even if reading the body fails
            return exc.code, exc.read()


def raw_http(port: int, request: bytes, timeout_s: float = 30.0) -> tuple[int, bytes]:
    """Send raw bytes (what an HTTP client library refuses to send); the status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    data = b"".join(chunks)
    if not data:
        return 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body
