"""Who is reviewing: how the review API and page authenticate (``review.auth``;
docs/security.md, "Reviewer identity").

- ``token`` (the default): ``Authorization: Bearer <token>`` on every ``/api`` request.
  The token is the shared one (``review.token``: the reviewer types a name, kept as
  given) or one of the per-reviewer tokens of ``review.tokens_file`` (``name:token``
  lines: the token names the reviewer). Every configured token is compared, each time,
  with :func:`hmac.compare_digest`, so neither a match nor its position shows in the
  time taken.
- ``proxy``: an authenticating proxy in front of relmon (oauth2-proxy, an ingress with
  ``auth_request``) names the reviewer in a header: the first of ``proxy_headers``
  present (``X-Auth-Request-Email``, else ``X-Forwarded-User``). Only a request whose
  TCP peer is in ``trusted_proxies`` (CIDRs; loopback by default) is believed; from any
  other address the headers are ignored and the answer is 401. The proxy's session is a
  cookie the browser sends by itself, so a state-changing request that the browser marks
  as coming from another site (``Sec-Fetch-Site``) is refused (403).

A reviewer identified either way replaces the self-typed ``reviewer`` of every verdict
(:func:`reviewer_of`); a name is at most ``MAX_REVIEWER_CHARS`` printable characters
(:func:`monitor.core.review.reviewer_name_problem`).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from aiohttp import web

from monitor.config.identity import DEFAULT_PROXY_HEADERS, DEFAULT_TRUSTED_PROXIES
from monitor.core.errors import ConfigError
from monitor.core.review import Verdict, reviewer_name_problem

__all__ = [
    "AuthOutcome",
    "ReviewAuth",
    "remember_reviewer",
    "reviewer_of",
    "with_reviewer",
]

_REVIEWER = web.RequestKey("relmon_reviewer", str)
"""The request key of the identified reviewer (absent: not named)."""
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class AuthOutcome:
    """A request's authentication: ``reviewer`` (None: not named, e.g. the shared token)
    when ``status`` is None, else the refusal (status, message, headers)."""

    reviewer: str | None = None
    status: int | None = None
    error: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)


def _parse_networks(values: Iterable[str]) -> tuple[_Network, ...]:
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=True))
        except ValueError as exc:
            raise ConfigError(f"review.trusted_proxies: {value!r} is not a CIDR: {exc}") from None
    return tuple(out)


class ReviewAuth:
    """Authenticates review API requests (see the module). ``reviewer_tokens``: name ->
    token (``review.tokens_file``)."""

    def __init__(
        self,
        *,
        mode: Literal["token", "proxy"] = "token",
        token: str | None = None,
        reviewer_tokens: Mapping[str, Iterable[str]] | None = None,
        proxy_headers: Iterable[str] = DEFAULT_PROXY_HEADERS,
        trusted_proxies: Iterable[str] = DEFAULT_TRUSTED_PROXIES,
    ) -> None:
        self.mode = mode
        shared = (token or "").strip()
        self._token = shared.encode("utf-8") if shared else None
        self._named = [
            (name, t.strip().encode("utf-8"))
            for name, tokens in (reviewer_tokens or {}).items()
            for t in tokens
        ]
        self._headers = tuple(h.strip() for h in proxy_headers if h.strip())
        self._trusted = _parse_networks(trusted_proxies)
        if mode == "token" and self._token is None and not self._named:
            raise ConfigError("the review API needs a non-empty token")
        if any(not t for _, t in self._named):
            raise ConfigError("review.tokens_file: a reviewer's token is empty")
        if mode == "proxy" and not (self._headers and self._trusted):
            raise ConfigError("review.auth: proxy needs proxy_headers and trusted_proxies")

    def __repr__(self) -> str:  # never the tokens
        return f"ReviewAuth(mode={self.mode!r}, reviewers={len(self._named)})"

    def authenticate(self, request: web.Request) -> AuthOutcome:
        """Who sent ``request``, or why it is refused (401, 403)."""
        return self._by_proxy(request) if self.mode == "proxy" else self._by_token(request)

    def _by_token(self, request: web.Request) -> AuthOutcome:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            challenge = {"WWW-Authenticate": 'Bearer realm="relmon"'}
            return AuthOutcome(status=401, error="missing bearer token", headers=challenge)
        # Header bytes that are not UTF-8 arrive as lone surrogates; they never match.
        presented = given.strip().encode("utf-8", "surrogateescape")
        matched = self._token is not None and hmac.compare_digest(presented, self._token)
        reviewer = None
        for name, token in self._named:  # all of them, whatever matched
            if hmac.compare_digest(presented, token) and reviewer is None:
                reviewer = name
        if reviewer is None and not matched:
            challenge = {"WWW-Authenticate": 'Bearer realm="relmon", error="invalid_token"'}
            return AuthOutcome(status=401, error="invalid token", headers=challenge)
        return AuthOutcome(reviewer=reviewer)

    def _trusted_peer(self, request: web.Request) -> bool:
        try:
            address = ipaddress.ip_address(request.remote or "")
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self._trusted)

    def _by_proxy(self, request: web.Request) -> AuthOutcome:
        challenge = {"WWW-Authenticate": 'relmon-proxy realm="relmon"'}
        if not self._trusted_peer(request):
            return AuthOutcome(
                status=401,
                error="review.auth is proxy: sign in through the proxy (this address is "
                "not one of review.trusted_proxies)",
                headers=challenge,
            )
        name = next(
            (v.strip() for h in self._headers if (v := request.headers.get(h, "")).strip()), ""
        )
        if not name:
            return AuthOutcome(
                status=401,
                error=f"the proxy named no reviewer ({', '.join(self._headers)})",
                headers=challenge,
            )
        problem = reviewer_name_problem(name)
        if problem is not None:
            return AuthOutcome(status=401, error=f"the proxy's reviewer name {problem}")
        site = request.headers.get("Sec-Fetch-Site", "same-origin").lower()
        if request.method not in _SAFE_METHODS and site not in ("same-origin", "none"):
            return AuthOutcome(status=403, error="a cross-site request is refused")
        return AuthOutcome(reviewer=name)


def reviewer_of(request: web.Request) -> str | None:
    """The reviewer the request was authenticated as (None: not named)."""
    return request.get(_REVIEWER)


def with_reviewer(request: web.Request, verdict: Verdict) -> Verdict:
    """``verdict`` with the authenticated reviewer in place of the self-typed name."""
    reviewer = reviewer_of(request)
    return verdict if reviewer is None else replace(verdict, reviewer=reviewer)


def remember_reviewer(request: web.Request, outcome: AuthOutcome) -> None:
    """Keep ``outcome``'s reviewer on the request (for :func:`reviewer_of`)."""
    if outcome.reviewer is not None:
        request[_REVIEWER] = outcome.reviewer
