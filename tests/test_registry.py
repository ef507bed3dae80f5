"""The one registry type (agentevolver.registry) and every registry of the project built on it.

Each pluggable piece (context managers, tool parsers, tools, task-manager strategies/filters/graders/
mixtures, embedders (one registry for the task manager and the memory service), memory stores, environments) keeps a :class:`Registry`; the matrix below
checks, through each module's public functions, that an unknown name and a second object under a taken
name fail with the same error types and message shapes everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import env_service.environments.calc  # noqa: F401  (registers "calc")
from agentevolver.embedders import EMBEDDERS, build_embedder
from agentevolver.errors import AgentEvolverError, ConfigError, DuplicateNameError, UnknownNameError
from agentevolver.memory_service import store as memory_store
from agentevolver.module import task_manager
from agentevolver.module.context_manager import (
    CONTEXT_MANAGERS,
    ContextManager,
    get_context_manager,
    register_context_manager,
)
from agentevolver.module.tools import ToolRegistry
from agentevolver.module.tools.parsing import PARSERS, ToolCallParser, get_parser, register_parser
from agentevolver.registry import Registry, qualified_name
from env_service.base import BaseEnv
from env_service.registry import ENVIRONMENTS, register_env

# ------------------------------------------------------------------------------------- the generic class


class Widget:
    """A stand-in for a registered class."""


class OtherWidget:
    """A second class, to collide with the first."""


def test_decorator_returns_the_object_and_lookups_find_it() -> None:
    widgets: Registry[type[Widget]] = Registry("widget", "app.widget")

    @widgets.register("plain")
    class Plain(Widget):
        pass

    assert isinstance(Plain, type) and issubclass(Plain, Widget)  # the decorator hands the class back
    assert widgets.add("second", Widget) is Widget
    assert widgets.get("plain") is Plain and widgets.create("second").__class__ is Widget
    assert "plain" in widgets and "nope" not in widgets and 3 not in widgets
    assert widgets.names() == ["plain", "second"] and list(widgets) == ["plain", "second"] and len(widgets) == 2
    assert widgets.items() == [("plain", Plain), ("second", Widget)]


def test_unknown_name_is_one_error_that_lists_the_names() -> None:
    widgets: Registry[type] = Registry("widget", "app.widget")
    widgets.add("zeta", Widget)
    widgets.add("alpha", OtherWidget)
    with pytest.raises(UnknownNameError) as err:
        widgets.get("gamma")
    assert str(err.value) == "app.widget: unknown widget 'gamma'; registered: alpha, zeta"
    # One type that every old caller still catches: the project's ConfigError and a plain KeyError.
    assert all(isinstance(err.value, kind) for kind in (ConfigError, KeyError, ValueError, AgentEvolverError))
    with pytest.raises(UnknownNameError, match=r"^app\.items\[2\]: unknown widget 'gamma'"):
        widgets.check("gamma", "app.items[2]")  # a caller may name a more precise key
    with pytest.raises(UnknownNameError, match=r"unknown widget \['alpha'\]"):
        widgets.get(["alpha"])  # type: ignore[arg-type]  (an unhashable config value is an unknown name too)
    assert widgets.check("alpha") == "alpha"
    empty: Registry[Any] = Registry("gadget")
    with pytest.raises(UnknownNameError, match=r"^unknown gadget 'x'; registered: \(none\)$"):
        empty.get("x")


def test_a_second_object_under_a_taken_name_is_refused_naming_both() -> None:
    widgets: Registry[type] = Registry("widget", "app.widget")
    widgets.add("main", Widget)
    with pytest.raises(DuplicateNameError) as err:
        widgets.register("main")(OtherWidget)
    assert str(err.value) == (
        f"widget 'main' is already registered by {qualified_name(Widget)}; refusing {qualified_name(OtherWidget)} "
        "under the same name: pick another name"
    )
    assert isinstance(err.value, ConfigError) and widgets.get("main") is Widget  # nothing was replaced


def test_the_same_object_again_is_a_no_op_and_remove_allows_a_new_version() -> None:
    """A module imported twice registers the same object twice (fine); a reloaded module defines new objects,
    so it removes its names first, the route ToolRegistry.remove always offered."""
    widgets: Registry[type] = Registry("widget")
    widgets.add("main", Widget)
    assert widgets.register("main")(Widget) is Widget and widgets.names() == ["main"]
    widgets.remove("main")
    widgets.remove("never_registered")
    widgets.add("main", OtherWidget)
    assert widgets.get("main") is OtherWidget


def test_names_must_be_non_empty_strings() -> None:
    widgets: Registry[type] = Registry("widget")
    for bad in ("", None, 3):
        with pytest.raises(ConfigError, match="widget names must be non-empty strings"):
            widgets.add(bad, Widget)  # type: ignore[arg-type]


def test_describe_and_hint_customise_the_duplicate_message() -> None:
    labels: Registry[str] = Registry("label", describe=lambda text: f"<{text}>", hint="rename one")
    labels.add("a", "first")
    with pytest.raises(DuplicateNameError, match=r"^label 'a' is already registered by <first>; refusing <second> "
                                                 r"under the same name: rename one$"):
        labels.add("a", "second")


# ------------------------------------------------------------------------------ every registry of the project


@dataclass(frozen=True)
class Case:
    """One real registry, reached through its module's public functions."""

    registry: Registry[Any]
    #: Prefix of the unknown-name error: "<field>: unknown <what>" (or "unknown <what>" with no field).
    unknown_prefix: str
    lookup: Callable[[str], object]
    #: Registers a new object under ``name`` the way a plugin would.
    register: Callable[[str], object]


