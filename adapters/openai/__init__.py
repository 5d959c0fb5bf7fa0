"""The OpenAI-compatible model API client."""

__all__: list[str] = []
