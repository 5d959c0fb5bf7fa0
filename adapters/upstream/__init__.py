"""HTTP/1.1 client connections to the servers relmon calls, on raw asyncio protocols
parsed by httptools: the proxy's upstream (:mod:`adapters.traffic`) and the monitored
model's OpenAI-compatible endpoint (:mod:`adapters.model`) share :mod:`.pool`."""

__all__: list[str] = []
