"""The catalogue of tools by name, and the decorators that fill it.

``@function_tool`` and ``@class_tool`` register into the process-wide :func:`default_registry` (so a config
can list plugin modules whose import registers their tools), or into the registry passed as ``registry=``
(tests, and programs that keep several catalogues). Each catalogue is an :class:`agentevolver.registry.Registry`:
a name can be registered once, and a second tool under the same name is a
:class:`~agentevolver.errors.DuplicateNameError` at registration, whatever its kind (verl lets YAML tools
overwrite one another and keeps both schemas in the prompt, seed 001 section 4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, overload

from agentevolver.errors import ConfigError
from agentevolver.module.tools.class_tool import ClassTool, ClassToolFactory
from agentevolver.module.tools.entry import ToolEntry
from agentevolver.module.tools.function_tool import FunctionTool
from agentevolver.module.tools.selection import validate_tool_selection
from agentevolver.module.tools.toolset import ToolSet
from agentevolver.module.tools.truncation import TruncateSide
from agentevolver.registry import Registry

__all__ = ["ToolRegistry", "class_tool", "default_registry", "function_tool"]

ToolLike = ToolEntry | type[ClassTool] | Callable[..., Any]
_ClassT = TypeVar("_ClassT", bound=type[ClassTool])


def as_entry(tool: ToolLike) -> ToolEntry:
    """A registry entry from an entry, a ClassTool subclass, or a plain function."""
    if isinstance(tool, ToolEntry):
        return tool
    if isinstance(tool, type):
        return ClassToolFactory(tool)
    if callable(tool):
        return FunctionTool.from_callable(tool)
    raise ConfigError(
        f"cannot register {tool!r} as a tool: give a function, a ClassTool subclass or a ToolEntry"
    )


def _origin(entry: ToolEntry) -> str:
    """Where a tool was defined ("module.qualname"), for duplicate-name errors (a function: picklable)."""
    return entry.origin


class ToolRegistry:
    """Name -> tool entry. Holds definitions only (immutable, shared); episodes get a :class:`ToolSet`."""

    def __init__(self, tools: Iterable[ToolLike] = ()) -> None:
        """Register each of ``tools`` in order (duplicates raise)."""
        self._tools: Registry[ToolEntry] = Registry("tool", describe=_origin, hint="rename one, or pass name=...")
        for tool in tools:
            self.add(tool)

    def add(self, tool: ToolLike) -> ToolEntry:
        """Register ``tool`` and return its entry; a name taken by another tool raises naming both."""
        entry = as_entry(tool)
        return self._tools.add(entry.name, entry)

    def remove(self, name: str) -> None:
        """Unregister ``name`` (e.g. before registering a reloaded module's version)."""
        self._tools.remove(name)

    def names(self) -> list[str]:
        """Registered names in registration order (the prompt's tool order when no selection is given)."""
        return list(self._tools)

    def get(self, name: str) -> ToolEntry:
        """The entry registered as ``name``; :class:`~agentevolver.errors.UnknownNameError` listing the names."""
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[ToolEntry]:
        return iter([entry for _, entry in self._tools.items()])

    def __len__(self) -> int:
        return len(self._tools)

    def validate_selection(self, tool_selection: Any) -> list[str]:
        """Resolve a sample's ``tool_selection`` to names (see :mod:`~agentevolver.module.tools.selection`)."""
        return validate_tool_selection(tool_selection, self.names())

    def select(self, tool_selection: Any = None) -> list[ToolEntry]:
        """The entries a sample's ``tool_selection`` makes available, in selection order."""
        return [self._tools.get(name) for name in self.validate_selection(tool_selection)]

    def schemas(self, tool_selection: Any = None) -> list[dict[str, Any]]:
        """Prompt schemas of the selected tools (e.g. for prompt-length estimates at data load)."""
        return [entry.schema() for entry in self.select(tool_selection)]

    def toolset(
        self,
        episode_id: str,
        *,
        tool_selection: Any = None,
        max_chars: int | None = None,
        truncate_side: TruncateSide = "middle",
    ) -> ToolSet:
        """A fresh :class:`ToolSet` for one episode with the selected tools."""
        return ToolSet(
            self.select(tool_selection),
            episode_id=episode_id,
            max_chars=max_chars,
            truncate_side=truncate_side,
        )

    def function(
        self, fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None
    ) -> Any:
        """Decorator registering a function tool here; see :func:`function_tool`."""
        return function_tool(fn, name=name, description=description, registry=self)


_DEFAULT = ToolRegistry()


def default_registry() -> ToolRegistry:
    """The process-wide registry that ``@function_tool``/``@class_tool`` use when no registry is given."""
    return _DEFAULT


@overload
def function_tool(fn: Callable[..., Any], /) -> FunctionTool: ...
@overload
def function_tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    registry: ToolRegistry | None = None,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
def function_tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    registry: ToolRegistry | None = None,
) -> Any:
    """Register a function as a tool: ``@function_tool`` or ``@function_tool(name=..., registry=...)``.

    Returns the :class:`FunctionTool`, which is still callable like the function.
    """

    def decorator(func: Callable[..., Any]) -> FunctionTool:
        tool = FunctionTool.from_callable(func, name=name, description=description)
        (registry if registry is not None else _DEFAULT).add(tool)
        return tool

    return decorator(fn) if fn is not None else decorator


def class_tool(
    cls: _ClassT | None = None,
    /,
    *,
    name: str | None = None,
    registry: ToolRegistry | None = None,
    init_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """Register a :class:`ClassTool` subclass: ``@class_tool`` or ``@class_tool(registry=..., init_kwargs=...)``.

    Returns the class unchanged.
    """

    def decorator(klass: _ClassT) -> _ClassT:
        (registry if registry is not None else _DEFAULT).add(
            ClassToolFactory(klass, name=name, init_kwargs=init_kwargs)
        )
        return klass

    return decorator(cls) if cls is not None else decorator
