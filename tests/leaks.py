"""Streams a test leaves open when its event loop closes, named after the test that did it.

pytest-asyncio closes each test's loop at its end. A ``StreamWriter`` still open then
(an aiokafka connection, a relay's socket) warns "loop is closed" only when the garbage
collector reaches it, which can be minutes later, inside another test, which then fails
without a word about where the leak is. This plugin says where: after every test it
lists the writers whose loop has closed with their transport open, with the test and
where each was created, in the run's summary.
"""

from __future__ import annotations

import asyncio
import traceback
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_open: weakref.WeakKeyDictionary[asyncio.StreamWriter, str] = weakref.WeakKeyDictionary()
_leaks: list[str] = []
_init = asyncio.StreamWriter.__init__


def _tracked_init(self: asyncio.StreamWriter, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    frames = [f for f in traceback.extract_stack(limit=12)[:-1] if "/asyncio/" not in f.filename]
    _open[self] = " <- ".join(
        f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in reversed(frames[-5:])
    )


asyncio.StreamWriter.__init__ = _tracked_init  # type: ignore[method-assign]


def _left_open(writer: asyncio.StreamWriter) -> bool:
    try:
        return writer._loop.is_closed() and not writer.transport.is_closing()  # type: ignore[attr-defined]
    except Exception:  # a transport of another kind: not ours to judge
        return False


@pytest.fixture(autouse=True)
def _streams_left_open(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    for writer, created in list(_open.items()):
        if _left_open(writer):
            del _open[writer]
            _leaks.append(f"{request.node.nodeid}: a StreamWriter created at {created}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _leaks:
        terminalreporter.section("streams left open when their test's event loop closed")
        for line in _leaks:
            terminalreporter.line(line)
