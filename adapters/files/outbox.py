"""The review outbox on disk: one JSON file per waiting review item in a directory
under ``state_dir`` (:class:`~monitor.engine.ports.OutboxStorage`).

Each item is written to a temporary file, flushed to disk (``fsync``), renamed to
``<seq>.json`` and the directory flushed too: once :meth:`DirectoryOutbox.save` returns,
the item survives a crash of relmon or of the machine. A temporary file left by a crash
was never acknowledged (the worker had not gone on): it is removed at start. A
``<seq>.json`` that cannot be read (cut short, edited, not a review item) is renamed to
``<seq>.json.unreadable``, counted, and the others are written.

The directory is one process's: :func:`open_outbox` takes ``lock`` in it (``flock``),
and a second relmon on the same ``state_dir`` gets no on-disk outbox (None: the caller
keeps its outbox in memory), as does a ``state_dir`` that cannot be written.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from monitor.core.review import ReviewItem
from monitor.engine.ports import OutboxEntry

__all__ = ["OUTBOX_DIR", "DirectoryOutbox", "open_outbox"]

OUTBOX_DIR: Final = "review-outbox"
"""The outbox's directory in ``state_dir``."""
_SUFFIX: Final = ".json"
_TMP: Final = ".tmp"
_UNREADABLE: Final = ".unreadable"


class DirectoryOutbox:
    """Review items waiting for the review queue, one file each in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def where(self) -> str:
        return str(self.directory)

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:012d}{_SUFFIX}"

    async def load(self) -> tuple[list[OutboxEntry], int]:
        return await asyncio.to_thread(self._load)

    def _load(self) -> tuple[list[OutboxEntry], int]:
        entries: list[OutboxEntry] = []
        unreadable = 0
        for path in sorted(self.directory.iterdir()):
            name = path.name
            if name.endswith(_TMP):
                path.unlink(missing_ok=True)  # a save cut short: never acknowledged
                continue
            if not name.endswith(_SUFFIX):
                continue
            entry = _read(path)
            if entry is None:
                unreadable += 1
                path.rename(path.with_name(name + _UNREADABLE))
                continue
            entries.append(entry)
        entries.sort(key=lambda e: e.seq)
        return entries, unreadable

    async def save(self, entry: OutboxEntry) -> None:
        await asyncio.to_thread(self._save, entry)

    def _save(self, entry: OutboxEntry) -> None:
        path = self._path(entry.seq)
        tmp = path.with_name(path.name + _TMP)
        body = json.dumps(
            {"seq": entry.seq, "item": entry.item.to_json()},
            allow_nan=False,
            separators=(",", ":"),
        ).encode("utf-8")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _sync_directory(self.directory)

    async def remove(self, seq: int) -> None:
        await asyncio.to_thread(self._path(seq).unlink, missing_ok=True)


def _read(path: Path) -> OutboxEntry | None:
    """The entry in ``path``, or None if it is not one (any damage)."""
    try:
        data = json.loads(path.read_bytes())
        seq = data["seq"]
        if not isinstance(seq, int) or isinstance(seq, bool) or path.name != f"{seq:012d}.json":
            return None
        return OutboxEntry(seq, ReviewItem.from_json(data["item"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # InputError: a ValueError
        return None


def _sync_directory(directory: Path) -> None:
    """Flush the directory's entries (a rename is durable once its directory is)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_outbox(
    state_dir: Path,
) -> tuple[DirectoryOutbox, Callable[[], Awaitable[None]]] | str:
    """The outbox directory in ``state_dir`` (created) and its lock's release, or why
    there is none (not writable, or another process holds it)."""
    directory = state_dir / OUTBOX_DIR
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        return f"{directory}: {exc.strerror or exc}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return f"{directory} is in use by another relmon"
    probe = directory / f".probe-{os.getpid()}{_TMP}"
    try:  # writable, not only creatable (a read-only mount lets mkdir of an existing dir)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        os.close(fd)
        return f"{directory}: {exc.strerror or exc}"

    async def release() -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    return DirectoryOutbox(directory), release
