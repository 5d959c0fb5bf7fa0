"""The wire APIs relmon watches and re-asks in: one module per API behind one port
(:class:`~monitor.core.apis.base.WireApi`), found by name in :mod:`.registry`."""

from monitor.core.apis.base import Route, WireApi
from monitor.core.apis.registry import API_NAMES, DEFAULT_API, GENERIC, api_for_path, get_api

__all__ = ["API_NAMES", "DEFAULT_API", "GENERIC", "Route", "WireApi", "api_for_path", "get_api"]
