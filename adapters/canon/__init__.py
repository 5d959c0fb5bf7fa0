"""Canonicalizers that need an outside system (an embedding model, an LLM judge), and
the registry that builds any canonicalizer, built-in or not, by name."""

__all__: list[str] = []
