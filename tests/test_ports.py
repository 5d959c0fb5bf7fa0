"""tests.ports.free_port: ports a server in another process can still bind later."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from tests import ports
from tests.ports import free_port


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports)
    with socket.socket() as s:  # what the server will do with it
        s.bind(("127.0.0.1", ports[-1]))
        s.listen()


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        held = free_port()
        taken.bind(("127.0.0.1", held))
        taken.listen()
        monkeypatch.setattr(ports, "_candidates", itertools.count(held - ports._LOW))
        assert free_port() != held  # the next candidate was held
