"""The options every Kafka client of relmon shares: security and consumer group tuning.

:func:`client_options` turns ``kafka.security_protocol``, ``kafka.tls`` and
``kafka.sasl`` into aiokafka keyword arguments, with one ``ssl.SSLContext`` built
once: ``relmon run`` hands the same dict to the traffic consumer and its dead-letter
producer, the review producer, the replay of the review and verdict topics and the
verdict follower (whose dead-letter producer takes it too), so that every client
reaches the cluster the same way. :func:`group_options` adds the group timeouts to the
traffic consumer (the only one in a consumer group), with its ``auto_offset_reset``.

When a client cannot start, aiokafka says only "Unable to bootstrap";
:func:`connection_problem` opens one connection with the same options to tell why
(TLS verification, SASL authentication, nothing listening). No message here holds the
password.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError

from monitor.config.schema import KafkaSettings, KafkaTlsSettings
from monitor.core.errors import ConfigError

__all__ = ["build_ssl_context", "client_options", "connection_problem", "group_options"]

_PROBE_TIMEOUT_S = 10.0


def build_ssl_context(tls: KafkaTlsSettings) -> ssl.SSLContext:
    """A client context: verifies the brokers (``ca_file``, else the system CAs), sends a
    client certificate if ``cert_file``/``key_file`` are set; ConfigError names the field."""
    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=str(tls.ca_file) if tls.ca_file else None
        )
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"kafka.tls.ca_file: {tls.ca_file}: {_ssl_reason(exc)}") from None
    if tls.cert_file is not None and tls.key_file is not None:
        try:
            context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"kafka.tls.cert_file/key_file: {tls.cert_file}, {tls.key_file}: {_ssl_reason(exc)}"
            ) from None
    context.check_hostname = tls.check_hostname  # verify_mode stays CERT_REQUIRED
    return context


def _ssl_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None)
    return str(reason or type(exc).__name__).lower().replace("_", " ")


def client_options(kafka: KafkaSettings) -> dict[str, Any]:
    """aiokafka keyword arguments for ``kafka``'s security settings (empty for PLAINTEXT).

    Call it once and pass the result to every client: it builds the one SSL context.
    """
    protocol = kafka.security_protocol
    if protocol == "PLAINTEXT":
        return {}
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = build_ssl_context(kafka.tls)
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        options["sasl_mechanism"] = kafka.sasl.mechanism
        options["sasl_plain_username"] = kafka.sasl.username
        options["sasl_plain_password"] = kafka.sasl.resolved_password()
    return options


def group_options(kafka: KafkaSettings) -> dict[str, Any]:
    """The consumer group timeouts that are set (aiokafka's defaults for the others), and
    where a partition without a usable committed offset starts."""
    names = (
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "max_poll_interval_ms",
        "rebalance_timeout_ms",
    )
    options = {name: getattr(kafka, name) for name in names if getattr(kafka, name) is not None}
    options["auto_offset_reset"] = kafka.auto_offset_reset
    return options


async def connection_problem(
    bootstrap_servers: str, options: dict[str, Any], timeout_s: float = _PROBE_TIMEOUT_S
) -> str | None:
    """Why a connection to the first reachable broker of ``bootstrap_servers`` with
    ``options`` fails (None if one succeeds): one line naming the setting to check."""
    keys = ("security_protocol", "ssl_context", "sasl_mechanism")
    conn_options = {k: options[k] for k in keys if k in options}
    if "sasl_mechanism" in options:
        conn_options["sasl_plain_username"] = options.get("sasl_plain_username")
        conn_options["sasl_plain_password"] = options.get("sasl_plain_password")
    problems: list[str] = []
    for server in [s.strip() for s in bootstrap_servers.split(",") if s.strip()]:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            problems.append(f"{server}: not host:port")
            continue
        try:
            conn = await asyncio.wait_for(create_conn(host, int(port), **conn_options), timeout_s)
        except ssl.SSLCertVerificationError as exc:
            problems.append(
                f"{server}: TLS: the broker's certificate was not accepted "
                f"({exc.verify_message}); check kafka.tls.ca_file and kafka.tls.check_hostname"
            )
            continue
        except ssl.SSLError as exc:
            problems.append(
                f"{server}: TLS handshake failed ({_ssl_reason(exc)}); check "
                "kafka.security_protocol (does the listener speak TLS?) and kafka.tls"
            )
            continue
        except (KafkaError, KeyError) as exc:  # KeyError: see CONNECT_ERRORS
            problems.append(f"{server}: {_kafka_reason(exc, options)}")
            continue
        except (OSError, TimeoutError) as exc:
            problems.append(f"{server}: cannot connect ({type(exc).__name__})")
            continue
        with contextlib.suppress(Exception):
            conn.close()
        return None
    return "; ".join(problems) or "kafka.bootstrap_servers: no broker given"


def _kafka_reason(exc: Exception, options: dict[str, Any]) -> str:
    name = type(exc).__name__
    mechanism = options.get("sasl_mechanism")
    user = options.get("sasl_plain_username")
    refused = isinstance(exc, KeyError) and mechanism is not None
    if refused or "SaslAuthentication" in name or "AuthenticationFailed" in name:
        return (
            f"SASL {mechanism} authentication of user {user!r} failed; check "
            "kafka.sasl.username and the password (kafka.sasl.password, "
            "RELMON_KAFKA__SASL__PASSWORD or kafka.sasl.password_file)"
        )
    if "UnsupportedSaslMechanism" in name:
        return f"the broker does not offer SASL {mechanism}; check kafka.sasl.mechanism"
    if name == "KafkaConnectionError":
        if options.get("ssl_context") is not None:
            return (
                "the broker closed the connection after the TLS handshake (what a broker "
                "that requires a client certificate does); check kafka.tls.cert_file and "
                "kafka.tls.key_file"
            )
        return (
            "the broker closed the connection (a TLS or SASL listener does this to a "
            "plain client); check kafka.security_protocol"
        )
    if "IllegalSaslState" in name or "NotAuthenticated" in name:
        return f"{name}: the broker wants SASL; check kafka.security_protocol"
    return f"{name}; check kafka.security_protocol, kafka.tls and kafka.sasl"
