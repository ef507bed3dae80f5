"""What the environment service is started with (the CLI builds this; tests build it directly)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from env_service.base import Isolation

__all__ = ["ServiceSettings"]


class ServiceSettings(BaseModel):
    """Everything the service is started with (the CLI builds this; tests build it directly)."""

    envs: list[str] = Field(min_length=1)
    max_instances: int = Field(default=256, ge=1)
    call_timeout_s: float = Field(default=120.0, gt=0)
    idle_timeout_s: float = Field(default=3600.0, gt=0)
    reap_interval_s: float = Field(default=60.0, gt=0)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    auth_token_env: str | None = None
    isolation: dict[str, Isolation] = Field(default_factory=dict)
    threads: int = Field(default=32, ge=1)
