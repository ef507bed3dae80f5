"""A name -> factory registry with a decorator, one per pluggable piece of the task manager.

Exploration strategies, real-time and post filters, embedders, mixture strategies and graders are chosen
by a config string (``task_manager.strategy: random``); adding one is a decorated class in any imported
module, with no edit to the manager (the pattern of verl's ``register_policy_loss``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from agentevolver.errors import ConfigError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Named factories of one kind; ``key`` is the config key that names an entry (for error messages)."""

    def __init__(self, kind: str, key: str) -> None:
        self.kind = kind
        self.key = key
        self._entries: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: make a class (or factory function) selectable under ``name``.

        A second, different factory under the same name is an error, so two plugins cannot silently
        replace each other.
        """

        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            existing = self._entries.get(name)
            if existing is not None and existing is not factory:
                raise ConfigError(f"{self.kind} {name!r} is already registered by "
                                  f"{existing.__module__}.{existing.__qualname__}; pick another name")
            self._entries[name] = factory
            return factory

        return decorator

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def check(self, name: str, key: str | None = None) -> str:
        """Return ``name`` if registered, else raise :class:`ConfigError` naming the key and the choices."""
        if name not in self._entries:
            raise ConfigError(f"{key or self.key}: unknown {self.kind} {name!r}; registered: "
                              f"{', '.join(self.names()) or '(none)'}")
        return name

    def create(self, name: str, *args: object, key: str | None = None, **kwargs: object) -> T:
        """Build the entry ``name`` with the given arguments."""
        return self._entries[self.check(name, key)](*args, **kwargs)
