"""Time from ``git clone`` to the first reliability level of ``make demo`` (a new user's minute).

For each pip-cache mode, in a fresh temporary directory: clone the repository, run
``make demo`` there (which creates ``.venv`` and installs the runtime dependencies), poll
the demo's ``/metrics`` until ``relmon_reliability_level`` appears, and report the
seconds from the start of the clone. Then stop the demo (its whole process group) and
delete the directory. Nothing outside the temporary directory is touched; the venv is
the clone's own.

Modes: ``cold`` gives pip an empty cache (a new ``PIP_CACHE_DIR``: every wheel is
downloaded); ``warm`` runs again from a new clone with the cache the cold run filled
(``--mode warm`` alone: pip's usual cache). pip's configuration files and ``PIP_*``
variables are ignored unless ``--local-pip-config`` is given, so wheels come from PyPI as
for a new user, not from a local wheelhouse. The demo listens on free ports
(``make demo DEMO_ARGS=...``) so it cannot collide with another process on 9108.

    python3 bench/demo_time.py                      # cold then warm, this checkout's HEAD
    python3 bench/demo_time.py --mode warm --repo https://example.org/relmon.git

Where the package index (or a proxy in front of it) marks its answers uncacheable, pip
stores nothing and ``warm`` downloads again; the report shows the cache size. To time an
install without any download, use ``--mode warm --local-pip-config`` on a machine whose
pip configuration points at a local wheelhouse.

This is a measurement, not a test: the numbers depend on the network and the machine.
It needs only Python 3.11, git and make (it imports nothing from relmon).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

_LEVEL = re.compile(r"^relmon_reliability_level\{[^}]*\} (\S+)$", re.MULTILINE)
_ITEMS = re.compile(r"^relmon_calibration_items\{[^}]*\} (\S+)$", re.MULTILINE)


@dataclass
class Result:
    mode: str
    clone_s: float = 0.0
    steps: list[tuple[float, str]] = field(default_factory=list)  # (seconds, make's "==>" line)
    demo_banner_s: float | None = None  # the demo's "relmon demo: metrics http://..." line
    first_level_s: float | None = None  # relmon_reliability_level appears on /metrics
    first_calibrated_s: float | None = None  # ... computed from at least one verdict
    pip_errors: list[str] = field(default_factory=list)
    pip_cache_mb: float | None = None  # size of the pip cache after the run (cold: downloads)
    ok: bool = False
    log_tail: str = ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the demo's process group (make, relmon), then SIGKILL if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def measure(
    repo: str,
    ref: str | None,
    mode: str,
    timeout_s: float,
    python: str,
    *,
    cache_dir: Path | None,
    local_pip_config: bool,
) -> Result:
    result = Result(mode=mode)
    with tempfile.TemporaryDirectory(prefix=f"relmon-demo-time-{mode}-") as tmp:
        root = Path(tmp)
        env = dict(os.environ)
        for key in list(env):
            if key.startswith("RELMON_") or (key.startswith("PIP_") and not local_pip_config):
                del env[key]
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONPATH", None)
        if not local_pip_config:
            env["PIP_CONFIG_FILE"] = os.devnull  # no site wheelhouse or extra index
        if cache_dir is not None:
            env["PIP_CACHE_DIR"] = str(cache_dir)
        start = time.monotonic()
        subprocess.run(["git", "clone", "--quiet", repo, str(root / "relmon")], check=True, env=env)
        if ref:
            subprocess.run(
                ["git", "-C", str(root / "relmon"), "checkout", "--quiet", ref],
                check=True,
                env=env,
            )
        result.clone_s = time.monotonic() - start
        ports = [_free_port() for _ in range(3)]
        demo_args = f"--metrics-port {ports[0]} --review-port {ports[1]} --traffic-port {ports[2]}"
        log_path = root / "make-demo.log"
        lines: list[str] = []
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                ["make", "demo", f"PYTHON={python}", f"DEMO_ARGS={demo_args}"],
                cwd=root / "relmon",
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

            def pump() -> None:
                assert proc.stdout is not None
                for raw in proc.stdout:
                    log.write(raw)
                    line = raw.decode(errors="replace").rstrip()
                    now = time.monotonic() - start
                    lines.append(line)
                    if line.startswith("==>"):
                        result.steps.append((round(now, 1), line))
                    if line.startswith("relmon demo:") and result.demo_banner_s is None:
                        result.demo_banner_s = round(now, 1)

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            try:
                while time.monotonic() - start < timeout_s and proc.poll() is None:
                    text = _scrape(ports[0])
                    now = round(time.monotonic() - start, 1)
                    if text is not None:
                        if result.first_level_s is None and _LEVEL.search(text):
                            result.first_level_s = now
                        items = _ITEMS.search(text)
                        if items and float(items.group(1)) >= 1:
                            result.first_calibrated_s = now
                            break
                    time.sleep(0.25)
            finally:
                _stop(proc)
                reader.join(10)
        result.pip_errors = [ln for ln in lines if "ERROR" in ln or "dependency resolver" in ln]
        if cache_dir is not None and cache_dir.exists():
            size = sum(f.stat().st_size for f in cache_dir.rglob("*") if f.is_file())
            result.pip_cache_mb = round(size / 1e6, 1)
        result.ok = result.first_level_s is not None
        result.log_tail = "\n".join(lines[-15:])
        result.clone_s = round(result.clone_s, 1)
    return result


def _git_toplevel() -> str:
    here = Path(__file__).resolve().parent
    out = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--show-toplevel"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def main() -> int:
    first = __doc__.splitlines()[0].replace("``", "") if __doc__ else None
    parser = argparse.ArgumentParser(description=first)
    parser.add_argument("--repo", help="what to clone (default: this checkout)")
    parser.add_argument("--ref", help="commit or branch to check out after cloning")
    parser.add_argument("--mode", choices=["cold", "warm", "both"], default="both")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run (600)")
    parser.add_argument("--python", default=shutil.which("python3.11") or "python3")
    parser.add_argument(
        "--local-pip-config", action="store_true", help="keep this machine's pip configuration"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    repo = args.repo or _git_toplevel()
    results = []
    with tempfile.TemporaryDirectory(prefix="relmon-demo-time-pip-cache-") as cache:
        for mode in ["cold", "warm"] if args.mode == "both" else [args.mode]:
            fresh = mode == "cold" or args.mode == "both"
            results.append(
                measure(
                    repo,
                    args.ref,
                    mode,
                    args.timeout,
                    args.python,
                    cache_dir=Path(cache) if fresh else None,
                    local_pip_config=args.local_pip_config,
                )
            )
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        for r in results:
            print(f"== pip cache: {r.mode}")
            print(f"   clone                      {r.clone_s:6.1f} s")
            for t, line in r.steps:
                print(f"   {t:6.1f} s  {line}")
            print(f"   demo prints its addresses  {r.demo_banner_s} s")
            print(f"   first reliability level    {r.first_level_s} s  (clone -> /metrics)")
            print(f"   first calibrated level     {r.first_calibrated_s} s  (n >= 1)")
            print(f"   pip errors                 {r.pip_errors or 'none'}")
            if r.pip_cache_mb is not None:
                note = "" if r.pip_cache_mb else " (pip stored nothing: answers not cacheable)"
                print(f"   pip cache after the run    {r.pip_cache_mb} MB{note}")
            if not r.ok:
                print("   FAILED; last lines of make demo:\n" + r.log_tail)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
