"""PostgreSQL outages lose no scored item (the review outbox, monitor/engine/outbox.py)
and ``/readyz`` names the store while it is down and is 200 within 3 s of its return.

relmon runs for real (mirror, a simulated model over HTTP, ``store.backend: postgres``)
with a steady stream of requests, every one sampled and reviewed, while a PostgreSQL
of the test's own is stopped (``pg_ctl stop``), killed (``kill -9`` of every process of
the cluster) or frozen (``SIGSTOP``), and started again; once more with relmon itself
stopped during the outage and started after it, its items waiting on disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres.outage import Fault, OutageCluster, outage_cluster, run_outage

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster() -> Iterator[OutageCluster]:
    yield from outage_cluster()


@pytest.mark.parametrize("fault", ["stop", "kill9", "sigstop"])
async def test_every_scored_item_reaches_the_queue_across_an_outage(
    cluster: OutageCluster, tmp_path: Path, fault: Fault
) -> None:
    # A frozen server is noticed by the timeouts (5 s): a longer outage.
    outage_s = 11.0 if fault == "sigstop" else 8.0
    outcome = await run_outage(cluster, tmp_path, fault, outage_s=outage_s, rate_per_s=4.0)
    print(outcome)
    assert outcome.kept > 0 and outcome.outbox_peak > 0, outcome  # the outage was felt
    assert outcome.scored > 10, outcome
    assert outcome.queued == outcome.scored and outcome.dropped == 0, outcome
    assert any(r.startswith("PostgreSQL store unreachable") for r in outcome.down_reasons), outcome
    assert outcome.ready_after_s is not None and outcome.ready_after_s < 3.0, outcome
    assert outcome.drained_after_s is not None and outcome.drained_after_s < 10.0, outcome


async def test_items_waiting_on_disk_are_written_after_relmon_restarts(
    cluster: OutageCluster, tmp_path: Path
) -> None:
    outcome = await run_outage(
        cluster, tmp_path, "stop", outage_s=5.0, rate_per_s=4.0, restart_relmon=True
    )
    print(outcome)
    assert outcome.on_disk > 0, outcome  # relmon stopped with items in its outbox
    assert outcome.queued == outcome.scored and outcome.dropped == 0, outcome
    assert outcome.ready_after_s is not None and outcome.ready_after_s < 3.0, outcome
