"""Asynchronous canonicalizers by name: the I/O ones here, the rest from the sync registry.

``get_async_canonicalizer("embedding", threshold=0.9)`` builds
:class:`~adapters.canon.embedding.EmbeddingCanonicalizer`;
``get_async_canonicalizer("llm", endpoint=URL, model=NAME, model_client_factory=f)``
builds :class:`~adapters.canon.llm.LlmCanonicalizer` with a judge client made by
``f(endpoint=URL, model=NAME, **client_options)`` (it owns that client: close it with
``aclose()``), or with a ready ``client=`` that the caller keeps and closes.
``get_async_canonicalizer("regex", pattern=P, then="llm", then_options={...})`` (a task's
``answer_pattern``) extracts P's group from each raw answer, as the ``regex``
canonicalizer does, and gives the extracts to the ``llm`` (or ``embedding``) one; an
answer without a match is :data:`~monitor.core.canon.INVALID`. Any other spec goes to
:func:`monitor.core.canon.get_canonicalizer` and is wrapped with
:func:`~monitor.core.canon.as_async`. An unknown name, also as a ``then``, is refused with
every name above listed. Every failure is a :class:`~monitor.core.errors.ConfigError`.

The judge must answer at temperature 0. A client that sets its own sampling parameters
must be built that way, e.g. for ``adapters.model.client.HttpModelClient`` (which replaces
the request's ``model``, ``temperature`` and ``max_tokens`` with its own)::

    def judge_factory(*, endpoint: str, model: str | None, **options: Any) -> ModelClient:
        return HttpModelClient(base_url=endpoint, model=model or "judge", temperature=0.0,
                            max_tokens=64, **options)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adapters.canon.embedding import EmbeddingCanonicalizer
from adapters.canon.llm import LlmCanonicalizer
from monitor.core.apis.base import Route, WireApi
from monitor.core.canon import (
    INVALID,
    AsyncCanonicalizer,
    QueryContext,
    RegexCanonicalizer,
    as_async,
    available_canonicalizers,
    get_canonicalizer,
)
from monitor.core.errors import ConfigError
from monitor.engine.ports import CircuitState, ModelClient

__all__ = [
    "ModelClientFactory",
    "available_async_canonicalizers",
    "check_canonicalizer",
    "get_async_canonicalizer",
]

ModelClientFactory = Callable[..., ModelClient]
"""Builds the judge's client: called as ``factory(endpoint=..., model=..., **client_options)``."""

_IO_NAMES = ("embedding", "llm")


def available_async_canonicalizers() -> list[str]:
    """The registered names, the I/O ones included, sorted."""
    return sorted({*available_canonicalizers(), *_IO_NAMES})


def get_async_canonicalizer(
    spec: str, *, model_client_factory: ModelClientFactory | None = None, **options: Any
) -> AsyncCanonicalizer:
    """Build the canonicalizer ``spec`` (any case) with ``options``; see the module doc."""
    if not isinstance(spec, str):
        raise ConfigError(f"canonicalizer spec must be a string, got {type(spec).__name__}")
    name = spec.strip().lower()
    if name == "embedding":
        return _embedding(options)
    if name == "llm":
        return _llm(options, model_client_factory)
    _check_name(spec)
    then = options.get("then")
    if name == "regex" and isinstance(then, str):
        _check_name(then)
        if then.strip().lower() in _IO_NAMES:
            return _extract_then(options, model_client_factory)
    return as_async(get_canonicalizer(spec, **options))


def _check_name(spec: str) -> None:
    """Refuse a name that is neither registered (the I/O ones included) nor an import path."""
    name = spec.strip().lower()
    if name not in available_async_canonicalizers() and ":" not in name and "." not in name:
        raise ConfigError(
            f"unknown canonicalizer {spec.strip()!r}; available: "
            f"{', '.join(available_async_canonicalizers())}, or an import path 'module:Class'"
        )


def check_canonicalizer(spec: str, options: Mapping[str, Any]) -> None:
    """Build ``spec`` with ``options`` as the service would, without any I/O.

    The ``llm`` judge gets a stand-in client that is never called, and the embedding
    model is loaded lazily, so this only checks names and options (ConfigError if bad).
    """

    def unbuilt(**_: Any) -> ModelClient:
        return _UnbuiltClient()

    get_async_canonicalizer(spec, model_client_factory=unbuilt, **dict(options))


