"""``relmon`` (its arguments) with every event-loop callback that runs longer than
``$RELMON_LOOP_STALL_US`` µs (100) recorded by what ran, written as JSON to
``$RELMON_LOOP_STALLS_OUT`` when the process ends; SIGUSR1 starts the count again.
For bench/loop_stall_bench.py: relmon runs on asyncio's own loop there, whose callbacks
can be timed from Python. Imports nothing of relmon's but its CLI, from ``PYTHONPATH``
(the checkout measured)."""

from __future__ import annotations

import atexit
import collections
import json
import os
import signal
import sys
import time
from asyncio import Task, events
from pathlib import Path
from typing import Any


def _name(callback: Any) -> str:
    """What a callback runs: a task's coroutine, else the function."""
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, Task):
        coro = owner.get_coro()
        return "task " + str(getattr(coro, "__qualname__", type(coro).__name__))
    name = getattr(callback, "__qualname__", None) or type(callback).__name__
    return str(name)


def serve_instrumented(argv: list[str]) -> int:
    """``relmon`` with every long event-loop callback recorded (see the module)."""
    threshold = float(os.environ.get("RELMON_LOOP_STALL_US", "100")) / 1e6
    count: collections.Counter[str] = collections.Counter()
    held: collections.Counter[str] = collections.Counter()
    run = events.Handle._run

    def timed(handle: events.Handle) -> None:
        callback = handle._callback  # type: ignore[attr-defined]  # (cancel() clears it)
        start = time.perf_counter()
        run(handle)
        took = time.perf_counter() - start
        if took > threshold:
            name = _name(callback)
            count[name] += 1
            held[name] += took

    events.Handle._run = timed  # type: ignore[method-assign]

    def reset(signum: int, frame: object) -> None:
        count.clear()
        held.clear()

    signal.signal(signal.SIGUSR1, reset)

    def write() -> None:
        doc = {n: {"count": count[n], "ms": held[n] * 1e3} for n in count}
        Path(os.environ["RELMON_LOOP_STALLS_OUT"]).write_text(json.dumps(doc))

    atexit.register(write)
    from monitor.app.cli import main as relmon_main

    return relmon_main(argv)


if __name__ == "__main__":
    raise SystemExit(serve_instrumented(sys.argv[1:]))