def _tool_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.function
    def echo(text: str) -> str:
        """Echo the text.

        Args:
            text: What to echo.
        """
        return text

    return registry


def _echo_again(text: str) -> str:
    """A second tool that wants the name 'echo'.

    Args:
        text: What to echo.
    """
    return text


def _factory_case(registry: Registry[Any], prefix: str) -> Case:
    """A task-manager or memory-service registry: plugins register a class, callers ``create``/``get``."""
    return Case(registry, prefix, registry.get, lambda name: registry.register(name)(type("Other", (), {})))


TOOLS = _tool_registry()

CASES: dict[str, Case] = {
    "context manager": Case(
        CONTEXT_MANAGERS, "agent_flow.context_template: unknown context manager", get_context_manager,
        lambda name: register_context_manager(name)(type("Other", (ContextManager,), {})),
    ),
    "tool parser": Case(
        PARSERS, "tool_parser: unknown tool parser", get_parser,
        lambda name: register_parser(name)(type("Other", (ToolCallParser,), {})),
    ),
    "tool": Case(
        TOOLS._tools, "unknown tool", TOOLS.get,
        lambda name: TOOLS.function(_echo_again, name=name),
    ),
    "exploration strategy": _factory_case(
        task_manager.EXPLORATION_STRATEGIES, "task_manager.strategy: unknown exploration strategy"
    ),
    "real-time filter": _factory_case(
        task_manager.REALTIME_FILTERS, "task_manager.realtime_filters: unknown real-time filter"
    ),
    "post filter": _factory_case(task_manager.POST_FILTERS, "task_manager.post_filters: unknown post filter"),
    "grader": _factory_case(task_manager.GRADERS, "task_manager.grader.synthetic_grader: unknown grader"),
    "mixture strategy": _factory_case(
        task_manager.MIXTURES, "task_manager.mixture.strategy: unknown mixture strategy"
    ),
    "task embedder": Case(
        EMBEDDERS, "task_manager.dedup.embedder: unknown embedder",
        lambda name: build_embedder(name, field="task_manager.dedup.embedder"),
        lambda name: EMBEDDERS.register(name)(type("Other", (), {})),
    ),
    "memory embedding backend": Case(
        EMBEDDERS, "embedding.backend: unknown embedder", lambda name: build_embedder(name, field="embedding.backend"),
        lambda name: EMBEDDERS.register(name)(type("Other", (), {})),
    ),
    "memory vector store": Case(
        memory_store.STORES, "store.backend: unknown vector store",
        lambda name: memory_store.open_store(memory_store.StoreSettings(backend=name), None, "", 0),  # type: ignore[arg-type]
        lambda name: memory_store.register_store(name)(type("Other", (), {})),
    ),
    "environment": Case(
        ENVIRONMENTS, "env_type: unknown environment", ENVIRONMENTS.get,
        lambda name: register_env(name)(type("Other", (BaseEnv,), {})),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_every_registry_fails_the_same_way_on_an_unknown_name(case: Case) -> None:
    assert case.registry.names(), "the built-ins register on import"
    with pytest.raises(UnknownNameError) as err:
        case.lookup("no_such_entry")
    assert str(err.value) == (
        f"{case.unknown_prefix} 'no_such_entry'; registered: {', '.join(case.registry.names())}"
    )


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_every_registry_refuses_a_second_object_under_a_taken_name(case: Case) -> None:
    name, existing = case.registry.items()[0]
    before = case.registry.items()
    with pytest.raises(DuplicateNameError) as err:
        case.register(name)
    what = case.unknown_prefix.rsplit("unknown ", 1)[1]
    assert re.fullmatch(
        rf"{re.escape(what)} '{re.escape(name)}' is already registered by \S+; refusing \S+ under the same name: .+",
        str(err.value),
    ), str(err.value)
    assert case.registry.describe(existing) in str(err.value)
    assert case.registry.items() == before  # the registry is unchanged
