"""The one embedder contract and registry: text -> L2-normalised float32 rows, by name.

Both users take their embedder from here: the task manager's near-duplicate filter
(``task_manager.dedup.embedder``) and the memory service (``embedding.backend``). One registry means one
MiniLM loader, one way to add a backend (``@register_embedder("name")``, a factory taking
:class:`~agentevolver.embedders.settings.EmbeddingSettings`), and one error for an unknown name, which names
the config key of the caller that asked.

Vectors are normalised by the embedder, once, so callers rank by inner product (= cosine similarity)
whatever the backend returns. Each embedder has an ``identity`` that the memory store records in its data
folder: opening a folder with another embedder fails at start-up instead of mixing incomparable vectors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from agentevolver.embedders.settings import EmbeddingSettings
from agentevolver.errors import AgentEvolverError
from agentevolver.registry import Registry
from agentevolver.service_errors import ServiceError

__all__ = [
    "EMBEDDERS",
    "Embedder",
    "EmbedderFactory",
    "EmbeddingFailed",
    "build_embedder",
    "normalise",
    "register_embedder",
]


class Embedder(Protocol):
    """What every user needs from an embedder."""

    #: Names the vector space (backend + model [+ size]); recorded in the memory service's data folder.
    identity: str
    #: Length of every vector.
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, each row of unit length. Raises :class:`EmbeddingFailed`."""
        ...


class EmbeddingFailed(ServiceError, AgentEvolverError):
    """The embedding backend failed (an OpenAI-compatible embeddings endpoint, usually); a service answers 502."""

    status = 502
    code = "embedding_failed"


EmbedderFactory = Callable[[EmbeddingSettings], Embedder]
#: Embedders by name: ``task_manager.dedup.embedder`` and the memory service's ``embedding.backend``.
EMBEDDERS: Registry[EmbedderFactory] = Registry("embedder")


def register_embedder(name: str) -> Callable[[EmbedderFactory], EmbedderFactory]:
    """Register a factory under ``name`` (a name taken by another is an error)."""
    return EMBEDDERS.register(name)


def build_embedder(name: str, settings: EmbeddingSettings | None = None, *, field: str | None = None) -> Embedder:
    """The embedder registered as ``name``, built with ``settings`` (defaults when None).

    ``field`` is the caller's config key, named when ``name`` is unknown.
    """
    return EMBEDDERS.get(name, field)(settings if settings is not None else EmbeddingSettings())


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), as contiguous float32."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.divide(vectors, norms, out=vectors, where=norms > 0)
    return vectors
