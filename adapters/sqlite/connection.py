"""The SQLite store's connection: one connection, used only from one worker thread, so
every call is serialized and the event loop never waits on the disk."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self, TypeVar

from adapters.sqlite.rows import store_error
from adapters.sqlite.schema import open_database
from monitor.core.errors import ConfigError, StoreError
from monitor.engine.ports import Clock, SystemClock

__all__ = ["SqliteConnection"]

_T = TypeVar("_T")


class SqliteConnection:
    """The file, its worker thread and the clock; the store's tables build on it."""

    def __init__(self, path: str | Path, *, clock: Clock | None = None) -> None:
        self._path = str(path)
        self._clock = clock or SystemClock()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relmon-sqlite")
        self._conn: sqlite3.Connection | None = None
        try:
            executor.submit(self._open).result()
        except (sqlite3.Error, OSError) as exc:
            executor.shutdown(wait=True)
            raise ConfigError(f"cannot open the calibration store {self._path}: {exc}") from None
        except BaseException:
            executor.shutdown(wait=True)
            raise
        self._executor: ThreadPoolExecutor | None = executor

    @classmethod
    async def open(cls, path: str | Path, *, clock: Clock | None = None) -> Self:
        """Open without blocking the event loop (the constructor waits for the disk)."""
        return await asyncio.to_thread(cls, path, clock=clock)

    # -- worker-thread side -------------------------------------------------------------

    def _open(self) -> None:
        self._conn = open_database(self._path)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("calibration store is closed")
        return self._conn

    def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def _run(self, fn: Callable[[], _T]) -> _T:
        executor = self._executor
        if executor is None:
            raise StoreError("calibration store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(executor, fn)
        except sqlite3.Error as exc:
            raise store_error(exc) from None
        except RuntimeError as exc:  # executor shut down while we were queued
            raise StoreError(f"calibration store is closed ({exc})") from None

    async def aclose(self) -> None:
        """Close the connection (checkpointing the WAL) and stop the worker thread."""
        executor = self._executor
        if executor is None:
            return

        def close() -> None:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(executor, close)
        except sqlite3.Error as exc:
            raise store_error(exc) from None
        finally:
            self._executor = None
            executor.shutdown(wait=True)
