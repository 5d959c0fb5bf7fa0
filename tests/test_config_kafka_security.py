"""Kafka security and group settings: validation (one path for check-config and run),
the password from the file, RELMON_KAFKA__SASL__PASSWORD or password_file, and the one
set of client options every Kafka client gets."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.kafka.clients import client_options, connection_problem, group_options
from monitor.app.cli import main
from monitor.app.validation import validate_settings
from monitor.config import effective_settings, load_settings
from monitor.core.errors import ConfigError
from tests.kafka.tls import Pki, make_pki

BASE = """
tasks: [{name: arith, canonicalizer: numeric, endpoint: {model: m}}]
review: {backend: kafka}
query_hash_key: k3y-k3y-k3y-k3y-k3y-k3y-k3y-k3y-k3y-k3y
kafka:
  enabled: true
  bootstrap_servers: "broker-1.example:9094,broker-2.example:9094"
"""


@pytest.fixture(autouse=True)
def _no_relmon_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("RELMON_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def write(tmp_path: Path, kafka: str) -> Path:
    path = tmp_path / "relmon.yaml"
    path.write_text(BASE + "".join(f"  {line}\n" for line in kafka.strip().splitlines()))
    return path


# ------------------------------------------------------------------ valid settings


def test_mutual_tls_options_one_context_for_every_client(tmp_path: Path, pki: Pki) -> None:
    path = write(
        tmp_path,
        f"""
