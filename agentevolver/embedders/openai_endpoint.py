"""``openai``: any OpenAI-compatible ``/v1/embeddings`` endpoint (vLLM, a hosted API, ...)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentevolver.embedders.base import EmbeddingFailed, normalise, register_embedder
from agentevolver.embedders.settings import EmbeddingSettings
from agentevolver.errors import ConfigError

__all__ = ["OpenAIEmbedder"]

logger = logging.getLogger(__name__)

#: Sent when the configured key env var is unset (local servers ignore keys; the SDK insists on one).
_PLACEHOLDER_KEY = "EMPTY"


@register_embedder("openai")
class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint (the SDK's own retries: 429, 5xx, timeouts).

    The vector size is learnt from one probe request at start-up, which also proves the endpoint and model
    name work before the service says it is healthy.
    """

    def __init__(self, settings: EmbeddingSettings) -> None:
        if not settings.base_url:  # never fall back to the SDK's default, a vendor's URL
            raise ConfigError("embedder 'openai' needs embedding.base_url (an OpenAI-compatible endpoint ending in "
                              "/v1); none is set")
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
