"""Free TCP ports on 127.0.0.1 for servers that a test starts in another process.

A port found with ``bind(("127.0.0.1", 0))`` comes from the kernel's ephemeral range,
the range every outgoing connection also takes its local port from: between the probe
and the server's own bind (a second or more while a Python process starts), a client
connection of the same test run (to Kafka, to a model, to /metrics) may take it, and the
server exits with "address in use". These ports come from just below that range, where
the kernel hands out no port by itself; each one is probed free, and one test process
never hands out the same port twice.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

__all__ = ["free_port"]


def _span() -> tuple[int, int]:
    """``[low, high)``: the ports below the ephemeral range (or a fixed span if unknown)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    high = max(low, 12_000)
    return high - 10_000, high


_LOW, _HIGH = _span()
# Start somewhere that depends on the process, so that test runs in parallel on one
# machine (several engineers, several CI jobs) mostly probe different ports.
_candidates = itertools.count(os.getpid() * 7919)


def free_port() -> int:
    """A port that nothing uses now, not returned before (for the next 10,000 calls)."""
    for n in _candidates:
        port = _LOW + n % (_HIGH - _LOW)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError("unreachable")
