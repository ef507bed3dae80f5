"""The memory service's own configuration: a YAML file (``--config``) and CLI flags, checked once at start-up.

The service is its own process (often on another machine than the trainer), so it does not read the
trainer's Hydra config. Its ``llm:`` section has the same shape as the trainer's (named endpoints + role
routing, :class:`~agentevolver.client.llm_config.LLMConfig`), so a launcher can hand it the trainer's
section verbatim; the summariser is the ``exp_summarizer`` role there. Every key is documented in
docs/memory_service.md; a typo fails start-up with a message naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentevolver.client.llm_config import LLMConfig
from agentevolver.embedders.settings import EmbeddingSettings
from agentevolver.errors import ConfigError
from agentevolver.paths import cache_dir

__all__ = [
    "MemoryServiceSettings",
    "RetrieveSettings",
    "StoreSettings",
    "SummarySettings",
    "format_validation_error",
    "load_settings",
]


class StoreSettings(BaseModel):
    """Where vectors and memories live (``store:``); backends register in :mod:`.store`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = Field(
        default="faiss",
        description="faiss = exact inner-product search (faiss) over vectors kept in SQLite in data_dir.",
    )
    search_threads: int = Field(
        default=1,
        ge=1,
        description="faiss: OpenMP threads per search. One query is a memory-bound scan, and extra threads "
        "busy-wait: on a loaded 2-core machine 2 threads were 4-100x slower than 1 (docs/memory_service.md).",
    )


