"""The reviewer-identity keys of ``review`` (``review.auth``, ``tokens_file``,
``proxy_headers``, ``trusted_proxies``; docs/security.md, "Reviewer identity").
:class:`monitor.config.schema.ReviewSettings` has them, beside its other keys."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from monitor.config.secrets import read_reviewer_tokens

__all__ = ["DEFAULT_PROXY_HEADERS", "DEFAULT_TRUSTED_PROXIES", "ReviewIdentitySettings"]

DEFAULT_PROXY_HEADERS = ("X-Auth-Request-Email", "X-Forwarded-User")
"""oauth2-proxy's headers (nginx ``auth_request``, then its reverse-proxy mode)."""
DEFAULT_TRUSTED_PROXIES = ("127.0.0.1/32", "::1/128")
"""Loopback: a proxy in the same pod or on the same host."""


class ReviewIdentitySettings(BaseModel):
    """Who a reviewer is (``review.auth`` and its keys; docs/security.md): a bearer token,
    shared or one per reviewer (``tokens_file``), or an auth proxy's header."""

    model_config = ConfigDict(extra="forbid")

    auth: Literal["token", "proxy"] = "token"
    tokens_file: Path | None = None  # "name:token" lines: the token names the reviewer
    proxy_headers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROXY_HEADERS), min_length=1
    )
    trusted_proxies: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TRUSTED_PROXIES), min_length=1
    )

    @field_validator("proxy_headers")
    @classmethod
    def _header_names(cls, v: list[str]) -> list[str]:
        bad = [h for h in v if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", h)]
        if bad:
            raise ValueError(f"not HTTP header names: {', '.join(map(repr, bad))}")
        return v

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        for value in v:
            try:
                ipaddress.ip_network(value.strip(), strict=True)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not an address or CIDR: {exc}") from None
        return v

    def reviewer_tokens(self) -> dict[str, list[str]]:
        """The reviewers of ``tokens_file`` and their tokens (none without it)."""
        if self.tokens_file is None:
            return {}
        return read_reviewer_tokens(self.tokens_file, "review.tokens_file")
