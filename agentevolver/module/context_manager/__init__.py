"""Context managers: an episode's messages -> the exact token sequences the model reads, with loss masks.

* :func:`make_context_manager` / :func:`register_context_manager` - managers by name: ``linear``,
  ``linear_think``, ``memory``, ``self_clip``.
* :class:`ContextManager` - the per-episode contract (``start``, ``next_prompt_ids``, ``add_generation``,
  ``add_observation``, ``remaining_budget``, ``exhausted``, ``results``/``to_samples``).
* :class:`ContextRenderer` - chat template rendering with generated turns spliced in token-exact.
* :class:`ContextMessage` / :class:`Author` - each message with who wrote it and whether it is trained.

See docs/context_managers.md.
"""

from agentevolver.module.context_manager.base import BudgetReason, ContextManager, ContextOrderError, Turn
from agentevolver.module.context_manager.clip import clip_text_to_tokens
from agentevolver.module.context_manager.config import (
    DEFAULT_CLIPPER_PROMPT,
    DEFAULT_THINK_HINT,
    ContextManagerConfig,
    ContextOptions,
)
from agentevolver.module.context_manager.linear import LinearContextManager
from agentevolver.module.context_manager.linear_think import LinearThinkContextManager
from agentevolver.module.context_manager.memory import MemoryContextManager, memory_markdown
from agentevolver.module.context_manager.messages import Author, ContextMessage, as_chat_message
from agentevolver.module.context_manager.registry import (
    CONTEXT_MANAGERS,
    context_manager_names,
    get_context_manager,
    make_context_manager,
    register_context_manager,
)
from agentevolver.module.context_manager.render import ContextRenderer, RenderedContext, TemplateMismatchError
from agentevolver.module.context_manager.self_clip import SUMMARY_HEADER, SelfClipContextManager
from agentevolver.module.context_manager.text import strip_think
from agentevolver.module.context_manager.timeline import ContextResult, Timeline

__all__ = [
    "CONTEXT_MANAGERS",
    "DEFAULT_CLIPPER_PROMPT",
    "DEFAULT_THINK_HINT",
    "SUMMARY_HEADER",
    "Author",
    "BudgetReason",
    "ContextManager",
    "ContextManagerConfig",
    "ContextMessage",
    "ContextOptions",
    "ContextOrderError",
    "ContextRenderer",
    "ContextResult",
    "LinearContextManager",
    "LinearThinkContextManager",
    "MemoryContextManager",
    "RenderedContext",
    "SelfClipContextManager",
    "TemplateMismatchError",
    "Timeline",
    "Turn",
    "as_chat_message",
    "clip_text_to_tokens",
    "context_manager_names",
    "get_context_manager",
    "make_context_manager",
    "memory_markdown",
    "register_context_manager",
    "strip_think",
]
