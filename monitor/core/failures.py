"""What a source says about an exception nobody expected while it handled one event.

Every source catches whatever handling one event raises (docs/kafka.md, "A bad event"):
the event becomes a counted rejection whose reason is :func:`internal_error`, and the log
line says where it was raised (:func:`raised_at`). Neither quotes the exception's message,
which may hold the event's text (a ``KeyError`` names the key it missed).
"""

from __future__ import annotations

__all__ = ["internal_error", "raised_at"]


def internal_error(exc: BaseException) -> str:
    """The rejection reason for an unexpected exception: its type, never its message."""
    return f"internal error: {type(exc).__name__}"


def raised_at(exc: BaseException) -> str:
    """``file.py:line`` of the innermost frame of ``exc``'s traceback (for the log)."""
    tb = exc.__traceback__
    if tb is None:
        return "unknown"
    while tb.tb_next is not None:
        tb = tb.tb_next
    name = tb.tb_frame.f_code.co_filename.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{name}:{tb.tb_lineno}"
