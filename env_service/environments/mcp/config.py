"""The ``mcp`` environment's configuration: which MCP servers, how to start them, where the tasks are.

One YAML or JSON file, named by the environment variable ``AGENTEVOLVER_MCP_CONFIG`` of the env service
(the service's CLI takes no environment-specific flags, and every instance process - ``--isolation
mcp=process`` - inherits the variable, so all of them read the same file). Every key is documented on its
field below and in docs/env_mcp.md; a bad file is one error naming the key and the fix, never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from env_service.environments.mcp.demonstrations import DemonstrationConfig
from env_service.errors import EnvUnavailable

#: The environment variable holding the config file's path.
CONFIG_ENV = "AGENTEVOLVER_MCP_CONFIG"

#: What the official SDK always passes to a stdio server (``mcp.client.stdio.get_default_environment``):
#: harmless names a program needs to run at all. Nothing else of the service's environment is passed unless
#: ``inherit_env`` lists it.
SDK_SAFE_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")


class ServerConfig(BaseModel):
    """One MCP server: started by a stdio ``command`` or reached at a streamable-HTTP ``url``."""

    model_config = ConfigDict(extra="forbid")

    #: Name used in errors, in tool-name prefixes and in a task's ``servers`` list.
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]+$")
    #: stdio: the program and its arguments, e.g. ``[mcp-server-time]``. ``{instance_dir}`` in an argument is
    #: a fresh temporary folder per server (per instance with ``scope: instance``), removed when it stops.
    command: list[str] | None = None
    #: streamable HTTP: the endpoint, e.g. ``http://127.0.0.1:9000/mcp``. Only this URL is ever contacted.
    url: str | None = None
    #: HTTP headers sent to ``url`` (e.g. an Authorization header).
    headers: dict[str, str] = Field(default_factory=dict)
    #: Environment variables set for a stdio server (values given here).
    env: dict[str, str] = Field(default_factory=dict)
    #: Names of the service's own environment variables passed through to a stdio server. Nothing else is
    #: inherited, except the SDK's harmless set (HOME, LOGNAME, PATH, SHELL, TERM, USER).
    inherit_env: list[str] = Field(default_factory=list)
    #: Working directory of a stdio server (default: the service's).
    cwd: str | None = None
    #: ``shared``: one server for the whole service (stateless servers: time, a read-only database);
    #: ``instance``: one server per environment instance, stopped with it (stateful servers).
    scope: Literal["shared", "instance"] = "shared"
    #: Seconds one tool call may take; past it the call is answered with a timeout error and the server,
    #: which may be wedged, is restarted.
    call_timeout_s: float = Field(default=30.0, gt=0)
    #: Seconds the server may take to start and answer ``initialize`` + ``list_tools``.
    start_timeout_s: float = Field(default=30.0, gt=0)
    #: A tool result longer than this many characters is cut, with a note saying how much was cut.
    max_result_chars: int = Field(default=8000, ge=100)
    #: Tool-name prefix when a name collides with another server's tool (default ``<name>__``).
    prefix: str | None = None

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"server {self.name!r}: give exactly one of command (stdio) or url (streamable HTTP)")
        if self.command is not None and not self.command:
            raise ValueError(f"server {self.name!r}: command is empty; e.g. command: [mcp-server-time]")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"server {self.name!r}: url must be http:// or https://; got {self.url!r}")
        if self.url is not None and self.scope == "instance":
            raise ValueError(f"server {self.name!r}: scope instance needs a command (a URL names one running "
                             "server); use scope: shared")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    @property
    def tool_prefix(self) -> str:
        return self.prefix if self.prefix is not None else f"{self.name}__"

    def argv(self) -> list[str]:
        """``command`` with its program resolved (see :func:`resolve_program`)."""
        command = list(self.command or [])
        return [resolve_program(command[0]) or command[0], *command[1:]]

    def stdio_env(self) -> dict[str, str]:
        """The variables given to a stdio server besides the SDK's safe set: listed ones, then ``env``."""
        passed = {name: os.environ[name] for name in self.inherit_env if name in os.environ}
        return {**passed, **self.env}


class McpConfig(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid")

    #: The MCP servers; their tools together are the episode's tools.
    servers: list[ServerConfig] = Field(min_length=1)
    #: JSONL task file (one task a line: query, optional answer, checker, split, id, servers); relative paths
    #: are relative to this config file. None: one exploration seed per tool, for Self-Questioning.
    tasks: str | None = None
    #: Agent turns per episode before it ends regardless.
    max_steps: int = Field(default=8, ge=1, le=100)
    #: What precedes the agent's answer in its last message (the whole message counts when it is absent).
    final_answer_marker: str = "FINAL ANSWER"
    #: System prompt of every episode (default: docs/env_mcp.md, "Episodes").
    system_prompt: str | None = None
    #: Worked examples shown before every task's question, each made at start-up by calling the named tool for
    #: real (a small policy calls tools it has seen called): a tool name, or ``{tool, arguments?, question?,
    #: answer?}``; arguments default to values from the tool's input schema (docs/env_mcp.md, "Demonstrations").
    #: Name only tools that are safe to call once with such arguments. Empty: the opening has none.
    demonstrations: list[DemonstrationConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> McpConfig:
        names = [server.name for server in self.servers]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"servers repeat the name(s) {repeated}; give each server its own name")
        return self


def resolve_program(program: str) -> str | None:
    """The full path of ``program``: as given, on PATH, or next to the service's Python (servers installed
    in the service's own virtualenv, whose ``bin/`` need not be on PATH); None when it is nowhere."""
    if Path(program).is_file():
        return program
    return shutil.which(program) or shutil.which(program, path=str(Path(sys.executable).parent))


def _field(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_config(raw: object, where: str) -> McpConfig:
    """Validate ``raw``; an error names ``where`` and each bad key (``servers[1].command: ...``)."""
    try:
        config = McpConfig.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(f"{_field(e['loc']) or 'config'}: {e['msg'].removeprefix('Value error, ')}"
                             for e in err.errors(include_url=False))
        raise EnvUnavailable(f"{where} is invalid: {problems}", field="env_type") from err
    for index, server in enumerate(config.servers):
        if server.command is not None and resolve_program(server.command[0]) is None:
            raise EnvUnavailable(
                f"{where}: servers[{index}].command: program {server.command[0]!r} of server {server.name!r} is "
                f"not found on PATH; install it (e.g. pip install {server.command[0]}) or give its full path",
                field="env_type")
    return config


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[McpConfig, Path]:
    file = Path(path).expanduser()
    where = f"MCP config {str(file)!r} ({CONFIG_ENV})"
    if not file.is_file():
        raise EnvUnavailable(f"{where} does not exist; point {CONFIG_ENV} at a YAML file listing servers "
                             "(docs/env_mcp.md)", field="env_type")
    text = file.read_text(encoding="utf-8")
    try:
        raw = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise EnvUnavailable(f"{where} cannot be read: {err}", field="env_type") from err
    return parse_config(raw, where), file.resolve().parent


def load_config() -> tuple[McpConfig, Path]:
    """The service's config and the folder it is in (task paths are relative to it); cached per path."""
    path = os.environ.get(CONFIG_ENV)
    if not path:
        raise EnvUnavailable(f"the mcp environment needs a config: set {CONFIG_ENV}=servers.yaml (a YAML file "
                             "with servers: [{name, command | url, ...}]; docs/env_mcp.md)", field="env_type")
    return _load(path)
