"""The traffic port's data plane in a process of its own (``traffic.data_plane: process``).

Why: the proxy's live requests and relmon's own work (re-asks, ranking, the store, the
metrics) shared one event loop, so every step of that work sat in some live request's
latency. With ``process``, a child process runs the :class:`~.traffic.TrafficServer`
with the hash-sampling fast path; the main process runs everything else.

How the two talk: a private socket pair (inherited, never on the filesystem), frames of
a 4-byte big-endian length and a pickled tuple. Both ends are relmon's own processes.

Child to main:
  ``("ready", pid)``: listening (``("error", message)``: could not start);
  ``("offer", source, headers, path, body, answer, event id, draw)``: an event request that
  may be sampled, unparsed (about 1 in 100 at a 1% sampling rate); ``answer`` is the
  upstream's ``(body, headers)`` or None; the main process parses and offers it;
  ``("reject", source, reason)``: an event request counted ``rejected`` in the child;
  ``("counts", decisions, proxy counts)``: events decided in the child since the last
  such frame (``{(source, decision): n}``: ``skipped``, ``dropped``; and the requests
  by wire API, ``{(source, "api:" + api): n}``: :data:`API_KEY`) and the proxy's
  metrics (:meth:`~.proxy_metrics.ProxyMetrics.take`), every 0.1 s when not zero;
  ``("synced", n)``: everything before it was sent (the answer to ``("sync", n)``);
  ``("stopped",)``: drained, about to exit.
Main to child: ``("config", settings)`` first, ``("sync", n)``, ``("stop",)``.

The listening socket is bound by the main process and inherited: a port that cannot be
bound fails ``relmon run`` as before, and while a dead child is being replaced,
connections wait in the socket's queue instead of being refused. The child exits when
told to stop (after draining its requests) or when its socket pair ends (the main
process is gone). The main process replaces a child that exits on its own
(:class:`DataPlaneProcess`), counting the restart; counts the child had not sent yet
(at most 0.1 s of them) die with it, as would the requests it was serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import pickle
import signal
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

import structlog

from adapters.traffic.intake import HeaderView
from adapters.traffic.proxy_metrics import ProxyMetrics
from monitor.core.errors import ConfigError, StateError

__all__ = [
    "COUNTS_EVERY_S",
    "MAX_PENDING_BYTES",
    "DataPlaneProcess",
    "Relay",
    "frame",
    "read_frame",
    "serve_child",
]

_log = structlog.get_logger("adapters.traffic.traffic")
_LENGTH = struct.Struct(">I")

COUNTS_EVERY_S = 0.1
"""How often the child sends what it counted (when it counted anything)."""
MAX_PENDING_BYTES = 64 * 1024 * 1024
"""Frames the child holds for a main process that does not read them; past this an
event request is counted ``dropped`` instead (as when the service's queue is full)."""
RESTART_DELAYS_S = (0.1, 0.5, 1.0, 2.0, 5.0)
"""Waits before replacing a child that exited, one more each time it exits again within
a minute of starting (then the last, repeated)."""


def frame(message: tuple[Any, ...]) -> bytes:
    """One frame: the pickled message after its length."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The next message, or None at the end of the stream (also mid-frame)."""
    try:
        head = await reader.readexactly(_LENGTH.size)
        data = await reader.readexactly(_LENGTH.unpack(head)[0])
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    message = pickle.loads(data)
    assert isinstance(message, tuple)
    return message


API_KEY: Final = "api:"
"""The prefix of a ``counts`` frame's key that counts requests by API, not a decision."""


class Relay:
    """The child's side: what the traffic server hands on goes out as frames."""

    def __init__(self, writer: asyncio.StreamWriter, metrics: ProxyMetrics) -> None:
        self.writer = writer
        self.metrics = metrics
        self.decisions: dict[tuple[str, str], int] = {}
        self.skip_counts: Callable[[], dict[str, int]] | None = None

    def _send(self, message: tuple[Any, ...]) -> None:
        if not self.writer.is_closing():
            self.writer.write(frame(message))

    def offer(  # noqa: PLR0917  (the relay callback: seven positional)
        self,
        source: str,
        headers: HeaderView,
        path: str,
        raw: bytes,
        answer: tuple[bytes, HeaderView] | None,
        rid: str | None,
        draw: float | None,
    ) -> None:
        """:data:`~.intake.RelayCallback`: the event request goes to the main process."""
        if self.writer.transport.get_write_buffer_size() > MAX_PENDING_BYTES:
            key = (source, "dropped")
            self.decisions[key] = self.decisions.get(key, 0) + 1
            return
        shipped = None if answer is None else (bytes(answer[0]), answer[1].raw)
        self._send(("offer", source, headers.raw, path, bytes(raw), shipped, rid, draw))

    def seen(self, source: str, api: str) -> None:
        """:data:`~.intake.SeenCallback`: counted by the main process with the next
        ``counts`` frame."""
        key = (source, API_KEY + api)
        self.decisions[key] = self.decisions.get(key, 0) + 1

    def reject(self, source: str, reason: str) -> None:
        """:data:`~.intake.RejectCallback`: counted ``rejected`` by the main process."""
        self._send(("reject", source, reason))

    def flush(self) -> None:
        """Send what was counted since the last flush, if anything."""
        if self.skip_counts is not None:
            for source, n in self.skip_counts().items():
                key = (source, "skipped")
                self.decisions[key] = self.decisions.get(key, 0) + n
        proxy = self.metrics.take()
        if self.decisions or proxy is not None:
            decisions, self.decisions = self.decisions, {}
            self._send(("counts", decisions, proxy))


async def serve_child(
    control_fd: int,
    listen_fd: int,
    build: Callable[[Any, socket.socket, Relay], Any],
) -> int:
    """The child's main: read the config, start the server ``build(config, listening
    socket, relay)`` returns (a :class:`~.traffic.TrafficServer`), serve until told to
    stop or the main process is gone, drain, say so. 0, or 2 when it could not start."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # the main process says when to stop
        signal.signal(sig, signal.SIG_IGN)
    control = socket.socket(fileno=control_fd)
    listening = socket.socket(fileno=listen_fd)
    reader, writer = await asyncio.open_unix_connection(sock=control)
    first = await read_frame(reader)
    if first is None or first[0] != "config":
        return 2
    metrics = ProxyMetrics()
    relay = Relay(writer, metrics)
    try:
        server = build(first[1], listening, relay)
        await server.start()
    except Exception as exc:
        writer.write(frame(("error", f"{type(exc).__name__}: {exc}")))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return 2
    writer.write(frame(("ready", os.getpid())))
    gc.freeze()  # what start built lives as long as the process: out of every collection

    async def send_counts() -> None:
        while True:
            await asyncio.sleep(COUNTS_EVERY_S)
            relay.flush()

    counting = asyncio.create_task(send_counts())
    try:
        while (message := await read_frame(reader)) is not None:
            if message[0] == "sync":
                server.flush_offers()  # the offers waiting for their batch go first
                relay.flush()
                writer.write(frame(("synced", message[1])))
            elif message[0] == "stop":
                break
    finally:
        counting.cancel()
        await server.stop()  # the requests in flight finish (and hand on their events)
        relay.flush()
        with contextlib.suppress(ConnectionError, RuntimeError):
            writer.write(frame(("stopped",)))
            await writer.drain()
        writer.close()
    return 0


Handler = Callable[..., None]


class DataPlaneProcess:
    """The main process's side: starts the child, hands its frames to the callbacks
    (``on_offer(source, headers, path, body, answer, event id)``, ``on_reject(source,
    reason)``, ``on_counts(decisions, proxy counts or None)``), replaces it when it
    exits on its own (``on_restart()`` once it is up again) and stops it.

    ``command``: the child's argv; the control and listening descriptors are appended.
    """

    def __init__(
        self,
        *,
        command: Sequence[str],
        config: object,
        listening: socket.socket,
        on_offer: Handler,
        on_reject: Handler,
        on_counts: Handler,
        on_restart: Callable[[], None] = lambda: None,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.command = list(command)
        self.config = config
        self.listening = listening
        self.on = {"offer": on_offer, "reject": on_reject, "counts": on_counts}
        self.on_restart = on_restart
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._sync_n = 0
        self._synced: dict[int, asyncio.Future[None]] = {}

    @property
    def bound_port(self) -> int:
        return int(self.listening.getsockname()[1])

    @property
    def down(self) -> bool:
        """The child is not serving (being replaced)."""
        return self._reading is None or self._reading.done()

    async def start(self) -> None:
        """Start the child and wait until it listens; ConfigError when it cannot."""
        if self._keeper is not None:
            raise StateError("the data plane process is already started")
        await self._spawn()
        self._keeper = asyncio.create_task(self._keep(), name="relmon-data-plane")

    async def _spawn(self) -> None:
        mine, theirs = socket.socketpair()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command,
                str(theirs.fileno()),
                str(self.listening.fileno()),
                pass_fds=(theirs.fileno(), self.listening.fileno()),
                stdin=asyncio.subprocess.DEVNULL,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=mine)
        writer.write(frame(("config", self.config)))
        try:
            first = await asyncio.wait_for(read_frame(reader), self.start_timeout_s)
        except TimeoutError:
            first = ("error", f"not listening after {self.start_timeout_s:g} s")
        except BaseException:
            writer.close()
            raise
        if first is None or first[0] != "ready":
            writer.close()
            if self.proc is not None and self.proc.returncode is None:
                self.proc.kill()  # it sent why, or hangs
            await self._reap()
            why = "it exited" if first is None else first[1]
            raise ConfigError(f"traffic.data_plane: the data plane process did not start: {why}")
        self._writer = writer
        self._reading = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        on = self.on
        while (message := await read_frame(reader)) is not None:
            kind = message[0]
            try:
                if kind == "synced":
                    for n in [n for n in self._synced if n <= message[1]]:
                        future = self._synced.pop(n)
                        if not future.done():
                            future.set_result(None)
                elif kind == "stopped":
                    continue
                else:
                    on[kind](*message[1:])
            except Exception as exc:  # a bug in a handler: the next frame still goes
                _log.error("data_plane_frame_failed", kind=kind, error=repr(exc))

    async def _keep(self) -> None:
        """Replace the child whenever it ends while not stopping."""
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            assert self._reading is not None
            started = loop.time()
            await asyncio.shield(self._reading)
            if self._writer is not None:
                self._writer.close()
            code = await self._reap()
            if self._stopping.is_set():
                return
            self._release_syncs()
            failures = failures + 1 if loop.time() - started < 60 else 1
            _log.error("data_plane_exited", exit_code=code)
            while True:
                await asyncio.sleep(RESTART_DELAYS_S[min(failures, len(RESTART_DELAYS_S)) - 1])
                if self._stopping.is_set():
                    return
                try:
                    await self._spawn()
                    break
                except Exception as exc:  # ConfigError: it exited, or did not listen
                    _log.error("data_plane_restart_failed", error=str(exc))
                    failures += 1
            self.on_restart()

    async def _reap(self) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        try:
            return await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
        except TimeoutError:
            proc.kill()
            return await proc.wait()

    def _release_syncs(self) -> None:
        for future in self._synced.values():
            if not future.done():
                future.set_result(None)
        self._synced.clear()

    async def sync(self, timeout_s: float = 1.0) -> None:
        """Return once every frame the child sent before now was handled (its counts
        included), or after ``timeout_s``, or at once while it is down."""
        writer = self._writer
        if writer is None or self.down or writer.is_closing():
            return
        self._sync_n += 1
        future = asyncio.get_running_loop().create_future()
        self._synced[self._sync_n] = future
        writer.write(frame(("sync", self._sync_n)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(future), timeout_s)

    async def stop(self) -> None:
        """Tell the child to stop, handle what it sends until it exits, close the
        listening socket."""
        self._stopping.set()
        writer, keeper = self._writer, self._keeper
        if writer is not None and not writer.is_closing():
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(frame(("stop",)))
        if self._reading is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reading), self.stop_timeout_s)
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        if self._reading is not None and not self._reading.done():
            self._reading.cancel()
        await self._reap()
        if writer is not None:
            writer.close()
        self._release_syncs()
        self.listening.close()
