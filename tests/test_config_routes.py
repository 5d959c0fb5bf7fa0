"""``traffic.routes``: the settings' checks, what ``check-config`` says about routes, and
the first-match rule the proxy applies (against a reading of it written out here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from adapters.traffic.intake import api_of_target
from adapters.traffic.routing import RouteSpec, match_route, route_entry
from monitor.app.route_checks import USUAL_PATHS
from monitor.app.validation import validate_settings
from monitor.config import load_settings
from monitor.core.errors import ConfigError

ANTHROPIC = "https://api.anthropic.com"


def config(tmp_path: Path, routes: list[dict[str, Any]], **traffic: Any) -> Path:
    tasks = [
        {
            "name": name,
            "match": {"api": api},
            "endpoint": {"api": api, "base_url": base, "model": "m"},
        }
        for name, api, base in (
            ("chat", "openai.chat", "http://127.0.0.1:1/v1"),
            ("claude", "anthropic.messages", ANTHROPIC),
        )
    ]
    doc = {
        "traffic": {"mode": "proxy", "port": 0, "routes": routes, **traffic},
        "metrics": {"port": 0},
        "review": {"port": 0, "token": "0123456789abcdef0123456789abcdef"},
        "query_hash_key": "0123456789abcdef0123456789abcdef",
        "tasks": tasks,
    }
    path = tmp_path / "relmon.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def check(path: Path) -> list[str]:
    return validate_settings(load_settings(path))


def test_two_upstreams_with_a_default_pass_without_a_word(tmp_path: Path) -> None:
    routes = [
        {"name": "anthropic", "match": {"api": "anthropic.messages"}, "upstream_url": ANTHROPIC}
    ]
    path = config(tmp_path, routes, upstream_url="http://127.0.0.1:1")
    assert check(path) == []
    assert load_settings(path).traffic.route_labels() == ["anthropic"]


@pytest.mark.parametrize(
    ("route", "message"),
    [
        (
            {"match": {}, "upstream_url": ANTHROPIC},
            "exactly one of match.api and match.path_prefix",
        ),
        (
            {"match": {"api": "x", "path_prefix": "/v1"}, "upstream_url": ANTHROPIC},
            "unknown api 'x'",
        ),
        ({"match": {"api": "generic"}, "upstream_url": ANTHROPIC}, "match.path_prefix"),
        ({"match": {"path_prefix": "v1"}, "upstream_url": ANTHROPIC}, "must start with '/'"),
        ({"match": {"path_prefix": "/v1"}, "upstream_url": ANTHROPIC + "/v1"}, "origin only"),
        ({"match": {"path_prefix": "/v1"}, "upstream_url": "ftp://x"}, "http:// or https://"),
        (
            {"name": "default", "match": {"path_prefix": "/v1"}, "upstream_url": ANTHROPIC},
            "not 'default'",
        ),
        (
            {"name": "Has Space", "match": {"path_prefix": "/v1"}, "upstream_url": ANTHROPIC},
            "metric label",
        ),
    ],
)
def test_a_wrong_route_names_its_field(tmp_path: Path, route: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=r"traffic\.routes") as err:
        load_settings(config(tmp_path, [route], upstream_url="http://127.0.0.1:1"))
    assert message in str(err.value)


def test_names_given_twice_and_routes_outside_the_proxy_are_refused(tmp_path: Path) -> None:
    route = {"name": "a", "match": {"path_prefix": "/v1"}, "upstream_url": ANTHROPIC}
    with pytest.raises(ConfigError, match="given twice"):
        load_settings(config(tmp_path, [route, route]))
    with pytest.raises(ConfigError, match=r"traffic\.mode: proxy"):
        load_settings(config(tmp_path, [route], mode="mirror"))


def test_a_shadowed_route_and_a_task_no_route_takes_are_problems(tmp_path: Path) -> None:
    routes = [
        {"match": {"path_prefix": "/v1/"}, "upstream_url": "http://127.0.0.1:1"},
        {"name": "anthropic", "match": {"path_prefix": "/v1/messages"}, "upstream_url": ANTHROPIC},
    ]
    with pytest.raises(ConfigError) as err:
        check(config(tmp_path, routes))
    assert "traffic.routes[1] (anthropic): never used: traffic.routes[0] comes first" in str(
        err.value
    )
    routes = [{"match": {"path_prefix": "/v1/chat"}, "upstream_url": "http://127.0.0.1:1"}]
    with pytest.raises(ConfigError) as err:
        check(config(tmp_path, routes))
    assert "tasks[1] (claude): no route sends its requests (anthropic.messages" in str(err.value)
    # With a default upstream the same routes are fine: the default takes the rest.
    assert check(config(tmp_path, routes, upstream_url="http://127.0.0.1:1")) == []


def test_a_route_no_task_monitors_is_a_warning(tmp_path: Path) -> None:
    routes = [
        {"name": "gemini", "match": {"api": "gemini.generate_content"}, "upstream_url": ANTHROPIC}
    ]
    warnings = check(config(tmp_path, routes, upstream_url="http://127.0.0.1:1"))
    assert len(warnings) == 1
    assert "traffic.routes[0] (gemini): no task monitors the requests it takes" in warnings[0]


prefixes = st.sampled_from(["/", "/v1", "/v1/", "/v1/messages", "/v1beta", "/agent", "/openai"])
specs = st.lists(
    st.one_of(
        st.builds(lambda a: RouteSpec("r", "http://u", api=a), st.sampled_from(list(USUAL_PATHS))),
        st.builds(lambda p: RouteSpec("r", "http://u", path_prefix=p), prefixes),
    ),
    max_size=5,
)
targets = st.one_of(
    st.sampled_from(list(USUAL_PATHS.values())),
    st.builds(lambda p, q: p + q, st.sampled_from(list(USUAL_PATHS.values())), st.just("?k=v")),
    st.text(alphabet="/abcv1:?.", max_size=30).map(lambda t: "/" + t),
)


@given(specs, targets)
def test_the_first_matching_route_takes_a_request(routes: list[RouteSpec], target: str) -> None:
    """The proxy's matcher agrees with the rule as written: the first route whose API is
    the request's, or whose prefix begins the request's target; -1 when none does."""
    raw = target.encode()
    expected = next(
        (
            i
            for i, r in enumerate(routes)
            if (r.api is not None and api_of_target(raw) == r.api)
            or (r.path_prefix is not None and target.startswith(r.path_prefix))
        ),
        -1,
    )
    assert match_route([route_entry(r) for r in routes], raw) == expected
