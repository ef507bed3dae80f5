"""Our sections' defaults cannot drift: where a pydantic model also declares a default for a key the root
config sets, both say the same (the YAML is what a run uses; the model's default is what code that builds a
model directly gets, e.g. a unit test or the rollout CLI)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from agentevolver.config import load_config
from agentevolver.config.loader import PROJECT_SECTIONS
from agentevolver.config.schema import AgentEvolverSettings

#: Keys whose model default is deliberately an empty container that the YAML fills (not a second default).
FILLED_BY_YAML = {"llm.roles"}


def _model_default(field: Any) -> Any:
    if field.default is not PydanticUndefined:
        default = field.default
    elif field.default_factory is not None:
        default = field.default_factory()
    else:
        return PydanticUndefined
    return default.model_dump(mode="json") if isinstance(default, BaseModel) else default


def _twice_defined(cls: type[BaseModel], node: dict, path: str) -> list[tuple[str, Any, Any]]:
    found = []
    for name, field in cls.model_fields.items():
        key = field.alias or name
        if key not in node:
            continue
        value, annotation = node[key], field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(value, dict):
            found += _twice_defined(annotation, value, f"{path}.{key}")
            continue
        default = _model_default(field)
        if default is not PydanticUndefined and f"{path}.{key}" not in FILLED_BY_YAML:
            found.append((f"{path}.{key}", value, default))
    return found


def test_yaml_and_model_defaults_agree() -> None:
    cfg, _ = load_config()
    twice = [entry for name in PROJECT_SECTIONS
             for entry in _twice_defined(AgentEvolverSettings.model_fields[name].annotation,
                                         OmegaConf.to_container(cfg[name], resolve=True), name)]
    assert twice, "no key has a model default: this test checks nothing"
    differ = [f"{key}: config/agentevolver.yaml says {yaml!r}, the model says {model!r}"
              for key, yaml, model in twice if yaml != model]
    assert not differ, "\n".join(differ)
