"""Typed model of the ``llm:`` config section (named OpenAI-compatible endpoints + role routing).

The Hydra config is checked against these models once at start-up, so a typo in an endpoint (a negative
timeout, a base URL without a scheme, a role pointing at an endpoint that does not exist) fails before any
training step runs, with a message that names the offending key. No defaults for ``base_url`` or ``model``
live here on purpose: which server and model to talk to is a deployment decision that belongs in the YAML.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentevolver.errors import ConfigError

__all__ = ["LLMConfig", "LLMEndpointConfig"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class LLMEndpointConfig(BaseModel):
    """One OpenAI-compatible endpoint (vLLM, a hosted API, or the local CPU server): ``llm.endpoints.<name>``.

    Frozen so that a client built from it cannot drift from what was validated and logged.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(
        description="OpenAI-compatible base URL, usually ending in /v1 (must start with http:// or https://)."
    )
    model: str = Field(min_length=1, description="Model name sent in the `model` field of each request.")
    api_key_env: str | None = Field(
        default="AGENTEVOLVER_LLM_API_KEY",
        description=(
            "NAME of the environment variable holding the API key (not the key itself). If the variable is "
            "unset (or this is null) a placeholder key is sent; local servers need none."
        ),
    )
    timeout_s: float = Field(default=60.0, gt=0, description="Per-request timeout in seconds (> 0).")
    max_retries: int = Field(
        default=3,
        ge=0,
        description="Retries after the first attempt for timeouts, connection errors, 429 and 5xx (>= 0).",
    )
    backoff_initial_s: float = Field(
        default=0.5,
        ge=0,
        description="Upper bound of the first (full-jitter) backoff delay in seconds; doubles each retry (>= 0).",
    )
    backoff_max_s: float = Field(
        default=20.0, ge=0, description="Cap on one backoff delay in seconds (>= backoff_initial_s)."
    )
    max_concurrency: int = Field(
        default=8, ge=1, description="Maximum requests in flight at once through one client (>= 1)."
    )
    temperature: float = Field(default=0.0, ge=0, description="Default sampling temperature (>= 0).")
    max_tokens: int = Field(
        default=1024, ge=1, description="Default cap on generated tokens per request (>= 1)."
    )
    structured_output: Literal["auto", "json_schema", "json_object", "off"] = Field(
        default="auto",
        description=(
            "How roles ask this endpoint for JSON replies (agentevolver.client.structured_output): auto = send "
            "response_format json_schema and fall back to free text for good after the server refuses it; "
            "json_schema / json_object = always send that format; off = never (free text, parsed and re-asked)."
        ),
    )

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        """Reject URLs the SDK would otherwise turn into confusing connection errors at first use."""
        value = value.strip()
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"base_url must start with http:// or https:// and name a host (got {value!r}); "
                "e.g. http://HOST:PORT/v1"
            )
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _check_api_key_env(cls, value: str | None) -> str | None:
        """Catch the common mistake of pasting the key itself here (it would end up in logs and configs)."""
        if value is None:
            return None
        if not _ENV_NAME.match(value):
            raise ValueError(
                "api_key_env must be the NAME of an environment variable (letters, digits, underscore), "
                "not the key itself; export the key in that variable"
            )
        return value

    @model_validator(mode="after")
    def _check_backoff(self) -> LLMEndpointConfig:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(
                f"backoff_max_s ({self.backoff_max_s}) must be >= backoff_initial_s ({self.backoff_initial_s})"
            )
        return self


class LLMConfig(BaseModel):
    """The whole ``llm:`` section: named endpoints, and which endpoint each LLM role uses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: dict[str, LLMEndpointConfig] = Field(
        min_length=1, description="Named OpenAI-compatible endpoints; roles refer to them by name."
    )
    roles: dict[str, str] = Field(
        default_factory=dict,
        description="Role name (judge, task_explorer, ...) -> endpoint name under llm.endpoints.",
    )

    @model_validator(mode="after")
    def _check_roles(self) -> LLMConfig:
        """Fail at start-up, not at the first judge call hours into a run, when a role names no endpoint."""
        known = ", ".join(sorted(self.endpoints))
        for role, endpoint in self.roles.items():
            if endpoint not in self.endpoints:
                raise ValueError(
                    f"llm.roles.{role} = {endpoint!r} names no endpoint; known endpoints: {known} "
                    f"(define llm.endpoints.{endpoint} or point the role at one of these)"
                )
        return self

    def endpoint_for(self, role: str) -> tuple[str, LLMEndpointConfig]:
        """Return ``(endpoint_name, endpoint)`` for a role; :class:`ConfigError` names the role if unknown."""
        if role not in self.roles:
            known = ", ".join(sorted(self.roles)) or "(none)"
            raise ConfigError(
                f"unknown LLM role {role!r}: llm.roles has no entry for it; known roles: {known}. "
                f"Add `llm.roles.{role}: <endpoint name>` to the config."
            )
        name = self.roles[role]
        return name, self.endpoints[name]
