"""Which production paths a re-ask may follow. No I/O.

A re-ask goes where the task says: the task's ``endpoint.base_url`` joined with the
API's own path (each API's :meth:`~monitor.core.apis.base.WireApi.route`), never the
client's raw request target. The only API whose re-ask path comes from production is
``generic`` (the production path, normalised, and only under the task's
``match.path_prefix``); Gemini keeps the production path's version (and Vertex AI's
project and location), each checked to be a plain name.

A target a client shaped to go elsewhere is relayed by the proxy as it came but never
re-asked (:func:`unsafe_path`, counted ``relmon_not_reasked_total{reason="unsafe_path"}``):
one that is not a plain path (absolute form ``http://host/…``, authority form, ``*``),
one with an empty segment (``//``), a backslash, a control character or bytes that are
not UTF-8, and one with a dot-dot segment however it is spelled: ``..``, percent-encoded
(``%2e%2e``, ``.%2E``, also encoded twice, ``%252e%252e``), with a path parameter
(``..;x``, which some servers read as ``..``), or hidden in an encoded slash
(``%2f``, ``%5c``). Single-dot segments are harmless and :func:`normalised_path` drops
them.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import unquote

__all__ = ["UNSAFE_PATH", "normalised_path", "under_prefix", "unsafe_path"]

UNSAFE_PATH: Final = "unsafe_path"
"""The ``relmon_not_reasked_total{reason}`` of a request whose target :func:`unsafe_path`
refuses (or, ``generic``, whose path leaves the task's ``match.path_prefix``)."""

_DECODE_ROUNDS: Final = 3
"""How many times a segment is percent-decoded to find a dot-dot (``%252e`` is ``%2e``
once decoded): a server behind may decode again."""


def _decoded(segment: str) -> str:
    """``segment`` percent-decoded until it no longer changes (at most a few rounds)."""
    for _ in range(_DECODE_ROUNDS):
        if "%" not in segment:
            break
        plain = unquote(segment, errors="surrogateescape")
        if plain == segment:
            break
        segment = plain
    return segment


def _dots(segment: str) -> str | None:
    """``"."`` or ``".."`` when ``segment`` is a dot segment however spelled (decoded,
    its path parameters after ``;`` left out); None otherwise."""
    name = _decoded(segment).split(";", 1)[0]
    return name if name in (".", "..") else None


def unsafe_path(path: str | None) -> bool:
    """Whether a production path (no query string) must never be re-asked (see the
    module). None (no path known: an event that names none) is not unsafe."""
    if path is None:
        return False
    if not path.startswith("/") or "//" in path or "\\" in path:
        return True  # absolute or authority form, "*", an empty segment, a backslash
    if not path.isprintable():
        return True  # a control character, or bytes that are not UTF-8 (surrogates)
    for segment in path.split("/"):
        if "%" not in segment and ";" not in segment and segment != "..":
            continue  # the usual segment: nothing to decode
        if _dots(segment) == "..":
            return True
        plain = _decoded(segment)
        if "/" in plain or "\\" in plain or not plain.isprintable():
            return True  # an encoded separator, or a control character behind a %
    return False


def normalised_path(path: str) -> str:
    """A path :func:`unsafe_path` accepts, without its single-dot segments (``/a/./b`` is
    ``/a/b``; ``/a/b/.`` is ``/a/b/``)."""
    segments = path.split("/")
    kept = [s for s in segments if _dots(s) != "."]
    if len(kept) == len(segments):
        return path
    if _dots(segments[-1]) == ".":
        kept.append("")  # a trailing dot segment names the directory: keep its slash
    return "/".join(kept) or "/"


def under_prefix(path: str, prefix: str) -> bool:
    """Whether ``path`` lies under ``prefix`` (as the proxy matches a task's
    ``match.path_prefix``: the path starts with it)."""
    return path.startswith(prefix)
