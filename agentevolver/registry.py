"""One registry type for every pluggable piece: name -> object, filled by a decorator, read by config strings.

Context managers, tool parsers, tools, task-manager strategies/filters/graders/mixtures/embedders, memory
embedders and vector stores, and environments each keep one :class:`Registry`. Adding a piece is a
decorated class in any imported module (verl's ``@register_policy_loss`` pattern), and every registry fails
the same way:

* an unknown name raises :class:`~agentevolver.errors.UnknownNameError` (a ``ConfigError`` and a
  ``KeyError``) naming the config field, the kind of thing and the registered names::

      agent_flow.context_template: unknown context manager 'x'; registered: linear, linear_think, memory

* a second, *different* object under a taken name raises :class:`~agentevolver.errors.DuplicateNameError`
  naming both objects, so two plugins cannot silently replace each other. Registering the *same* object
  again is a no-op (a module imported twice under one name); a reloaded module defines new objects, so it
  :meth:`~Registry.remove`\\ s its names first.

Importing this module imports nothing heavy (no torch, ray or verl): the services use it too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from agentevolver.errors import ConfigError, DuplicateNameError, UnknownNameError

__all__ = ["DuplicateNameError", "Registry", "UnknownNameError", "qualified_name"]

T = TypeVar("T")
S = TypeVar("S")


def qualified_name(obj: object) -> str:
    """``module.qualname`` of a class or function (how error messages point at a definition)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}.{qualname}"
    return repr(obj)


class Registry(Generic[T]):
    """Named objects of one kind (classes, factories, tool entries).

    ``what`` names the kind in messages ("context manager"); ``field`` is the config key whose value is
    looked up here ("agent_flow.context_template"), quoted first in lookup errors; ``describe`` says where an
    object was defined (default ``module.qualname``); ``hint`` ends the duplicate-name error.
    """

    def __init__(
        self,
        what: str,
        field: str | None = None,
        *,
        describe: Callable[[T], str] = qualified_name,
        hint: str = "pick another name",
    ) -> None:
        self.what = what
        self.field = field
        self.hint = hint
        self.describe = describe
        self._entries: dict[str, T] = {}

    # ------------------------------------------------------------------------------------------ filling

    def add(self, name: str, obj: T) -> T:
        """Register ``obj`` as ``name`` and return it; the same object again is a no-op, another one raises."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{self.what} names must be non-empty strings; got {name!r}")
        existing = self._entries.get(name)
        if existing is not None and existing is not obj:
            raise DuplicateNameError(
                f"{self.what} {name!r} is already registered by {self.describe(existing)}; refusing "
                f"{self.describe(obj)} under the same name: {self.hint}"
            )
        self._entries[name] = obj
        return obj

    def register(self, name: str) -> Callable[[S], S]:
        """Decorator form of :meth:`add`: ``@REGISTRY.register("name")`` returns the object unchanged."""

        def decorator(obj: S) -> S:
            self.add(name, obj)  # type: ignore[arg-type]
            return obj

        return decorator

    def remove(self, name: str) -> None:
        """Forget ``name`` (e.g. before a reloaded module registers its new version); absent names are fine."""
        self._entries.pop(name, None)

    # ------------------------------------------------------------------------------------------ reading

    def get(self, name: str, field: str | None = None) -> T:
        """The object registered as ``name``; :class:`UnknownNameError` naming ``field`` and the choices."""
        return self._entries[self.check(name, field)]

    def check(self, name: Any, field: str | None = None) -> str:
        """Return ``name`` if registered, else raise :class:`UnknownNameError` (``field`` overrides the key)."""
        if isinstance(name, str) and name in self._entries:
            return name
        field = field or self.field
        prefix = f"{field}: " if field else ""
        raise UnknownNameError(
            f"{prefix}unknown {self.what} {name!r}; registered: {', '.join(self.names()) or '(none)'}"
        )

    def create(self, name: str, *args: Any, field: str | None = None, **kwargs: Any) -> Any:
        """Call the factory (class) registered as ``name`` with the given arguments."""
        factory: Any = self.get(name, field)
        return factory(*args, **kwargs)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """``(name, object)`` pairs in registration order."""
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        """Names in registration order."""
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {len(self)} registered: {', '.join(self._entries)})"
