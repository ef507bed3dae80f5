"""Environment registry: environments register by name; the service loads only the ones it is asked for.

``register_env("codebox")`` on a :class:`BaseEnv` subclass in ``env_service/environments/codebox/``
makes it servable as ``--env codebox``. :func:`load_envs` imports exactly the named packages, so a heavy
or broken environment that is not requested costs nothing.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable

from agentevolver.registry import Registry
from env_service import environments
from env_service.base import BaseEnv
from env_service.errors import EnvUnavailable, UnknownEnv

#: Environments imported so far, by name (``env_type``).
ENVIRONMENTS: Registry[type[BaseEnv]] = Registry("environment", "env_type")


def register_env(name: str) -> Callable[[type[BaseEnv]], type[BaseEnv]]:
    """Class decorator: register ``cls`` under ``name`` (which it also gets as ``cls.name``).

    A name taken by another class is a :class:`~agentevolver.errors.DuplicateNameError` naming both.
    """

    def decorate(cls: type[BaseEnv]) -> type[BaseEnv]:
        ENVIRONMENTS.add(name, cls)
        cls.name = name
        return cls

    return decorate


def available_envs() -> list[str]:
    """Names of the environment packages shipped under ``env_service/environments/`` (not imported)."""
    return sorted(info.name for info in pkgutil.iter_modules(environments.__path__) if info.ispkg)


def _import_env(name: str) -> type[BaseEnv]:
    """Import the environment's package if needed and return its registered class (no usability check)."""
    if name not in ENVIRONMENTS:
        if name not in available_envs():
            raise UnknownEnv(f"no environment {name!r}; shipped: {', '.join(available_envs())}", field="env_type")
        importlib.import_module(f"{environments.__name__}.{name}")
    if name not in ENVIRONMENTS:
        raise UnknownEnv(f"package env_service.environments.{name} registers no environment named {name!r}",
                         field="env_type")
    return ENVIRONMENTS.get(name)


def load_envs(names: Iterable[str]) -> dict[str, type[BaseEnv]]:
    """Import the named environments for serving, and check each can run here.

    Raises :class:`UnknownEnv` for a name that is not shipped and :class:`EnvUnavailable` (with the
    environment's own fix) for one whose package or data is missing: the service fails at start-up,
    not on the first request.
    """
    loaded: dict[str, type[BaseEnv]] = {}
    for name in names:
        cls = _import_env(name)
        try:
            splits = cls.splits()
            cls.tool_schemas()
            if splits:
                cls.task_ids(splits[0])
        except Exception as err:
            raise EnvUnavailable(f"environment {name!r} cannot be served: {err}", field="env_type") from err
        loaded[name] = cls
    return loaded


def get_env_class(name: str) -> type[BaseEnv]:
    """The registered class for ``name`` (importing its package if needed); used where instances are built."""
    return _import_env(name)
