"""The client that re-asks the monitored model, in the wire API production used
(``client.py``; what each API sends and reads is ``monitor.core.apis``): retries,
circuit breaker and rate limit (``limits.py``), its keep-alive HTTP/1.1 calls
(``transport.py``), the chat-completions body of a request relmon builds itself
(``wire.py``)."""

__all__: list[str] = []
