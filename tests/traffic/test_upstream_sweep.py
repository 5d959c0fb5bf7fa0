"""The upstream pool's read timeout, swept without a clock read per request: a waiting
connection is timed out at the first sweep after the timeout, at most one tick late."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from adapters.model.transport import _Call
from adapters.upstream.pool import UpstreamConnection, UpstreamPool


class _Transport:
    def __init__(self) -> None:
        self.aborted = False

    def write(self, data: bytes) -> None: ...

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@pytest.mark.parametrize("timeout_s", [0.05, 0.3, 1.0, 3.3, 4.0, 7.5, 60.0, 61.5, 600.0])
async def test_a_quiet_connection_times_out_at_the_first_sweep_past_the_timeout(
    timeout_s: float,
) -> None:
    pool = UpstreamPool(
        "127.0.0.1",
        9,
        tls=False,
        connect_timeout_s=1.0,
        read_timeout_s=timeout_s,
        max_connections=4,
    )
    tick = pool._tick
    assert tick <= min(1.0, timeout_s / 4) + 1e-12
    rng = random.Random(int(timeout_s * 100))
    for _ in range(20):
        conn = UpstreamConnection(pool)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        lost: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        conn.start(_Call(1 << 20, lost), False)  # an exchange that reports its end
        conn.watch()
        sweep = 0
        # A byte now and then (each between two sweeps), then silence.
        last_byte = 0.0
        for _ in range(rng.randrange(3)):
            sweep += rng.randrange(1, 4)
            pool._sweep()
            last_byte = (sweep + rng.random()) * tick  # after this sweep, before the next
            conn.data_received(b"")  # no exchange consumed it: only the quiet count resets
            assert not lost.done()
        while not lost.done():
            sweep += 1
            pool._sweep()
            silence = sweep * tick - last_byte
            if not lost.done():
                assert silence < timeout_s + 1e-9, "not timed out past the timeout"
        assert lost.result() == "timeout"
        assert timeout_s - 1e-9 <= silence <= timeout_s + tick + 1e-9
    pool.close()
