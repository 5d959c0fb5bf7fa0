"""HTTP servers: traffic (mirror and proxy), the review API and page, /metrics."""

__all__: list[str] = []
