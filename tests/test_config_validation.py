"""One validation path for check-config and run; every secret path; the budget check; `off`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from monitor.app.cli import main
from monitor.app.runner import start_service
from monitor.app.validation import budget_warnings, fewest_samples, validate_settings
from monitor.app.wiring import build_task
from monitor.config import default_state_dir, load_settings
from monitor.core.errors import ConfigError
from monitor.engine.metrics import Metrics

DOCUMENTED_CANONICALIZERS = (
    "numeric",
    "mcq",
    "text",
    "json",
    "regex",
    "tool_call",
    "embedding",
    "llm",
)

TASK = """
tasks:
  - name: arith
    canonicalizer: {canon}
    endpoint: {{base_url: "http://127.0.0.1:8000/v1", model: m1}}
"""


def write(tmp_path: Path, text: str, name: str = "relmon.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture(autouse=True)
def _no_relmon_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("RELMON_"):
            monkeypatch.delenv(key)


# ------------------------------------------------------- invalid configs, one path

INVALID = [
    pytest.param(
        TASK.format(canon="numerc") + "review: {token: t0k3n}\n",
        ["tasks[0] (arith).canonicalizer: unknown canonicalizer 'numerc'; available: "],
        id="unknown-canonicalizer",
    ),
    pytest.param(
        TASK.format(canon="numerc")
        + "    answer_pattern: 'Answer: (.*)'\nreview: {token: t0k3n}\n",
        ["tasks[0] (arith).canonicalizer: unknown canonicalizer 'numerc'; available: "],
        id="unknown-canonicalizer-with-answer-pattern",
    ),
    pytest.param(
        TASK.format(canon="llm")
        + "    canonicalizer_options: {endpoint: 'http://127.0.0.1:9/v1', then: numerc}\n"
        + "    answer_pattern: 'Answer: (.*)'\nreview: {token: t0k3n}\n",
        ["tasks[0] (arith).canonicalizer: unknown canonicalizer 'numerc'; available: "],
        id="unknown-then-of-llm-with-answer-pattern",
    ),
    pytest.param(
        TASK.format(canon="numeric") + "review: {token: t0k3n, token_file: /no/such/token}\n",
        [
            "review.token_file: set either review.token (or RELMON_REVIEW__TOKEN) "
            "or review.token_file, not both"
        ],
        id="review-token-and-token-file",
    ),
    pytest.param(
        TASK.format(canon="numeric")
        + "review: {token: t0k3n}\nquery_hash_key: k\nquery_hash_key_file: /no/such/key\n",
        [
            "query_hash_key_file: set either query_hash_key (or RELMON_QUERY_HASH_KEY) "
            "or query_hash_key_file, not both"
        ],
        id="query-hash-key-and-file",
    ),
    pytest.param(
        "tasks: [{name: arith, canonicalizer: numeric, canonicalizer_options: {percent: x}}]\n"
        "review: {token: t0k3n}\n",
        ["tasks[0] (arith).canonicalizer: ", "percent"],
        id="bad-canonicalizer-option",
    ),
    pytest.param(
        "tasks: [{name: arith, endpoint: {base_url: 'http://127.0.0.1:8000/v1'}}]\n"
        "review: {token: t0k3n}\n",
        ["tasks[0] (arith).endpoint.model: required"],
        id="missing-model",
    ),
    pytest.param(
        "tasks: [{name: arith, endpoint: {base_url: '127.0.0.1:8000/v1', model: m}}]\n",
        ["tasks[0] (arith).endpoint.base_url: must start with http:// or https://"],
        id="base-url-without-scheme",
    ),
    pytest.param(
        TASK.format(canon="numeric"),
        ["review.token: the review API needs a token: set RELMON_REVIEW_TOKEN"],
        id="missing-review-token",
    ),
    pytest.param(
        TASK.format(canon="numeric") + "review: {backend: kafka}\n",
        ["review.backend: 'kafka' needs kafka.enabled: true"],
        id="kafka-review-without-kafka",
    ),
    pytest.param(
        TASK.format(canon="numeric") + "review: {token_file: /no/such/token}\n",
        ["review.token_file: cannot read /no/such/token"],
        id="unreadable-token-file",
    ),
    pytest.param(
        "tasks: [{name: arith, endpoint: {model: m, api_key_file: /no/such/key}}]\n"
        "review: {token: t0k3n}\n",
        ["tasks[0] (arith).endpoint.api_key_file: cannot read /no/such/key"],
        id="unreadable-api-key-file",
    ),
    pytest.param(
        "tasks: [{name: arith, answer_pattern: 'Answer: (', endpoint: {model: m}}]\n"
        "review: {token: t0k3n}\n",
        ["tasks[0] (arith).answer_pattern: not a regular expression"],
        id="bad-answer-pattern",
    ),
    pytest.param(
        "tasks: [{name: a, endpoint: {model: m}}, {name: a, endpoint: {model: m}}]\n"
        "review: {token: t0k3n}\n",
        ["tasks[1] (a).name: already the name of tasks[0]"],
        id="duplicate-task",
    ),
    pytest.param(
        "tasks: [{name: arith, k_max: 40, endpoint: {model: m}}]\n"
        "budget: {calls_per_minute: 30}\nreview: {token: t0k3n}\n",
        ["tasks[0] (arith).k_max: 40 is more than budget.calls_per_minute (30)"],
        id="k-max-above-budget",
    ),
    pytest.param(
        "tasks: [{name: arith, canonicalizer: nope}]\nreview: {backend: kafka}\n",
        [
            "tasks[0] (arith).endpoint.model: required",
            "tasks[0] (arith).canonicalizer: unknown canonicalizer 'nope'",
            "review.backend: 'kafka' needs kafka.enabled: true",
        ],
        id="every-problem-at-once",
    ),
    pytest.param(
        "tasks: [{name: arith, endpoint: {model: m, circuit_breaker: {failures: 0}}}]\n"
        "review: {token: t0k3n}\n",
        ["tasks[0] (arith).endpoint.circuit_breaker.failures: Input should be greater than"],
        id="circuit-breaker-no-failures",
    ),
    pytest.param(
        "tasks: [{name: arith, endpoint: {model: m, circuit_breaker: {cooldown_s: .inf}}}]\n"
        "review: {token: t0k3n}\n",
        ["tasks[0] (arith).endpoint.circuit_breaker.cooldown_s: Input should be a finite number"],
        id="circuit-breaker-endless-cooldown",
    ),
    pytest.param("review: {token: t0k3n}\n", ["tasks: no tasks configured"], id="no-tasks"),
]


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_check_config_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: list[str]
) -> None:
    path = write(tmp_path, text)
    assert main(["check-config", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert all(line.startswith(f"relmon: error: {path}: ") for line in lines), lines
    for part in expected:
        assert any(part in line for line in lines), (part, lines)
    assert "Traceback" not in captured.err
    if "unknown canonicalizer" in expected[0]:
        for name in DOCUMENTED_CANONICALIZERS:
            assert name in captured.err, name


@pytest.mark.integration  # runs a relmon process
@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_run_rejects_exactly_what_check_config_rejects_before_binding_or_writing(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    """`relmon run` (a real process) fails with the same lines, binds nothing, writes nothing."""
    state = tmp_path / "state"
    path = write(tmp_path, text + f"state_dir: {json.dumps(str(state))}\n")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("RELMON_")}
    # A port that is taken: binding it would be an OSError, not the config message.
    with TakenPort() as port:
        env["RELMON_METRICS__PORT"] = str(port)
        run = subprocess.run(
            [sys.executable, "-m", "monitor", "run", "--config", str(path)],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        check = subprocess.run(
            [sys.executable, "-m", "monitor", "check-config", "--config", str(path)],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert run.returncode == 2, run.stderr
    assert check.returncode == 2, check.stderr
    assert run.stderr.splitlines() == check.stderr.splitlines()
    for part in expected:
        assert part in run.stderr
    assert not state.exists()


class TakenPort:
    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_state_dir_that_cannot_be_used_is_reported_not_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELMON_REVIEW_TOKEN", "t0k3n")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for state, why in (
        (a_file, f"state_dir: {a_file} exists and is not a directory"),
        (a_file / "sub" / "dir", f"cannot be created: {a_file} is not a writable directory"),
    ):
        text = TASK.format(canon="numeric") + f"state_dir: {json.dumps(str(state))}\n"
        with pytest.raises(ConfigError) as err:
            validate_settings(load_settings(write(tmp_path, text)))
        assert why in str(err.value)
    fine = tmp_path / "new" / "state"
    text = TASK.format(canon="numeric") + f"state_dir: {json.dumps(str(fine))}\n"
    assert validate_settings(load_settings(write(tmp_path, text))) == []
    assert not fine.parent.exists()  # checked, not created
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    text = TASK.format(canon="numeric") + "state_dir: ~/relmon\n"
    assert load_settings(write(tmp_path, text)).state_dir == tmp_path / "home" / "relmon"


def test_off_mode_is_accepted_from_yaml_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = TASK.format(canon="numeric") + "traffic: {mode: off}\n"
    assert load_settings(write(tmp_path, text)).traffic.mode == "off"
    monkeypatch.setenv("RELMON_TRAFFIC__MODE", "off")
    assert load_settings(write(tmp_path, TASK.format(canon="numeric"))).traffic.mode == "off"
    monkeypatch.setenv("RELMON_TRAFFIC__MODE", "offf")
    with pytest.raises(ConfigError, match=r"traffic\.mode: Input should be 'mirror', 'proxy'"):
        load_settings(write(tmp_path, TASK.format(canon="numeric")))


async def test_off_mode_starts_no_traffic_listener(tmp_path: Path) -> None:
    settings = _service_settings(tmp_path, model_url="http://127.0.0.1:9/v1", traffic="off")
    running = await start_service(settings, review_token="t0k3n-abc")
    try:
        assert running.traffic_server is None
        assert running.metrics_server is not None and running.metrics_server.bound_port
    finally:
        await running.close(1)


def test_state_dir_default_is_absolute_and_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/var/tmp/xdg")
    assert default_state_dir() == Path("/var/tmp/xdg/relmon")
    assert load_settings(None).state_dir == Path("/var/tmp/xdg/relmon")
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_dir() == Path.home() / ".local" / "state" / "relmon"
    assert default_state_dir().is_absolute()


# ------------------------------------------------------------------------ secrets


class _KeyEndpoint:
    """A real OpenAI-style endpoint that records the Authorization header it receives."""

    def __init__(self) -> None:
        self.auth: list[str | None] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization"))
        return web.json_response({"choices": [{"message": {"content": "42"}}]})


@pytest.fixture
async def key_endpoint() -> AsyncIterator[_KeyEndpoint]:
    ep = _KeyEndpoint()
    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", ep.handle)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    ep.url = f"http://127.0.0.1:{port}/v1"
    yield ep
    await runner.cleanup()


async def _key_seen(settings_path: Path, ep: _KeyEndpoint) -> str | None:
    settings = load_settings(settings_path)
    validate_settings(settings)
    task = build_task(settings.tasks[0], Metrics(CollectorRegistry()))
    try:
        await task.client.sample({"messages": [{"role": "user", "content": "6*7"}]}, 1)
    finally:
        await task.client.aclose()
    return ep.auth[-1]


async def test_api_key_from_the_documented_environment_variable(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    key_endpoint: _KeyEndpoint,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = f"tasks:\n  - name: arith\n    endpoint: {{base_url: {key_endpoint.url}, model: m}}\n"
    monkeypatch.setenv("RELMON_REVIEW_TOKEN", "t0k3n")
    monkeypatch.setenv("RELMON_TASKS__0__ENDPOINT__API_KEY", "sk-from-env")
    # without api_key in the file, and overriding one that is there
    for extra in ("", "    canonicalizer: numeric\n"):
        path = write(tmp_path, base + extra)
        assert await _key_seen(path, key_endpoint) == "Bearer sk-from-env"
        settings = load_settings(path)
        assert settings.tasks[0].name == "arith" and settings.tasks[0].endpoint.model == "m"
    with_key = base.replace("model: m}", "model: m, api_key: sk-from-file}")
    assert await _key_seen(write(tmp_path, with_key), key_endpoint) == "Bearer sk-from-env"
    assert main(["check-config", "--config", str(write(tmp_path, with_key))]) == 0
    out = capsys.readouterr().out
    assert "sk-from-env" not in out
    doc = json.loads(out)
    assert doc["tasks"][0]["endpoint"]["api_key"] == "**********"
    assert "RELMON_TASKS__0__ENDPOINT__API_KEY" in doc["environment_overrides"]
    # a second task added purely from the environment, and a gap that is refused
    monkeypatch.setenv("RELMON_TASKS__1__NAME", "second")
    monkeypatch.setenv("RELMON_TASKS__1__ENDPOINT__MODEL", "m2")
    assert [t.name for t in load_settings(write(tmp_path, base)).tasks] == ["arith", "second"]
    monkeypatch.setenv("RELMON_TASKS__3__NAME", "gap")
    with pytest.raises(ConfigError, match=r"RELMON_TASKS__3__.*only 2 tasks"):
        load_settings(write(tmp_path, base))


async def test_api_key_in_the_file_and_from_api_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key_endpoint: _KeyEndpoint
) -> None:
    monkeypatch.setenv("RELMON_REVIEW_TOKEN", "t0k3n")
    endpoint = f"base_url: {key_endpoint.url}, model: m"
    inline = f"tasks: [{{name: a, endpoint: {{{endpoint}, api_key: sk-inline}}}}]\n"
    assert await _key_seen(write(tmp_path, inline), key_endpoint) == "Bearer sk-inline"
    secret = tmp_path / "secret" / "api-key"
    secret.parent.mkdir()
    secret.write_text("sk-mounted\n")  # a Kubernetes Secret ends with a newline
    mounted = f"tasks: [{{name: a, endpoint: {{{endpoint}, api_key_file: {secret}}}}}]\n"
    assert await _key_seen(write(tmp_path, mounted), key_endpoint) == "Bearer sk-mounted"
    both = mounted.replace("api_key_file", "api_key: sk-x, api_key_file")
    with pytest.raises(ConfigError, match=r"tasks\[0\] \(a\)\.endpoint\.api_key_file: set either"):
        validate_settings(load_settings(write(tmp_path, both)))


SECRET_TWICE = [
    # (config, environment, (where the file key is, the value key, its variable))
    pytest.param(
        (
            "tasks: [{name: a, endpoint: {model: m, api_key: sk-x, api_key_file: KEY}}]\n",
            {},
            (
                "tasks[0] (a).endpoint.api_key",
                "endpoint.api_key",
                "RELMON_TASKS__0__ENDPOINT__API_KEY",
            ),
        ),
        id="api-key-and-file",
    ),
    pytest.param(
        (
            "tasks: [{name: a, endpoint: {model: m, api_key_file: KEY}}]\n",
            {"RELMON_TASKS__0__ENDPOINT__API_KEY": "sk-env"},
            (
                "tasks[0] (a).endpoint.api_key",
                "endpoint.api_key",
                "RELMON_TASKS__0__ENDPOINT__API_KEY",
            ),
        ),
        id="api-key-variable-and-file",
    ),
    pytest.param(
        (
            "tasks: [{name: a, endpoint: {model: m}}]\nreview: {token: t, token_file: KEY}\n",
            {},
            ("review.token", "review.token", "RELMON_REVIEW__TOKEN"),
        ),
        id="review-token-and-file",
    ),
    pytest.param(
        (
            "tasks: [{name: a, endpoint: {model: m}}]\nreview: {token_file: KEY}\n",
            {"RELMON_REVIEW__TOKEN": "t"},
            ("review.token", "review.token", "RELMON_REVIEW__TOKEN"),
        ),
        id="review-token-variable-and-file",
    ),
    pytest.param(
        (
            "tasks: [{name: a, endpoint: {model: m}}]\nreview: {token: t}\nkafka: "
            "{enabled: true, security_protocol: SASL_SSL, sasl: {mechanism: SCRAM-SHA-512, "
            "username: u, password: p, password_file: KEY}}\n",
            {},
            ("kafka.sasl.password", "kafka.sasl.password", "RELMON_KAFKA__SASL__PASSWORD"),
        ),
        id="sasl-password-and-file",
    ),
    pytest.param(
        (
            "tasks: [{name: a, endpoint: {model: m}}]\nreview: {token: t}\nkafka: "
            "{enabled: true, security_protocol: SASL_SSL, sasl: {mechanism: SCRAM-SHA-512, "
            "username: u, password_file: KEY}}\n",
            {"RELMON_KAFKA__SASL__PASSWORD": "p"},
            ("kafka.sasl.password", "kafka.sasl.password", "RELMON_KAFKA__SASL__PASSWORD"),
        ),
        id="sasl-password-variable-and-file",
    ),
    pytest.param(
        (
            "tasks: [{name: a, endpoint: {model: m}}]\nreview: {token: t}\n"
            "query_hash_key: k\nquery_hash_key_file: KEY\n",
            {},
            ("query_hash_key", "query_hash_key", "RELMON_QUERY_HASH_KEY"),
        ),
        id="query-hash-key-and-file",
    ),
    pytest.param(
        (
            "tasks: [{name: a, endpoint: {model: m}}]\nreview: {token: t}\n"
            "query_hash_key_file: KEY\n",
            {"RELMON_QUERY_HASH_KEY": "k"},
            ("query_hash_key", "query_hash_key", "RELMON_QUERY_HASH_KEY"),
        ),
        id="query-hash-key-variable-and-file",
    ),
]


@pytest.mark.parametrize("case", SECRET_TWICE)
def test_a_secret_given_as_value_and_file_is_an_error_naming_both(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: tuple[str, dict[str, str], tuple[str, str, str]],
) -> None:
    """One rule for every secret: its value (from the file or its variable) or its file."""
    text, env, names = case
    key_file = tmp_path / "secret"
    key_file.write_text("s3cret-from-file\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = write(tmp_path, text.replace("KEY", str(key_file)) + f"state_dir: {tmp_path}\n")
    where, key, variable = names
    line = f"{where}_file: set either {key} (or {variable}) or {key}_file, not both"
    with pytest.raises(ConfigError) as err:
        validate_settings(load_settings(path))
    assert line in str(err.value)
    assert main(["check-config", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert f"relmon: error: {path}: {line}" in captured.err.splitlines()
    assert "s3cret" not in captured.err and "sk-" not in captured.err


@pytest.mark.parametrize("also", ["review.token", "review.token_file", "RELMON_REVIEW__TOKEN"])
def test_relmon_review_token_overrides_the_configured_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, also: str
) -> None:
    """The documented exception: RELMON_REVIEW_TOKEN (top-level review_token) wins."""
    monkeypatch.setenv("RELMON_REVIEW_TOKEN", "from-relmon-review-token")
    review: dict[str, Any] = {}
    if also == "review.token":
        review["token"] = "from-review-token"
    elif also == "review.token_file":
        f = tmp_path / "token"
        f.write_text("from-token-file\n")
        review["token_file"] = str(f)
    else:
        monkeypatch.setenv("RELMON_REVIEW__TOKEN", "from-nested-variable")
    settings = _service_settings(tmp_path, model_url="http://127.0.0.1:9/v1", **review)
    assert validate_settings(settings) == []
    assert settings.resolved_review_token() == "from-relmon-review-token"


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        ({"RELMON_REVIEW__TOKEN": "nested"}, {}, "nested"),
        ({"RELMON_REVIEW__TOKEN": "nested"}, {"token": "yaml"}, "nested"),
        ({}, {"token": " yaml \n"}, "yaml"),
    ],
)
def test_review_token_variable_sets_review_token(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    config: dict[str, Any],
    expected: str,
) -> None:
    """RELMON_REVIEW__TOKEN is review.token, set from the environment (and wins over it)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    text = f"tasks: [{{name: a, endpoint: {{model: m}}}}]\nstate_dir: {json.dumps(str(tmp_path))}\n"
    if config:
        text += f"review: {json.dumps(config)}\n"
    settings = load_settings(write(tmp_path, text))
    assert validate_settings(settings) == []
    assert settings.resolved_review_token() == expected


