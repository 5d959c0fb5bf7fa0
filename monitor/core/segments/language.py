"""The language of a query, detected offline: the ``segments: {by: language}`` value.

The detector is `py3langid <https://pypi.org/project/py3langid/>`_ (a maintained fork of
Lui and Baldwin's langid.py: a naive Bayes model over byte n-grams, 140 language codes). It
was chosen for size and accuracy on short queries among the offline detectors on PyPI:

============================  ==========  ===========================================
package                       wheel       why not
============================  ==========  ===========================================
py3langid 0.4                 4.6 MB      chosen: numpy only (already a dependency),
                                          its model inside the wheel, deterministic;
                                          70 of 70 short queries right (en, de, fr,
                                          es, ja, zh, ru; tests/test_segments.py),
                                          about 40 µs a query
pycld2 0.42 (Google's CLD2)   9.9 MB      C extension, about 5 µs a query, but 66 of
                                          the same 70: it gives up ("un") on short
                                          Spanish, Chinese and Russian queries
lingua-language-detector 2.x  96 MB       the most accurate on short text, but a
                                          wheel twenty times larger, and its models
                                          take more memory still once loaded
langdetect 1.0                            random unless seeded (``DetectorFactory``),
                                          pure Python
fasttext lid.176                          the model (126 MB, or 917 kB compressed)
                                          is a separate download: not offline
============================  ==========  ===========================================

What :func:`detect_language` returns: the detector's code, lower case: ISO 639-1 where
the language has one (``en``, ``de``, ``zh``), else ISO 639-3 (``ace``, ``fuv``);
Cantonese and Wu count as Chinese (``zh``), Egyptian and Moroccan Arabic as Arabic
(``ar``). None where a language cannot be told, which :mod:`~monitor.core.segments.labels`
labels ``none``:

- fewer than :data:`MIN_LETTERS` (3) letters (``ok``, ``42``, ``???``, an empty query);
- a confidence under :data:`MIN_CONFIDENCE` (0.25): the detector's probabilities,
  tempered by the square root of the text's length, over its 140 languages. One or two
  Latin-script words (``thanks``, ``help``, ``Rechnung``) land here: too short to tell,
  and better ``none`` than a wrong language. Every query of the test sample is above
  0.5; ``Wie spät ist es?`` scores 0.95, ``thank you`` 0.28, ``help`` 0.04.

Only the first :data:`MAX_CHARS` (1000) characters are read, so a long prompt costs
the same as a short one (the language of a query shows in its first sentences).

The model (68 MB of arrays, about 75 MB of memory once loaded) is read from the
package's own data on first use, once per process, decompressed in memory (the
package's own loader writes a 68 MB temporary file, more than the chart's 64 MiB
``/tmp``). :func:`load_language_detector` loads it at start (about 0.7 s), so that the
first query does not pay for it. That read of a file shipped inside a package is the
only input this module does.
"""

from __future__ import annotations

import importlib.resources
import io
import lzma
import threading
from array import array
from typing import Any, Final

import numpy as np
from py3langid.langid import LanguageIdentifier  # type: ignore[import-untyped]

__all__ = [
    "DETECTOR",
    "MAX_CHARS",
    "MIN_CONFIDENCE",
    "MIN_LETTERS",
    "detect_language",
    "load_language_detector",
]

DETECTOR: Final = "py3langid"
MIN_LETTERS: Final = 3
"""Fewer letters than this (``str.isalpha``): no language."""
MIN_CONFIDENCE: Final = 0.25
"""A detection less sure than this: no language."""
MAX_CHARS: Final = 1000
"""Only this many characters of a query are read."""

_MODEL_FILE: Final = "data/model.npz.xz"
_ALIASES: Final = {"yue": "zh", "wuu": "zh", "arz": "ar", "ary": "ar", "uzs": "uz"}
_NO_LANGUAGE: Final = frozenset({"zxx"})  # "no linguistic content"
_TYPECODES: Final = {2: "H", 4: "I", 8: "L"}

_loaded: list[Any] = []
"""The identifier, once loaded (a module-level cache, one per process)."""
_lock = threading.Lock()


def _as_array(values: np.ndarray[Any, Any]) -> array[int]:
    """An unsigned integer numpy array as a stdlib array, the type the detector walks."""
    out: array[int] = array(_TYPECODES[values.dtype.itemsize])
    out.frombytes(np.ascontiguousarray(values).tobytes())
    return out


def _read_model() -> Any:
    packed = importlib.resources.files("py3langid").joinpath(_MODEL_FILE).read_bytes()
    with np.load(io.BytesIO(lzma.decompress(packed)), allow_pickle=False) as data:
        return LanguageIdentifier(
            np.asarray(data["ptc"]),
            np.asarray(data["pc"]),
            data["classes"].tolist(),
            _as_array(data["nextmove"]),
            data["out_feat"].tolist(),
            norm_probs=True,
            tk_row=_as_array(data["nextmove_row"]),
        )


def load_language_detector() -> None:
    """Load the detector's model now (once per process; later calls return at once)."""
    _identifier()


def _identifier() -> Any:
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_read_model())
    return _loaded[0]


def _has_letters(text: str, wanted: int) -> bool:
    found = 0
    for ch in text:
        if ch.isalpha():
            found += 1
            if found >= wanted:
                return True
    return False


def detect_language(text: str) -> str | None:
    """The language code of ``text``, or None where it cannot be told (see the module).
    Deterministic: the same text always gets the same answer."""
    text = text[:MAX_CHARS]
    if not _has_letters(text, MIN_LETTERS):
        return None
    code, confidence = _identifier().classify(text)
    if float(confidence) < MIN_CONFIDENCE:
        return None
    code = _ALIASES.get(str(code), str(code))
    return None if code in _NO_LANGUAGE else code
