"""``relmon`` (its arguments) with every event-loop callback that runs longer than
``$RELMON_LOOP_STALL_US`` µs (100) recorded by what ran (a task's step: its coroutine,
from where it had waited to where it waits next), written as JSON to
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

_ASYNCIO = os.path.dirname(events.__file__)


def _awaiting(owner: Any) -> str:
    """Where a task waits: the two innermost coroutines of its await chain outside
    asyncio itself, ``caller:line/callee:line`` (``done`` once it returned)."""
    where: list[str] = []
    coro = owner.get_coro()
    for _ in range(64):  # an await chain is never that deep; a cycle cannot hang this
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        if not frame.f_code.co_filename.startswith(_ASYNCIO):  # not asyncio.sleep's own
            where.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if coro is None:
            break
    return "/".join(where[-2:]) or "done"


def _name(callback: Any, resumed_at: str | None) -> str:
    """What a callback ran: a task's coroutine and the stretch of it, from where it had
    waited to where it waits next (``resumed_at``: :func:`_awaiting` before the step);
    else the function."""
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, Task):
        coro = owner.get_coro()
        name = str(getattr(coro, "__qualname__", type(coro).__name__))
        return f"task {name}: {resumed_at} -> {_awaiting(owner)}"
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
        owner = getattr(callback, "__self__", None)
        resumed_at = _awaiting(owner) if isinstance(owner, Task) else None
        start = time.perf_counter()
        run(handle)
        took = time.perf_counter() - start
        if took > threshold:
            name = _name(callback, resumed_at)
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
