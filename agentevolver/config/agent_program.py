"""The ``agent_program`` config section: train an agent program of your own through the gateway
(:mod:`agentevolver.gateway`).

Defined and documented in config/agentevolver.yaml; this model checks it once at start-up, with errors that
name the key. ``callable`` or ``command`` set = every episode of the run is the program, not the agent flow.
"""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["AgentProgramConfig"]


class AgentProgramConfig(BaseModel):
    """``agent_program`` (see config/agentevolver.yaml for each key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    callable: str | None = None
    command: list[str] | None = None
    reward: Literal["program", "env"] = "program"
    timeout_s: float = Field(default=300.0, gt=0)
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=0, ge=0, le=65535)

    @field_validator("callable")
    @classmethod
    def _module_and_name(cls, value: str | None) -> str | None:
        if value is not None:
            module, _, name = value.partition(":")
            if not module or not name:
                raise ValueError(f"must be 'package.module:function'; got {value!r}")
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        """A string is split as a shell would (no shell runs it); a list is taken as the argv."""
        if isinstance(value, str):
            value = shlex.split(value)
            if not value:
                raise ValueError("is an empty command; give the program and its arguments, or null")
        return value

    @model_validator(mode="after")
    def _one_program(self) -> AgentProgramConfig:
        if self.callable is not None and self.command is not None:
            raise ValueError("set agent_program.callable or agent_program.command, not both")
        if self.command is not None and not self.command:
            raise ValueError("agent_program.command is an empty list; give the program and its arguments")
        return self

    @property
    def enabled(self) -> bool:
        """True when the run's episodes are an agent program's."""
        return self.callable is not None or self.command is not None