def _embedding(options: dict[str, Any]) -> AsyncCanonicalizer:

    try:
        return EmbeddingCanonicalizer(**options)
    except TypeError as exc:
        raise ConfigError(f"canonicalizer 'embedding': bad options: {exc}") from exc


def _llm(options: dict[str, Any], factory: ModelClientFactory | None) -> AsyncCanonicalizer:
    client = options.pop("client", None)
    endpoint = options.pop("endpoint", None)
    client_options = options.pop("client_options", None) or {}
    if not isinstance(client_options, Mapping):
        raise ConfigError("canonicalizer 'llm': client_options must be a mapping")
    then = options.get("then")
    if isinstance(then, str):
        _check_name(then)
    if isinstance(then, str) and then.strip().lower() in _IO_NAMES:
        # "llm then embedding" (paper A.3): cluster the judge's extractions.
        options["then"] = get_async_canonicalizer(
            then,
            model_client_factory=factory,
            **dict(options.pop("then_options", None) or {}),
        )
    owns = False
    if client is None:
        # Check the options before a client (and its connection pool) exists to leak.
        _build_llm(_UnbuiltClient(), False, options)
        if not isinstance(endpoint, str) or not endpoint.strip():
            raise ConfigError(
                "canonicalizer 'llm' needs a judge: set endpoint= (the judge's "
                "OpenAI-compatible base URL) or pass client="
            )
        if factory is None:
            raise ConfigError(
                "canonicalizer 'llm': no model_client_factory to reach the judge endpoint"
            )
        try:
            client = factory(endpoint=endpoint, model=options.get("model"), **client_options)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"canonicalizer 'llm': cannot build the judge client: {type(exc).__name__}: {exc}"
            ) from exc
        owns = True
    elif endpoint is not None or client_options:
        raise ConfigError("canonicalizer 'llm': give either client= or endpoint=, not both")
    return _build_llm(client, owns, options)


def _build_llm(client: Any, owns: bool, options: dict[str, Any]) -> AsyncCanonicalizer:

    try:
        return LlmCanonicalizer(client, owns_client=owns, **options)
    except TypeError as exc:
        raise ConfigError(f"canonicalizer 'llm': bad options: {exc}") from exc


def _extract_then(
    options: dict[str, Any], factory: ModelClientFactory | None
) -> AsyncCanonicalizer:
    rest = dict(options)
    then = rest.pop("then")
    then_options = rest.pop("then_options", None) or {}
    if not isinstance(then_options, Mapping):
        raise ConfigError("canonicalizer 'regex': then_options must be a mapping")
    try:  # the pattern first: a bad one must not leave a judge client behind
        extract = RegexCanonicalizer(then=_Marked(), **rest)
    except TypeError as exc:
        raise ConfigError(f"canonicalizer 'regex': bad options: {exc}") from exc
    inner = get_async_canonicalizer(then, model_client_factory=factory, **dict(then_options))
    return _ExtractThen(extract, inner)


class _Marked:
    """Returns the extract marked, so that an extract reading ``<INVALID>`` stays text."""

    name = "extract"

    def canonicalize(self, answer: str, context: QueryContext | None = None) -> str:
        return "=" + answer


class _ExtractThen:
    """A task's ``answer_pattern`` before an I/O canonicalizer (``embedding``, ``llm``):
    each answer's extract goes to ``inner``, in one call; no match is INVALID."""

    def __init__(self, extract: RegexCanonicalizer, inner: AsyncCanonicalizer) -> None:
        self._extract = extract
        self._inner = inner

    @property
    def name(self) -> str:
        return "regex"

    async def canonicalize_many(
        self, answers: Sequence[str], context: QueryContext | None = None
    ) -> list[str]:
        marked = [self._extract.canonicalize(a, context) for a in answers]
        found = [m[1:] for m in marked if m != INVALID]
        classes = iter(await self._inner.canonicalize_many(found, context) if found else [])
        return [INVALID if m == INVALID else next(classes) for m in marked]

    async def warm_up(self) -> None:
        """Prepare ``inner`` now if it can (an embedding model loads)."""
        warm = getattr(self._inner, "warm_up", None)
        if warm is not None:
            await warm()

    async def aclose(self) -> None:
        """Close ``inner`` if it has anything to close (an ``llm`` judge it owns)."""
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


class _UnbuiltClient:
    """Stands in for the judge client while the options are checked; never called."""

    circuit_state: CircuitState = "closed"

    async def sample(
        self,
        request: Mapping[str, Any],
        n: int,
        *,
        api: WireApi | None = None,
        route: Route | None = None,
    ) -> list[str]:
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        return None
