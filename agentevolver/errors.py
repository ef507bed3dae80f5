"""Exceptions that carry a user-facing message.

Every error a user can cause (bad config value, unknown model name, unreachable endpoint) is raised as a
subclass of :class:`AgentEvolverError` whose message names the offending field and says what to change;
entry points print that message instead of a traceback.
"""


class AgentEvolverError(Exception):
    """Base class for errors whose message is meant for the user, not for a debugger."""


class ConfigError(AgentEvolverError, ValueError):
    """A configuration value is missing, mistyped or out of range; the message names the key."""


class UnknownNameError(ConfigError, KeyError):
    """A registry (:class:`agentevolver.registry.Registry`) has no entry under the name a config gave.

    Also a ``KeyError``, so code that looked names up in a plain dict keeps catching it.
    """

    def __str__(self) -> str:
        # KeyError.__str__ would print repr(message), quotes and all.
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(ConfigError):
    """A second, different object was registered under a name a registry already holds."""


class ModelResolutionError(AgentEvolverError, FileNotFoundError):
    """A model path is neither a folder, a built-in model name, nor available offline."""


class LLMError(AgentEvolverError, RuntimeError):
    """An OpenAI-compatible endpoint failed in a way retries cannot fix (or retries ran out)."""
