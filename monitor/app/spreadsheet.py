"""CSV cells a spreadsheet or a terminal can open safely, and back (``relmon verdicts``).

Two rules, applied to every cell of a CSV export and undone, in reverse order, by the
import, so that a round trip gives back exactly the text that was exported:

1. **Controls are written visibly.** A C0 control other than TAB, LF and CR (NUL, ESC,
   BEL...), DEL and a C1 control (U+0080-U+009F, CSI among them) becomes ``\\xHH``
   (``\\x1b`` for ESC), so printing the file runs no terminal escape sequence and no
   tool stops at a NUL. A backslash that the reader would otherwise take for the start
   of such an escape (one followed by ``\\``, by ``xHH`` or by a control) is doubled;
   any other backslash is written as it is.
2. **Formulas are quoted as text** (OWASP "CSV injection"). A cell that starts with
   ``=``, ``+``, ``-``, ``@``, TAB or CR gets a leading ``'``, which spreadsheets read
   as "this is text" and do not show, unless the cell is a plain number (``-1``,
   ``+2.5``, ``-3e4``). A cell that starts with ``'`` gets one more, so that the reader
   can always drop the first ``'``.

TAB, LF and CR inside a cell are kept (the CSV writer quotes such cells).
"""

from __future__ import annotations

import re

__all__ = ["cell_from_csv", "cell_to_csv"]

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_CONTROL = "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
_ENCODE = re.compile(rf"{_CONTROL}|\\(?=\\|x[0-9A-Fa-f]{{2}}|{_CONTROL})")
_DECODE = re.compile(r"\\(\\|x[0-9A-Fa-f]{2})")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return "\\\\" if char == "\\" else f"\\x{ord(char):02x}"


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1)
    return "\\" if code == "\\" else chr(int(code[1:], 16))


def cell_to_csv(text: str) -> str:
    """``text`` as a CSV cell that runs nothing when opened (see the module)."""
    cell = _ENCODE.sub(_escape, text)
    if cell.startswith("'") or (
        cell.startswith(_FORMULA_START) and not _PLAIN_NUMBER.fullmatch(cell)
    ):
        return "'" + cell
    return cell


def cell_from_csv(cell: str) -> str:
    """The text :func:`cell_to_csv` wrote as ``cell``."""
    return _DECODE.sub(_unescape, cell.removeprefix("'"))