def _service_settings(
    tmp_path: Path, *, model_url: str, traffic: str = "off", **review: Any
) -> Any:
    return load_settings(
        None,
        tasks=[{"name": "a", "endpoint": {"base_url": model_url, "model": "m"}}],
        metrics={"port": 0},
        review={"port": 0, **review},
        traffic={"port": 0, "mode": traffic},
        state_dir=tmp_path / "state",
    )


async def _review_status(running: Any, token: str) -> int:
    port = running.review_server.bound_port
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://127.0.0.1:{port}/api/reviews/next",
            headers={"Authorization": f"Bearer {token}"},
        ) as resp,
    ):
        return resp.status


@pytest.mark.parametrize("how", ["environment", "review.token", "review.token_file"])
async def test_review_token_from_each_documented_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    token = f"secret-via-{how.replace('.', '-')}"
    review: dict[str, Any] = {}
    if how == "environment":
        monkeypatch.setenv("RELMON_REVIEW_TOKEN", token)
    elif how == "review.token":
        review["token"] = token
    else:
        f = tmp_path / "token"
        f.write_text(token + "\n")
        review["token_file"] = str(f)
    settings = _service_settings(tmp_path, model_url="http://127.0.0.1:9/v1", **review)
    assert validate_settings(settings) == []
    running = await start_service(settings)
    try:
        assert await _review_status(running, token) in (200, 204)
        assert await _review_status(running, "wrong-token") == 401
    finally:
        await running.close(1)


