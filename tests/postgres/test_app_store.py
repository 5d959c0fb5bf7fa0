"""``store.backend: postgres`` through the app: settings, check-config naming what is
wrong with the database, and two ``relmon run`` services on one database being one
monitor (a verdict given on one replica's review API is in the other's calibration)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from adapters.postgres.schema import MIGRATIONS
from monitor.app.cli import main
from monitor.app.runner import start_service
from monitor.app.validation import validate_settings
from monitor.config import load_settings
from monitor.core.errors import ConfigError
from monitor.core.review import ReviewItem
from tests.ports import free_port
from tests.postgres import PostgresCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)


def _config(tmp_path: Path, name: str, store: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"""tasks:
  - name: arith
    canonicalizer: numeric
    endpoint: {{model: sim-1, base_url: "http://127.0.0.1:9/v1"}}
metrics: {{port: {free_port()}}}
review: {{port: {free_port()}, token: tok-{name}-123456}}
traffic: {{mode: "off"}}
store: {store}
state_dir: "{tmp_path / name}"
query_hash_key: "0123456789abcdef0123456789abcdef"
""",
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("store", "expected"),
    [
        ("{backend: postgres}", "store.dsn: required with store.backend: postgres"),
        (
            "{backend: postgres, dsn: 'postgresql://a@b/c', dsn_file: /etc/x}",
            "store.dsn_file: set either store.dsn",
        ),
        ("{backend: postgres, dsn_file: /no/such/file}", "store.dsn_file: cannot read"),
    ],
)
def test_store_settings_are_checked(tmp_path: Path, store: str, expected: str) -> None:
    settings = load_settings(_config(tmp_path, "a", store))
    with pytest.raises(ConfigError) as info:
        validate_settings(settings)
    assert expected in str(info.value), str(info.value)


def test_check_config_names_what_is_wrong_with_the_database(
    tmp_path: Path, pg_cluster: PostgresCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"postgresql://postgres:pw-secret@127.0.0.1:{pg_cluster.port}/relmon_missing"
    path = _config(tmp_path, "a", f"{{backend: postgres, dsn: '{missing}'}}")
    assert main(["check-config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "store.dsn:" in err and "no such database" in err and "pw-secret" not in err
    unreachable = "postgresql://postgres@127.0.0.1:9/relmon"
    path = _config(tmp_path, "b", f"{{backend: postgres, dsn: '{unreachable}'}}")
    assert main(["check-config", "--config", str(path)]) == 2
    assert "cannot reach the server" in capsys.readouterr().err
    fresh = pg_cluster.create_database("relmon_check_fresh")
    path = _config(tmp_path, "c", f"{{backend: postgres, dsn: '{fresh}'}}")
    assert main(["check-config", "--config", str(path)]) == 0
    captured = capsys.readouterr()
    every = ", ".join(str(version) for version, _ in MIGRATIONS)  # all of them, 1 to the last
    assert every.startswith("1, 2, 3, 4, 5, 6")
    assert f"schema migrations {every} will be applied at the next start" in captured.err
    assert '"dsn": "**********"' in captured.out


async def test_two_replicas_on_one_database_are_one_monitor(
    tmp_path: Path, pg_cluster: PostgresCluster
) -> None:
    dsn = pg_cluster.create_database("relmon_app_replicas")
    store = f"{{backend: postgres, dsn: '{dsn}', sync_s: 0.2}}"
    a = await start_service(load_settings(_config(tmp_path, "a", store)))
    b = await start_service(load_settings(_config(tmp_path, "b", store)))
    try:
        item = ReviewItem(
            item_id="arith:req-1",
            model="sim-1",
            task="arith",
            query="What is 2 plus 2?",
            candidates=(("4", 5), ("5", 1)),
            k=6,
            inclusion_probability=1.0,
            sampled_at=1_800_000_000.0,
        )
        await a.store.save_review_item(item)  # as replica a's worker would
        review_b = f"http://127.0.0.1:{b.settings.review.port}"
        headers = {"Authorization": "Bearer tok-b-123456"}
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.get(f"{review_b}/api/reviews/next") as resp:
                assert resp.status == 200  # b's review API serves a's item: one queue
                assert (await resp.json())["item_id"] == "arith:req-1"
            async with http.post(
                f"{review_b}/api/reviews/arith:req-1", json={"accepted_ranks": [1]}
            ) as resp:
                assert resp.status == 200, await resp.text()
        await wait_until(
            lambda: a.service.snapshot("sim-1", "arith").n == 1,
            timeout_s=30,
            what="replica a to follow the verdict given on b",
        )
        snaps = [r.service.snapshot("sim-1", "arith") for r in (a, b)]
        assert snaps[0] == snaps[1]
        # One accepted verdict of weight 1/pi = 1 against the test mass 1/review_rate = 10.
        assert snaps[0].reliability_level == pytest.approx(1 / 11)
    finally:
        await b.close(1)
        await a.close(1)
