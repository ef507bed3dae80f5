"""Text embedders, one contract and one registry for every user (see :mod:`.base`).

Built-ins, registered on import: ``ngram`` (numpy only, :mod:`.ngram`), ``minilm`` and
``sentence_transformers`` (local models, :mod:`.local`; torch is imported only when one is built) and
``openai`` (an OpenAI-compatible endpoint, :mod:`.openai_endpoint`). The task manager's dedup filter names one
with ``task_manager.dedup.embedder``, the memory service with ``embedding.backend``.
"""

from agentevolver.embedders import local, ngram, openai_endpoint  # noqa: F401 - register the built-ins
from agentevolver.embedders.base import (
    EMBEDDERS,
    Embedder,
    EmbedderFactory,
    EmbeddingFailed,
    build_embedder,
    normalise,
    register_embedder,
)
from agentevolver.embedders.ngram import normalize_text
from agentevolver.embedders.settings import DEFAULT_EMBEDDING_MODEL, EmbeddingSettings

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "EMBEDDERS",
    "Embedder",
    "EmbedderFactory",
    "EmbeddingFailed",
    "EmbeddingSettings",
    "build_embedder",
    "normalise",
    "normalize_text",
    "register_embedder",
]
