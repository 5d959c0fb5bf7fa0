"""The proxy's configuration: an upstream URL with a path is refused by ``relmon
check-config`` naming the field (a path would be joined in front of every request's own
path: clients calling ``.../v1/chat/completions`` would get the upstream's 404), and the
upstream timeouts, pool size and event-loop switch are read and checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.app.cli import main
from monitor.config import load_settings
from monitor.core.errors import ConfigError


def write(tmp_path: Path, traffic: str) -> Path:
    path = tmp_path / "relmon.yaml"
    path.write_text(f"traffic: {{mode: proxy, {traffic}}}\nreview: {{token: t-0123456789}}\n")
    return path


@pytest.mark.parametrize(
    "url", ["http://model:8000/v1", "http://model:8000/v1/", "https://m/openai", "http://m:1/?a=1"]
)
def test_an_upstream_url_with_a_path_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    config = write(tmp_path, f'upstream_url: "{url}"')
    with pytest.raises(ConfigError, match=r"traffic\.upstream_url: give the upstream's origin"):
        load_settings(config)
    assert main(["check-config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "traffic.upstream_url" in err and "/v1/chat/completions" in err


@pytest.mark.parametrize("url", ["http://model:8000", "http://model:8000/", "https://model"])
def test_an_origin_is_accepted(tmp_path: Path, url: str) -> None:
    assert load_settings(write(tmp_path, f'upstream_url: "{url}"')).traffic.upstream_url == url


def test_timeouts_pool_and_event_loop_keys(tmp_path: Path) -> None:
    traffic = load_settings(write(tmp_path, 'upstream_url: "http://m:1"')).traffic
    defaults = (traffic.upstream_connect_timeout_s, traffic.upstream_read_timeout_s)
    assert defaults == (5.0, 60.0)
    assert (traffic.upstream_pool_size, traffic.uvloop) == (256, True)
    assert traffic.client_send_timeout_s == 60.0  # as nginx's send_timeout
    extra = 'upstream_url: "http://m:1", upstream_connect_timeout_s: 0.5, '
    extra += "upstream_read_timeout_s: 300, upstream_pool_size: 8, uvloop: false, "
    extra += "client_send_timeout_s: 7.5"
    traffic = load_settings(write(tmp_path, extra)).traffic
    assert (traffic.upstream_connect_timeout_s, traffic.upstream_read_timeout_s) == (0.5, 300)
    assert traffic.client_send_timeout_s == 7.5
    with pytest.raises(ConfigError, match="client_send_timeout_s"):
        load_settings(write(tmp_path, 'upstream_url: "http://m:1", client_send_timeout_s: 0'))
    assert (traffic.upstream_pool_size, traffic.uvloop) == (8, False)
    with pytest.raises(ConfigError, match="upstream_pool_size"):
        load_settings(write(tmp_path, 'upstream_url: "http://m:1", upstream_pool_size: 0'))
