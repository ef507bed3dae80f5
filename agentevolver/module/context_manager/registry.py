"""Context managers by name: ``@register_context_manager("linear")`` and :func:`make_context_manager`.

The config names the manager (``agent_flow.context_template``); adding one is a decorated subclass, no edit
elsewhere (verl's ``register_policy_loss`` pattern).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from agentevolver.module.context_manager.base import ContextManager
from agentevolver.module.context_manager.config import ContextManagerConfig
from agentevolver.registry import Registry

__all__ = [
    "CONTEXT_MANAGERS",
    "context_manager_names",
    "get_context_manager",
    "make_context_manager",
    "register_context_manager",
]

#: Context managers by name (``agent_flow.context_template``).
CONTEXT_MANAGERS: Registry[type[ContextManager]] = Registry("context manager", "agent_flow.context_template")
_T = TypeVar("_T", bound=type[ContextManager])


def register_context_manager(name: str) -> Callable[[_T], _T]:
    """Class decorator: make ``cls`` selectable as ``name``; a name taken by another class is an error."""

    def decorate(cls: _T) -> _T:
        if not (isinstance(cls, type) and issubclass(cls, ContextManager)):
            raise TypeError(f"{cls!r} must subclass ContextManager to be registered")
        CONTEXT_MANAGERS.add(name, cls)
        cls.name = name
        return cls

    return decorate


def context_manager_names() -> list[str]:
    """Registered names, sorted."""
    return CONTEXT_MANAGERS.names()


def get_context_manager(name: str) -> type[ContextManager]:
    """The class registered as ``name``; :class:`~agentevolver.errors.UnknownNameError` listing the names."""
    return CONTEXT_MANAGERS.get(name)


def make_context_manager(
    name: str,
    tokenizer: Any,
    config: ContextManagerConfig | Mapping[str, Any] | None = None,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    llm: Any = None,
) -> ContextManager:
    """A fresh manager for one episode (managers hold per-episode state; never share one across episodes).

    ``tools`` are the OpenAI tool schemas the chat template lists in the system turn; ``llm`` is the LLM
    role object (``chat(messages) -> result.text``) of managers that need one (``self_clip``).
    """
    return get_context_manager(name)(tokenizer, config, tools=tools, llm=llm)