async def test_missing_token_fails_before_any_port_or_file(tmp_path: Path) -> None:
    settings = _service_settings(tmp_path, model_url="http://127.0.0.1:9/v1")
    with pytest.raises(ConfigError, match=r"review\.token: the review API needs a token"):
        await asyncio.wait_for(start_service(settings), 30)
    assert not (tmp_path / "state").exists()


# ------------------------------------------------------------------------- budget


def test_fewest_samples_matches_the_mixture_e_value_by_hand() -> None:
    """Unanimous n answers, uniform prior on [1/2, 1]: E = (2^(n+1) - 1) / (n + 1).

    The default runner-up rule stops at E >= 2/delta; the mixture at E >= 1/delta
    (one rival when every answer agrees). Without the futility stop, which at k0 = 1
    can give up earlier (tests/test_stopping.py)."""
    for delta in (0.05, 0.01, 0.2):
        for rule, c in (("runner-up", 2), ("mixture", 1)):
            expected = next(n for n in range(1, 100) if (2 ** (n + 1) - 1) / (n + 1) >= c / delta)
            task = load_settings(
                None,
                tasks=[
                    {"name": "t", "delta": delta, "k0": 1, "stopping_rule": rule, "futility": False}
                ],
            ).tasks[0]
            assert fewest_samples(task) == expected
    # The default truncated rule at K_max = 20, delta = 0.05 (tuned table b = 7, 9, 10):
    # unanimous answers certify at 7, but with the default futility stop a 3-3 split
    # gives up at 6 (a runner-up count of 3 can never be certified against), so 6.
    assert fewest_samples(load_settings(None, tasks=[{"name": "t"}]).tasks[0]) == 6
    no_futility = load_settings(None, tasks=[{"name": "t", "futility": False}])
    assert fewest_samples(no_futility.tasks[0]) == 7
    fixed = load_settings(None, tasks=[{"name": "t", "stopping_rule": "fixed", "k_max": 12}])
    assert fewest_samples(fixed.tasks[0]) == 12