security_protocol: SSL
tls: {{ca_file: {pki.ca}, cert_file: {pki.client_cert}, key_file: {pki.client_key}}}
session_timeout_ms: 30000
heartbeat_interval_ms: 10000
max_poll_interval_ms: 600000
rebalance_timeout_ms: 60000
""",
    )
    settings = load_settings(path)
    assert validate_settings(settings) == []
    options = client_options(settings.kafka)
    assert set(options) == {"security_protocol", "ssl_context"}
    assert options["security_protocol"] == "SSL"
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [
        ((("commonName", "relmon test ca"),),)
    ]
    assert group_options(settings.kafka) == {
        "session_timeout_ms": 30000,
        "heartbeat_interval_ms": 10000,
        "max_poll_interval_ms": 600000,
        "rebalance_timeout_ms": 60000,
        "auto_offset_reset": "earliest",
    }


def test_check_hostname_off_keeps_verifying_the_chain(tmp_path: Path, pki: Pki) -> None:
    path = write(
        tmp_path, f"security_protocol: SSL\ntls: {{ca_file: {pki.ca}, check_hostname: false}}"
    )
    context = client_options(load_settings(path).kafka)["ssl_context"]
    assert not context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_plaintext_has_no_security_options_and_default_group_timeouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A password alone (from the environment, say) is unused without a SASL protocol.
    monkeypatch.setenv("RELMON_KAFKA__SASL__PASSWORD", "unused")
    settings = load_settings(write(tmp_path, ""))
    assert validate_settings(settings) == []
    assert client_options(settings.kafka) == {}
    assert group_options(settings.kafka) == {"auto_offset_reset": "earliest"}


def test_sasl_ssl_system_cas_and_password_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """RELMON_KAFKA__SASL__PASSWORD fills one nested field: the file's other kafka and
    sasl keys stay (the nested-environment pitfall), and it overrides a password there."""
    monkeypatch.setenv("RELMON_KAFKA__SASL__PASSWORD", "pw-from-env")
    for extra in ("", ", password: pw-from-file"):
        path = write(
            tmp_path,
            "security_protocol: SASL_SSL\n"
            f"sasl: {{mechanism: SCRAM-SHA-512, username: relmon{extra}}}",
        )
        settings = load_settings(path)
        assert settings.kafka.bootstrap_servers == "broker-1.example:9094,broker-2.example:9094"
        assert settings.kafka.enabled and settings.kafka.sasl.username == "relmon"
        assert validate_settings(settings) == []
        options = client_options(settings.kafka)
        assert options["sasl_plain_password"] == "pw-from-env"
        assert options["sasl_mechanism"] == "SCRAM-SHA-512"
        assert options["sasl_plain_username"] == "relmon"
        assert options["security_protocol"] == "SASL_SSL"
        context = options["ssl_context"]  # no ca_file: the system's CAs
        assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
        assert main(["check-config", "--config", str(path)]) == 0
        out = capsys.readouterr().out
        assert "pw-from-env" not in out and "pw-from-file" not in out
        doc = json.loads(out)
        assert doc["kafka"]["sasl"]["password"] == "**********"
        assert "RELMON_KAFKA__SASL__PASSWORD" in doc["environment_overrides"]


def test_sasl_password_file_like_a_mounted_secret(tmp_path: Path) -> None:
    secret = tmp_path / "kafka-sasl-password"
    secret.write_text("pw-from-secret\n")
    path = write(
        tmp_path,
        f"security_protocol: SASL_SSL\n"
        f"sasl: {{mechanism: SCRAM-SHA-256, username: relmon, password_file: {secret}}}",
    )
    settings = load_settings(path)
    assert validate_settings(settings) == []
    assert client_options(settings.kafka)["sasl_plain_password"] == "pw-from-secret"
    assert "pw-from-secret" not in json.dumps(effective_settings(settings))


def test_plain_over_sasl_plaintext_is_a_warning_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "security_protocol: SASL_PLAINTEXT\n"
        "sasl: {mechanism: PLAIN, username: relmon, password: pw-plain}",
    )
    assert main(["check-config", "--config", str(path)]) == 0
    captured = capsys.readouterr()
    warnings = captured.err.splitlines()
    assert len(warnings) == 1
    assert warnings[0].startswith(f"relmon: warning: {path}: kafka.sasl.mechanism: PLAIN")
    assert "clear" in warnings[0]
    assert "pw-plain" not in captured.out + captured.err


# ------------------------------------------------------------------ invalid settings

INVALID = [
    pytest.param(
        "security_protocol: SASL_SSL",
        [
            "kafka.sasl.mechanism: required with security_protocol SASL_SSL",
            "kafka.sasl.username: required with security_protocol SASL_SSL",
            "kafka.sasl.password: required with security_protocol SASL_SSL",
        ],
        id="sasl-without-credentials",
    ),
    pytest.param(
        "security_protocol: SSL\nsasl: {mechanism: PLAIN, username: u, password: p}",
        ["kafka.sasl: set, but kafka.security_protocol is SSL"],
        id="sasl-without-sasl-protocol",
    ),
    pytest.param(
        "tls: {ca_file: /etc/hostname}",
        ["kafka.tls: set, but kafka.security_protocol is PLAINTEXT"],
        id="tls-without-tls-protocol",
    ),
    pytest.param(
        "security_protocol: SSL\ntls: {cert_file: CLIENT_CERT}",
        ["kafka.tls.key_file: required with kafka.tls.cert_file"],
        id="cert-without-key",
    ),
    pytest.param(
        "security_protocol: SSL\ntls: {ca_file: /no/such/ca.pem}",
        ["kafka.tls.ca_file: cannot read /no/such/ca.pem"],
        id="missing-ca-file",
    ),
    pytest.param(
        "security_protocol: SSL\ntls: {ca_file: NOT_PEM}",
        ["kafka.tls.ca_file: NOT_PEM"],
        id="ca-file-not-pem",
    ),
    pytest.param(
        "security_protocol: SSL\ntls: {cert_file: CLIENT_CERT, key_file: CA_FILE}",
        ["kafka.tls.cert_file/key_file: "],
        id="key-not-matching",
    ),
    pytest.param(
        "security_protocol: SASL_SSL\n"
        "sasl: {mechanism: SCRAM-SHA-512, username: u, password: p, password_file: NOT_PEM}",
        ["kafka.sasl.password_file: set either kafka.sasl.password"],
        id="password-and-password-file",
    ),
    pytest.param(
        "security_protocol: SASL_SSL\n"
        "sasl: {mechanism: SCRAM-SHA-512, username: u, password_file: /no/such/secret}",
        ["kafka.sasl.password_file: cannot read /no/such/secret"],
        id="unreadable-password-file",
    ),
    pytest.param(
        "sasl: {mechanism: SCRAM-SHA-1}",
        ["kafka.sasl.mechanism: Input should be 'PLAIN', 'SCRAM-SHA-256' or 'SCRAM-SHA-512'"],
        id="unknown-mechanism",
    ),
    pytest.param(
        "security_protocol: SASL",
        ["kafka.security_protocol: Input should be 'PLAINTEXT', 'SSL', 'SASL_PLAINTEXT'"],
        id="unknown-protocol",
    ),
    pytest.param(
        "session_timeout_ms: 6000\nheartbeat_interval_ms: 6000",
        [
            "kafka.heartbeat_interval_ms: the heartbeat interval (6000 ms) must be below the "
            "session timeout (6000 ms)"
        ],
        id="heartbeat-not-below-session",
    ),
    pytest.param(
        "session_timeout_ms: 2000",
        ["kafka.session_timeout_ms: the heartbeat interval (3000 ms) must be below"],
        id="session-below-default-heartbeat",
    ),
    pytest.param(
        "max_poll_interval_ms: 0",
        ["kafka.max_poll_interval_ms: Input should be greater than or equal to 1"],
        id="zero-timeout",
    ),
]


def _fill(text: str, pki: Pki, tmp_path: Path) -> str:
    not_pem = tmp_path / "not-a-certificate.pem"
    not_pem.write_text("hello\n")
    return (
        text.replace("CLIENT_CERT", str(pki.client_cert))
        .replace("CA_FILE", str(pki.ca))
        .replace("NOT_PEM", str(not_pem))
    )


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_check_config_names_the_kafka_field(
    tmp_path: Path,
    pki: Pki,
    capsys: pytest.CaptureFixture[str],
    text: str,
    expected: list[str],
) -> None:
    path = write(tmp_path, _fill(text, pki, tmp_path))
    assert main(["check-config", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert all(line.startswith(f"relmon: error: {path}: ") for line in lines), lines
    for part in (_fill(p, pki, tmp_path) for p in expected):
        assert any(part in line for line in lines), (part, lines)
    assert len(lines) == len(expected), lines
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        p
        for p in INVALID
        if p.id in ("sasl-without-credentials", "ca-file-not-pem", "cert-without-key")
    ],
)
@pytest.mark.integration  # runs a relmon process
def test_run_rejects_the_same_kafka_settings_before_connecting(
    tmp_path: Path, pki: Pki, text: str, expected: list[str]
) -> None:
    path = write(tmp_path, _fill(text, pki, tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("RELMON_")}
    outputs = [
        subprocess.run(
            [sys.executable, "-m", "monitor", command, "--config", str(path)],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        for command in ("run", "check-config")
    ]
    run, check = outputs
    assert run.returncode == check.returncode == 2, run.stderr
    assert run.stderr.splitlines() == check.stderr.splitlines()
    for part in expected:
        assert _fill(part, pki, tmp_path) in run.stderr


def test_settings_without_kafka_enabled_are_not_checked(tmp_path: Path) -> None:
    path = tmp_path / "relmon.yaml"
    path.write_text(
        "tasks: [{name: arith, endpoint: {model: m}}]\nreview: {token: t}\n"
        f"state_dir: {tmp_path / 'state'}\n"
        "kafka: {security_protocol: SASL_SSL}\n"
    )
    assert validate_settings(load_settings(path)) == []


def test_a_bad_password_file_is_a_config_error_not_a_traceback(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    path = write(
        tmp_path,
        "security_protocol: SASL_SSL\n"
        f"sasl: {{mechanism: PLAIN, username: u, password_file: {empty}}}",
    )
    with pytest.raises(ConfigError, match=r"kafka\.sasl\.password_file: .* is empty"):
        validate_settings(load_settings(path))


async def test_connection_problem_names_an_address_nothing_listens_on() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    problem = await connection_problem(f"127.0.0.1:{port},no-port", {}, timeout_s=10)
    assert problem == (
        f"127.0.0.1:{port}: cannot connect (ConnectionRefusedError); no-port: not host:port"
    )
