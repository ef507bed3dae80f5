"""Environment profiles: the concepts of an environment (entities, their attributes, the operations on them).

An environment's API says what can be *called*; a profile says what the environment is *about*, so the
explorer knows what to try and the summariser and feasibility judge know what a sensible task looks like
(seed 000, chapter 2: profile -> explore -> summarise -> filter -> mix). Profiles are data: one JSON file
per environment, shipped under ``profiles/<env_type>.json`` or given by path in ``task_manager.env_profile``.
A file that fails validation raises :class:`ProfileError` naming the file and the bad field.

A profile may also declare that the environment's observations **prove** answers (``answers``, see
:class:`AnswerProof`): the calculator's result *is* the answer to "what is 17 * 23?". Then the task writer
must give each task's answer and its evidence, code checks the answer against what the environment
returned (:mod:`.proof`), and the ``reference`` grader scores episodes by matching that answer: no LLM
judges a synthetic task of such an environment.

With ``task_manager.writer: env`` the environment itself writes a task from an exploration (each successful
tool call a question, its observed result the answer); that is a capability of the environment service
(``task_writing``, :mod:`.env_writer`), not profile data, and the rendered tasks are proved with ``answers``.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentevolver.errors import ConfigError

__all__ = ["AnswerProof", "Attribute", "Entity", "EnvProfile", "Operation", "ProfileError", "constrained_tools",
           "load_profile", "resolve_synthetic_grader", "shipped_profiles"]


class ProfileError(ConfigError):
    """An environment profile is missing or invalid; the message names the file and the field."""


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    name: str = Field(min_length=1, pattern=r"^\S(.*\S)?$")
    description: str = Field(min_length=1)


class Attribute(_Item):
    """A property of an entity (a file's path, a quantity's unit)."""


class Operation(_Item):
    """Something the agent can do to an entity (usually one tool or action of the environment)."""


class Entity(_Item):
    """A kind of thing the environment holds (a file, a playlist, a Python program)."""

    attributes: list[Attribute] = Field(default_factory=list)
    operations: list[Operation] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> Entity:
        for kind, items in (("attributes", self.attributes), ("operations", self.operations)):
            names = [item.name for item in items]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"{kind} of entity {self.name!r} repeat the name(s) {duplicates}")
        return self


class AnswerProof(BaseModel):
    """``answers``: how this environment's observations prove a task's answer (see the module docstring).

    ``kind`` number: the answer is a number that some observation (a tool result, not the agent's own text)
    equals within ``rel_tol`` / ``abs_tol``; with ``inputs_in_query`` every number the action producing it
    was given must be stated in the task or be an earlier proved result (so the task can be solved and has
    that answer). ``kind`` text: the answer appears verbatim (case and spacing aside) in an observation.
    ``final_answer_marker`` is what precedes the agent's answer in its last message, for the grader.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    proved_by: Literal["observations"]
    kind: Literal["number", "text"] = "number"
    inputs_in_query: bool = True
    final_answer_marker: str = Field(default="FINAL ANSWER", min_length=1)
    rel_tol: float = Field(default=1e-6, ge=0.0)
    abs_tol: float = Field(default=1e-6, ge=0.0)


class EnvProfile(BaseModel):
    """The profile of one environment."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    env_type: str = Field(min_length=1)
    description: str = Field(min_length=1)
    entities: list[Entity] = Field(min_length=1)
    answers: AnswerProof | None = None
    #: What a valid argument of a tool looks like, stricter than the environment's own tool schema says
    #: (tool -> argument -> JSON Schema keywords, e.g. ``{"calculator": {"expression": {"pattern": ...}}}``).
    #: Merged into the tools a *forced* explorer is sent (``task_manager.explorer_tool_choice: required``,
    #: :func:`constrained_tools`), so the endpoint's grammar keeps a small model's strings to what the tool
    #: accepts; the explorer's instructions, and every policy, see the environment's schema unchanged.
    tool_arguments: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_entities(self) -> EnvProfile:
        names = [entity.name for entity in self.entities]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"entities repeat the name(s) {duplicates}")
        return self

    def digest_form(self) -> dict[str, Any]:
        """The profile as the generation checkpoint's digest reads it: without ``tool_arguments`` when it is
        empty, so checkpoints written before the field existed still resume."""
        data = self.model_dump(mode="json")
        if not data["tool_arguments"]:
            del data["tool_arguments"]
        return data

    def operations(self) -> list[tuple[Entity, Operation]]:
        """Every (entity, operation) pair, in file order: what a random exploration picks its focus from."""
        return [(entity, op) for entity in self.entities for op in entity.operations]

    def render(self) -> str:
        """The profile as prompt text (markdown), identical for every role that is shown it."""
        lines = [f"Environment `{self.env_type}`: {self.description}", "", "Entities:"]
        for entity in self.entities:
            lines.append(f"- {entity.name}: {entity.description}")
            if entity.attributes:
                lines.append("  attributes: " + "; ".join(f"{a.name} ({a.description})" for a in entity.attributes))
            lines.append("  operations: " + "; ".join(f"{o.name} ({o.description})" for o in entity.operations))
        return "\n".join(lines)


def constrained_tools(tools: list[dict[str, Any]], profile: EnvProfile) -> list[dict[str, Any]]:
    """``tools`` (OpenAI function tools) with the profile's ``tool_arguments`` merged into each named argument's
    schema (a copy; tools and arguments the profile does not name are unchanged)."""
    out = copy.deepcopy(tools)
    for tool in out:
        function = tool.get("function") or {}
        extra = profile.tool_arguments.get(function.get("name", ""))
        properties = (function.get("parameters") or {}).get("properties")
        if not extra or not isinstance(properties, dict):
            continue
        for argument, keywords in extra.items():
            if isinstance(properties.get(argument), dict):
                properties[argument].update(keywords)
    return out


def shipped_profiles() -> list[str]:
    """Environment names that have a profile shipped with the package."""
    folder = resources.files(__package__).joinpath("profiles")
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def load_profile(env_type: str, path: str | Path | None = None) -> EnvProfile:
    """The profile at ``path`` or, when ``path`` is None, the one shipped for ``env_type``.

    Raises :class:`ProfileError` when the file is missing, is not JSON, fails validation (naming the field,
    e.g. ``entities[1].operations``), or describes another environment.
    """
    if path is None:
        source = resources.files(__package__).joinpath("profiles").joinpath(f"{env_type}.json")
        where = f"shipped profile profiles/{env_type}.json"
        if not source.is_file():
            raise ProfileError(
                f"no profile is shipped for environment {env_type!r} (shipped: {', '.join(shipped_profiles())}); "
                "write one (docs/task_manager.md, 'Environment profiles') and set task_manager.env_profile to its path"
            )
        text = source.read_text(encoding="utf-8")
    else:
        file = Path(path).expanduser()
        where = f"profile {str(file)!r} (task_manager.env_profile)"
        if not file.is_file():
            raise ProfileError(f"{where} does not exist; give the path of a JSON profile or null for the shipped one")
        text = file.read_text(encoding="utf-8")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileError(f"{where} is not valid JSON: {err}") from err
    try:
        profile = EnvProfile.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(f"{_field_path(e['loc'])}: {e['msg']}" for e in err.errors(include_url=False))
        raise ProfileError(f"{where} is invalid: {problems}") from err
    if profile.env_type != env_type:
        raise ProfileError(f"{where}: env_type is {profile.env_type!r} but the environment is {env_type!r}; "
                           "point task_manager.env_profile at that environment's profile")
    return profile


def resolve_synthetic_grader(name: str, env_type: str, profile_path: str | Path | None = None) -> str:
    """The grader that ``task_manager.grader.synthetic_grader`` names, with ``auto`` resolved: ``reference`` when
    the environment's profile declares that observations prove answers (no LLM grades such tasks), else ``llm``.

    One place for the rule, because the task manager (what it writes into each task), the cluster check (whether
    the grader endpoint must answer) and the ablation runner (which roles a run uses) all need the same answer.
    An environment without a profile cannot prove answers, so ``auto`` is ``llm`` there.
    """
    if name != "auto":
        return name
    try:
        profile = load_profile(env_type, profile_path)
    except ProfileError:
        return "llm"
    return "reference" if profile.answers is not None else "llm"


def _field_path(loc: tuple[int | str, ...]) -> str:
    """``('entities', 1, 'operations')`` -> ``entities[1].operations``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"
