"""relmon's build: pure Python, unless ``RELMON_COMPILE=1`` asks for the hot path compiled.

With ``RELMON_COMPILE=1`` the modules in :data:`COMPILED` (the traffic port's data plane,
the per-request sampling decision, and the parsing and admission of a sampled request)
are compiled to C extensions with mypyc, which needs mypy and a C compiler at build
time. They are the same modules, type-checked by ``mypy --strict``; Python loads the
compiled one when it sits beside the ``.py`` file.
Without the variable (``pip install -e .``, ``make demo``) nothing is compiled and
relmon runs as plain Python, only slower on the proxy's and the mirror's hot path.

- ``make compile`` (part of ``make test`` and ``make bench``) builds them in place;
- the container image builds them into its wheel (``Dockerfile``).
"""

from __future__ import annotations

import os

from setuptools import setup

COMPILED = [
    "adapters/traffic/request.py",
    "adapters/traffic/wire.py",
    "adapters/upstream/pool.py",
    "adapters/model/transport.py",
    "adapters/traffic/exchange.py",
    "adapters/traffic/proxy.py",
    "adapters/traffic/routing.py",
    "adapters/traffic/proxy_metrics.py",
    "adapters/traffic/intake.py",
    "monitor/engine/routing.py",
    "monitor/engine/admission.py",
    "monitor/core/sampler.py",
    "monitor/engine/metrics.py",
    "monitor/core/events.py",
    "adapters/traffic/messages.py",
]


def ext_modules() -> list[object]:
    if os.environ.get("RELMON_COMPILE") != "1":
        return []
    from mypyc.build import mypycify  # noqa: PLC0415  (needed only when compiling)

    return list(mypycify(COMPILED, opt_level="3", group_name="monitor._compiled"))


setup(ext_modules=ext_modules())
