"""The traffic data plane: the mirror and the inline proxy on relmon's own HTTP/1.1
server (``wire.py``, ``request.py``), one proxied request (``exchange.py``, ``proxy.py``),
the mirror (``mirror.py``), from a request to an offered event (``intake.py``: which
wire API, ``messages.py``: the answer it got), the listener (``traffic.py``), its own
process (``dataplane.py``) and metrics (``proxy_metrics.py``). What each wire API's
requests and answers hold is ``monitor.core.apis``."""

__all__: list[str] = []