@pytest.mark.parametrize(
    ("events", "rate", "budget", "verdict"),
    [
        (3.0, 1.0, 600, "cannot fit"),  # 3 items/s x >= 6 samples = 1,080/min > 600
        (3.0, 1.0, 2_000, "may not fit"),  # 1,080..3,600/min around 2,000
        (3.0, 1.0, 3_600, None),  # even k_max = 20 for every item fits
        (3.0, 0.01, 600, None),
        (None, 1.0, 600, None),  # no traffic assumption, nothing to check
    ],
)
def test_budget_warning_from_expected_traffic(
    events: float | None, rate: float, budget: int, verdict: str | None
) -> None:
    settings = load_settings(
        None,
        tasks=[{"name": "t", "sampling_rate": rate, "expected_events_per_s": events}],
        budget={"calls_per_minute": budget},
    )
    warnings = budget_warnings(settings)
    if verdict is None:
        assert warnings == []
        return
    assert len(warnings) == 1 and verdict in warnings[0], warnings
    items_per_min = events * rate * 60  # type: ignore[operator]
    fewest = 6  # the default truncated rule: unanimous answers stop at 6
    assert f"{items_per_min * fewest:,.0f}..{items_per_min * 20:,.0f} calls/min" in warnings[0]
    if verdict == "cannot fit":
        assert f"{1 - budget / (items_per_min * fewest):.0%} of the sampled events" in warnings[0]
    else:
        assert f"at most {budget / items_per_min:.1f} samples" in warnings[0]