class SummarySettings(BaseModel):
    """How episodes become experiences (``summary:``); ReMe's defaults where it has one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    success_threshold: float = Field(
        default=1.0, description="An episode with score >= this is a success; below, a failure."
    )
    validation_threshold: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Keep a candidate experience only if the LLM validator scores it >= this (0..1); "
        "0 skips validation (no LLM call).",
    )
    dedup_threshold: float | None = Field(
        default=0.95,
        gt=0.0,
        le=1.0,
        description="Do not store an experience whose when_to_use has cosine similarity >= this with one "
        "already in the workspace (or earlier in the same request); null disables.",
    )
    max_successes_per_task: int = Field(
        default=2, ge=0, description="Successful episodes of one task sent to success extraction."
    )
    max_failures_per_task: int = Field(
        default=2, ge=0, description="Failed episodes of one task sent to failure extraction."
    )
    enable_comparison: bool = Field(
        default=True, description="Compare the best and the worst episode of a task (success vs failure)."
    )
    soft_comparison_gap: float | None = Field(
        default=0.3,
        gt=0.0,
        description="Also compare best vs worst when both are successes or both failures but their scores "
        "differ by at least this; null = only success vs failure.",
    )
    max_experiences_per_reply: int = Field(
        default=3, ge=1, description="Experiences the LLM may return per extraction (extra ones are dropped)."
    )
    max_trajectory_chars: int = Field(
        default=12000, ge=500, description="An episode is cut to this many characters in a prompt."
    )
    max_message_chars: int = Field(
        default=2000, ge=100, description="One message is cut to this many characters in a prompt."
    )


class RetrieveSettings(BaseModel):
    """How a query becomes an answer (``retrieve:``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    top_k: int = Field(default=3, ge=1, description="Experiences returned when a request sends no top_k.")
    max_top_k: int = Field(default=50, ge=1, description="Largest top_k a request may ask for.")
    recall_multiplier: int = Field(
        default=3, ge=1, description="With LLM rerank, recall top_k * this candidates for the LLM to order."
    )
    enable_llm_rerank: bool = Field(default=False, description="Let the LLM reorder the recalled candidates.")
    enable_llm_rewrite: bool = Field(
        default=False, description="Let the LLM rewrite the retrieved experiences into advice for the query."
    )
    min_similarity: float | None = Field(
        default=None, ge=-1.0, le=1.0, description="Drop candidates less similar than this (cosine); null = keep."
    )
    query_cache_size: int = Field(
        default=4096, ge=0,
        description="Query embeddings kept (least recently used dropped); 0 = embed every query. The rollout.n "
        "episodes of a GRPO group ask with the same task text, so all but the first skip the embedding, the "
        "largest part of a retrieval (docs/benchmarks.md).",
    )

    @model_validator(mode="after")
    def _check_top_k(self) -> RetrieveSettings:
        if self.top_k > self.max_top_k:
            raise ValueError(f"retrieve.top_k ({self.top_k}) must be <= retrieve.max_top_k ({self.max_top_k})")
        return self


class MemoryServiceSettings(BaseModel):
    """Everything the service is started with (the CLI builds this from --config and flags)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_dir: Path = Field(
        default_factory=lambda: cache_dir() / "memory",
        description="Folder of the persistent store (SQLite + vectors); survives restarts.",
    )
    host: str = Field(default="127.0.0.1", description="Bind address (127.0.0.1 = this machine only).")
    port: int = Field(default=8001, ge=0, le=65535)
    llm: LLMConfig | None = Field(
        default=None,
        description="Same shape as the trainer's llm section; null = no LLM (summary answers 503).",
    )
    summarizer_role: str = Field(default="exp_summarizer", description="llm.roles entry that summarises.")
    reranker_role: str = Field(
        default="exp_summarizer", description="llm.roles entry that reranks/rewrites retrievals."
    )
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    summary: SummarySettings = Field(default_factory=SummarySettings)
    retrieve: RetrieveSettings = Field(default_factory=RetrieveSettings)
    auth_token_env: str | None = Field(
        default=None, description="NAME of an env var holding a bearer token every route but /healthz needs."
    )
    max_body_bytes: int = Field(default=64 * 2**20, ge=1024, description="Largest request body accepted.")
    io_root: Path | None = Field(
        default=None,
        description="If set, /vector_store dump/load paths must lie inside this folder; null = any path "
        "the service can read/write (like ReMe).",
    )

    @field_validator("data_dir", "io_root")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @model_validator(mode="after")
    def _check_roles(self) -> MemoryServiceSettings:
        """Fail at start-up, not at the first summary request, when the LLM routing cannot work."""
        if self.llm is not None:
            for key in ("summarizer_role", "reranker_role"):
                role = getattr(self, key)
                if role not in self.llm.roles:
                    known = ", ".join(sorted(self.llm.roles)) or "(none)"
                    raise ValueError(
                        f"{key} = {role!r} is not in llm.roles (known: {known}); add llm.roles.{role}: "
                        "<endpoint name> or point it at an existing role"
                    )
        elif self.retrieve.enable_llm_rerank or self.retrieve.enable_llm_rewrite:
            raise ValueError(
                "retrieve.enable_llm_rerank/enable_llm_rewrite need an LLM: add an llm section to the "
                "config or pass --llm-base-url and --llm-model"
            )
        return self


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One line per problem, each naming the dotted key: what a user needs to fix a config file."""
    lines = []
    for problem in err.errors():
        key = ".".join(str(part) for part in problem.get("loc", ()))
        message = str(problem.get("msg", "invalid value")).removeprefix("Value error, ")
        if problem.get("type") == "extra_forbidden":
            message = "unknown key (check its spelling; docs/memory_service.md lists every key)"
        lines.append(f"{prefix}{key or '(top level)'}: {message}")
    return "\n".join(lines)


def _set_dotted(target: dict[str, Any], dotted: str, value: Any) -> None:
    node = target
    *parents, leaf = dotted.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[leaf] = value


def load_settings(config_path: Path | None = None, overrides: dict[str, Any] | None = None,
                  llm_endpoint: dict[str, Any] | None = None) -> MemoryServiceSettings:
    """Read the YAML file (if any), apply ``overrides`` (dotted keys, e.g. from CLI flags), validate.

    ``llm_endpoint`` (the CLI's ``--llm-*`` flags) replaces the file's ``llm`` section with that one
    endpoint, serving both the summariser and the reranker role. Raises :class:`ConfigError` whose message
    names each bad key.
    """
    raw: dict[str, Any] = {}
    if config_path is not None:
        try:
            loaded = yaml.safe_load(Path(config_path).read_text())
        except OSError as err:
            raise ConfigError(f"memory service config {config_path}: cannot read it ({err})") from err
        except yaml.YAMLError as err:
            raise ConfigError(f"memory service config {config_path}: not valid YAML ({err})") from err
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"memory service config {config_path}: the top level must be a mapping of keys")
        raw = loaded or {}
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    if llm_endpoint is not None:
        roles = {str(raw.get(key) or "exp_summarizer"): "cli" for key in ("summarizer_role", "reranker_role")}
        raw["llm"] = {"endpoints": {"cli": llm_endpoint}, "roles": roles}
    try:
        return MemoryServiceSettings.model_validate(raw)
    except ValidationError as err:
        source = f" ({config_path})" if config_path else ""
        raise ConfigError(f"memory service config{source} is invalid:\n{format_validation_error(err)}") from err
