"""A replica's writes against the shared store, for the kill -9 test
(``python -m tests.postgres.kill_driver``: a zygote that forks drivers, see :func:`main`).

It writes review items, leases any replica's items, and gives verdicts as the API does
(``save_record``) or as the page does (``hold_verdict``, then the flusher's
``claim_due`` / ``save_record`` / ``drop_held``), in a seeded random order, forever.
Every write the store acknowledged (returned) is appended to ``ACKS`` as one JSON line
*after* it returned: whatever is in that file must be in the store, whenever the
process is killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from typing import TextIO

from adapters.postgres.store import PostgresStore
from monitor.core.review import ReviewItem, Verdict, verdict_score
from monitor.engine.verdicts import calibration_record

__all__ = ["HOLD_S", "drive", "flush", "item_of", "main"]

HOLD_S = 0.3
"""The page's undo window here: short, so held verdicts are applied while it runs."""


def item_of(item_id: str, rng: random.Random) -> ReviewItem:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return ReviewItem(
        item_id=item_id,
        model="sim-1",
        task="arith",
        query=f"What is {a} plus {b}?",
        candidates=((str(a + b), 4), (str(a + b + 1), 2)),
        k=6,
        inclusion_probability=rng.choice((0.25, 0.5, 1.0)),
        sampled_at=time.time(),
    )


def _ack(out: TextIO, **fields: object) -> None:
    out.write(json.dumps(fields) + "\n")
    out.flush()  # in the kernel's hands now: SIGKILL cannot take it back


async def _judge(store: PostgresStore, name: str, rng: random.Random, out: TextIO) -> None:
    item = await store.lease_next(None, holder=name, lease_s=5)
    if item is None:
        return
    verdict = Verdict(item.item_id, accepted_ranks=(rng.choice((1, 1, 2)),), reviewer=name)
    if rng.random() < 0.5:  # the API
        order = await store.save_record(
            calibration_record(item, verdict_score(item, verdict)), verdict
        )
        if order is not None:
            _ack(out, kind="verdict", item=item.item_id, ranks=list(verdict.accepted_ranks))
    elif await store.hold_verdict(verdict, HOLD_S, holder=name) == "held":  # the page
        _ack(out, kind="held", item=item.item_id, ranks=list(verdict.accepted_ranks))


async def flush(store: PostgresStore) -> int:
    """The page's flusher: apply the held verdicts that are due."""
    applied = 0
    for verdict in await store.claim_due():
        item = await store.get_review_item(verdict.item_id)
        if item is not None:
            record = calibration_record(item, verdict_score(item, verdict))
            applied += await store.save_record(record, verdict) is not None
        await store.drop_held(verdict.item_id)
    return applied


async def drive(dsn: str, name: str, seed: int, out: TextIO) -> None:
    rng = random.Random(seed)
    store = await PostgresStore.open(dsn, max_size=2)
    n = 0
    while True:
        roll = rng.random()
        if roll < 0.4:
            n += 1
            item_id = f"arith:{name}-{n}"
            await store.submit(item_of(item_id, rng))
            _ack(out, kind="item", item=item_id)
        elif roll < 0.9:
            await _judge(store, name, rng, out)
        else:
            await flush(store)


def main() -> None:
    """A zygote: import relmon once (seconds here), say ``ready``, then for each line
    ``DSN NAME SEED ACKS`` on stdin fork a driver and print its pid. The test kills the
    drivers with SIGKILL; children are reaped by the kernel (SIGCHLD ignored)."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print("ready", flush=True)
    for line in sys.stdin:
        dsn, name, seed, acks = line.split()
        pid = os.fork()
        if pid == 0:  # the driver: write until killed
            with open(acks, "a", encoding="utf-8") as out:
                asyncio.run(drive(dsn, name, int(seed), out))
            os._exit(0)
        print(pid, flush=True)


if __name__ == "__main__":
    main()