def test_check_config_prints_the_budget_warning_and_succeeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "tasks: [{name: t, endpoint: {model: m}, sampling_rate: 1.0, expected_events_per_s: 3}]\n"
        "budget: {calls_per_minute: 600}\nreview: {token: t0k3n}\n"
    )
    assert main(["check-config", "--config", str(write(tmp_path, text))]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert captured.err.startswith("relmon: warning: ")
    assert "budget.calls_per_minute: 600 cannot fit" in captured.err


def test_retries_per_outcome_defaults_older_form_and_limits(tmp_path: Path) -> None:
    base = "tasks:\n  - name: arith\n    endpoint: {{model: m1, {extra}}}\n"
    defaults = load_settings(write(tmp_path, base.format(extra="")))
    assert defaults.tasks[0].endpoint.retry_limits() == {
        "error": 3,
        "timeout": 3,
        "rate_limited": 3,
        "invalid": 2,
    }
    mixed = load_settings(
        write(tmp_path, base.format(extra="max_retries: 5, retries: {timeout: 1, invalid: 4}"))
    )
    assert mixed.tasks[0].endpoint.retry_limits() == {
        "error": 5,
        "timeout": 1,
        "rate_limited": 5,
        "invalid": 4,
    }
    client = build_task(mixed.tasks[0], Metrics(CollectorRegistry())).client
    assert client._retries == mixed.tasks[0].endpoint.retry_limits()  # type: ignore[attr-defined]
    validate_settings(mixed, review_token="t")
    too_many = load_settings(write(tmp_path, base.format(extra="retries: {invalid: 11}")))
    with pytest.raises(ConfigError, match=r"arith\)\.endpoint\.retries\.invalid: 11 retries"):
        validate_settings(too_many, review_token="t")
    old_form = load_settings(write(tmp_path, base.format(extra="max_retries: 50")))
    with pytest.raises(ConfigError, match=r"endpoint\.max_retries: 50 retries"):
        validate_settings(old_form, review_token="t")
    with pytest.raises(ConfigError, match="retries"):
        load_settings(write(tmp_path, base.format(extra="retries: {garbled: 1}")))


# ------------------------------------------------------------------ circuit breaker

BREAKER = "tasks:\n  - name: arith\n    endpoint: {{model: m1, circuit_breaker: {value}}}\n"


@pytest.mark.parametrize(
    ("value", "field", "message"),
    [
        ("{failures: 0}", "failures", "Input should be greater than or equal to 1"),
        ("{failures: -3}", "failures", "Input should be greater than or equal to 1"),
        ("{failures: 2.5}", "failures", "Input should be a valid integer"),
        ("{failures: many}", "failures", "Input should be a valid integer"),
        ("{failures: true}", "failures", "must be an integer, got true"),
        ("{failures: null}", "failures", "Input should be a valid integer"),
        ("{cooldown_s: -0.5}", "cooldown_s", "Input should be greater than or equal to 0"),
        ("{cooldown_s: .inf}", "cooldown_s", "Input should be a finite number"),
        ("{cooldown_s: .nan}", "cooldown_s", "Input should be a finite number"),
        ("{cooldown_s: soon}", "cooldown_s", "Input should be a valid number"),
        ("{cooldown_s: false}", "cooldown_s", "must be a number of seconds, got false"),
        ("{cooldown_s: null}", "cooldown_s", "Input should be a valid number"),
        ("{failurs: 3}", "failurs", "Extra inputs are not permitted"),
        ("5", "", "Input should be a valid dictionary"),
    ],
)
def test_circuit_breaker_bad_values_name_the_task_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, field: str, message: str
) -> None:
    path = write(tmp_path, BREAKER.format(value=value) + "review: {token: t0k3n}\n")
    assert main(["check-config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    where = "tasks[0] (arith).endpoint.circuit_breaker" + (f".{field}" if field else "")
    assert f"relmon: error: {path}: {where}: {message}" in err, err
    assert "Traceback" not in err


def test_circuit_breaker_defaults_values_and_environment_reach_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def breaker(settings: Any) -> tuple[int, float]:
        client = build_task(settings.tasks[0], Metrics(CollectorRegistry())).client
        b = client._breaker  # type: ignore[attr-defined]
        return b._threshold, b._cooldown_s

    defaults = load_settings(write(tmp_path, "tasks: [{name: arith, endpoint: {model: m1}}]\n"))
    assert defaults.tasks[0].endpoint.circuit_breaker.model_dump() == {
        "failures": 5,
        "cooldown_s": 30.0,
    }
    assert breaker(defaults) == (5, 30.0)
    path = write(tmp_path, BREAKER.format(value="{failures: 2, cooldown_s: 0.25}"))
    configured = load_settings(path)
    assert breaker(configured) == (2, 0.25)
    assert validate_settings(configured, review_token="t") == []
    zero = load_settings(write(tmp_path, BREAKER.format(value="{failures: 1, cooldown_s: 0}")))
    assert breaker(zero) == (1, 0.0)  # a trial call right after every failure
    monkeypatch.setenv("RELMON_TASKS__0__ENDPOINT__CIRCUIT_BREAKER__FAILURES", "7")
    monkeypatch.setenv("RELMON_TASKS__0__ENDPOINT__CIRCUIT_BREAKER__COOLDOWN_S", "90")
    assert breaker(load_settings(path)) == (7, 90.0)
    monkeypatch.setenv("RELMON_TASKS__0__ENDPOINT__CIRCUIT_BREAKER__COOLDOWN_S", "inf")
    with pytest.raises(ConfigError, match=r"circuit_breaker\.cooldown_s: .*finite"):
        load_settings(path)


@pytest.mark.parametrize(
    ("canonicalizer", "traffic", "warned"),
    [
        ("embedding", "mode: proxy, upstream_url: 'http://m:1'", True),
        ("embedding", "mode: mirror", True),
        ("embedding", "mode: proxy, upstream_url: 'http://m:1', data_plane: process", False),
        ("embedding", "mode: off", False),
        ("numeric", "mode: proxy, upstream_url: 'http://m:1'", False),
    ],
)
def test_an_embedding_canonicalizer_beside_a_one_process_listener_is_warned_of(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    canonicalizer: str,
    traffic: str,
    warned: bool,
) -> None:
    text = (
        f"tasks: [{{name: t, endpoint: {{model: m}}, canonicalizer: {canonicalizer}}}]\n"
        f"traffic: {{{traffic}}}\nreview: {{token: t0k3n}}\n"
    )
    assert main(["check-config", "--config", str(write(tmp_path, text))]) == 0
    err = capsys.readouterr().err
    assert ("traffic.data_plane: 'inline' while task(s) t use the embedding" in err) == warned
    if warned:
        assert "set traffic.data_plane: process" in err


@pytest.mark.parametrize(
    ("match", "otlp", "warned"),
    [
        ("{attributes: {service.name: checkout}}", "false", True),
        ("{attributes: {service.name: checkout}}", "true", False),
        ("{model: m}", "false", False),
    ],
)
def test_matching_span_attributes_without_the_receiver_is_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], match: str, otlp: str, warned: bool
) -> None:
    text = (
        f"tasks: [{{name: t, endpoint: {{model: m}}, match: {match}}}]\n"
        f"traffic: {{otlp: {{enabled: {otlp}}}}}\nreview: {{token: t0k3n}}\n"
    )
    assert main(["check-config", "--config", str(write(tmp_path, text))]) == 0
    err = capsys.readouterr().err
    said = "tasks[0] (t).match.attributes: only spans carry attributes" in err
    assert said == warned, err
    if warned:
        assert "traffic.otlp.enabled is false: no event will match this task" in err
