"""``ngram``: hashed character 3-gram counts, L2-normalised, so cosine similarity is a dot product.

It needs nothing beyond numpy, which is why it is the task manager's default (``task_manager.dedup.embedder``):
CI and the CPU quickstart must not depend on the ``memory`` extra, and for the near-duplicates the dedup
filter exists to catch (the same task reworded a little, with the same names and numbers) surface similarity
is what matters. scikit-learn's HashingVectorizer does the same, but would be a large dependency for these
few lines. ``minilm`` (:mod:`.local`) catches paraphrases with different wording, at ~100x the cost.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np

from agentevolver.embedders.base import normalise, register_embedder
from agentevolver.embedders.settings import EmbeddingSettings

__all__ = ["NgramEmbedder", "normalize_text"]

_SPACE = re.compile(r"\s+")
_EDGE_PUNCTUATION = " .,;:!?\"'`"


def normalize_text(text: str) -> str:
    """Case, runs of whitespace and surrounding punctuation do not make two tasks different.

    The n-grams are read from this form, and the task manager's exact-duplicate checks compare it, so
    "exact" and "near" duplicates are judged on the same text.
    """
    return _SPACE.sub(" ", text.lower()).strip(_EDGE_PUNCTUATION)


class NgramEmbedder:
    """Hashed character n-gram counts (see the module docstring)."""

    def __init__(self, n: int = 3, dim: int = 4096) -> None:
        self.n = n
        self.dim = dim
        self.identity = f"ngram:{n}:{dim}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            padded = f" {normalize_text(text)} "
            for start in range(max(1, len(padded) - self.n + 1)):
                gram = padded[start:start + self.n]
                out[row, zlib.crc32(gram.encode()) % self.dim] += 1.0
        return normalise(out)


@register_embedder("ngram")
def _ngram(_: EmbeddingSettings) -> NgramEmbedder:
    """The n-gram embedder reads none of the settings (they are the neural backends' knobs)."""
    return NgramEmbedder()
