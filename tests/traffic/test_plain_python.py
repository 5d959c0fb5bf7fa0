"""relmon runs as plain Python too: ``pip install -e .`` and ``make demo`` compile nothing
(setup.py). ``make test`` runs the suite on the compiled data plane, as the container
image runs it; this test runs the data plane's own tests (and the model client's, which
shares its connection pool) again on a copy of the tree without the compiled modules,
the ones that inject bugs by patching it included."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_PLANE_TESTS = (
    "tests/traffic/test_proxy_conformance.py",
    "tests/traffic/test_traffic_never_dies.py",
    "tests/traffic/test_mirror_proxy.py",
    # Exchanges of the test's own: an interpreted class cannot subclass a compiled one.
    "tests/traffic/test_proxy_slow_clients.py::test_the_pool_takes_back_only_a_clean_connection",
    "tests/traffic/test_proxy_slow_clients.py::"
    "test_a_paused_connection_is_not_timed_out_and_the_timer_restarts_on_resume",
    "tests/engine/test_admission_any_model.py",
    "tests/model/test_model_transport.py",
    "tests/model/test_openai_client.py",
)


def test_the_data_plane_tests_pass_on_plain_python(tmp_path: Path) -> None:
    skip = shutil.ignore_patterns("*.so", "__pycache__")
    for top in ("monitor", "adapters", "tests"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    where = subprocess.run(
        [sys.executable, "-c", "import adapters.traffic.wire as w, monitor.core.sampler as s;"
         "print(w.__file__, s.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    loaded = where.stdout.split()
    assert loaded == [
        str(tmp_path / "adapters/traffic/wire.py"),
        str(tmp_path / "monitor/core/sampler.py"),
    ]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DATA_PLANE_TESTS],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    summary = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in summary and "skipped" not in summary, summary


def test_the_modules_setup_py_compiles_are_compiled_all_or_none() -> None:
    """After ``make compile`` every module of setup.py's list loads compiled (a module
    left out of the build would silently run as Python); before it, none does."""
    listed = re.findall(r'"((?:monitor|adapters)/[\w/]+)\.py"', (ROOT / "setup.py").read_text())
    assert "adapters/traffic/wire" in listed and len(listed) >= 5
    compiled = {
        name: not importlib.import_module(name.replace("/", ".")).__file__.endswith(".py")
        for name in listed
    }
    assert len(set(compiled.values())) == 1, compiled
