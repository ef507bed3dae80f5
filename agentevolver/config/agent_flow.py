"""The ``agent_flow`` config section's data: how one episode runs, its context and its tools.

Defined and documented in config/agentevolver.yaml; these models enforce types and ranges once at start-up
and carry the same defaults, so code and tests can build a config without Hydra. They are plain data, so
the config package depends on no mechanism: the names of plug-ins (``context_template``, ``tools.tool_parser``)
are checked against their registries by :func:`agentevolver.module.agent_flow.plugins.plugin_name_errors`,
which the entry points hand to :func:`agentevolver.config.validate_config`, and again where each is built.

Token budgets of the context (window, prompt cap, response cap) are *not* here: they are verl's
``data.max_prompt_length`` and ``actor_rollout_ref.rollout.response_length``, because verl pads the batch to
exactly those sizes and an episode that outgrew them could not be trained.
:func:`agentevolver.module.agent_flow.plugins.context_config` joins the two.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["DEFAULT_CLIPPER_PROMPT", "DEFAULT_THINK_HINT", "TOOL_REWARD_MODES", "TRUNCATE_SIDES", "AgentFlowConfig",
           "ContextOptions", "DumpConfig", "FlowContextOptions", "MadnessConfig", "ToolRewardMode", "ToolsConfig",
           "TruncateSide"]

#: Which part of a long observation is cut: left = keep the end, right = keep the start, middle = keep both ends.
TruncateSide = Literal["left", "right", "middle"]
TRUNCATE_SIDES: tuple[str, ...] = ("left", "right", "middle")
#: How tool step rewards enter the episode reward (:mod:`agentevolver.module.tools.rewards`).
ToolRewardMode = Literal["ignore", "sum", "last"]
TOOL_REWARD_MODES: tuple[str, ...] = ("ignore", "sum", "last")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: Appended to the last message of every ``linear_think`` context (the reference's "think first" nudge).
DEFAULT_THINK_HINT = (
    "\n\nFirst think step by step inside <think>...</think>, then give your action after </think>."
)

#: System prompt of the ``self_clip`` archivist (the ``context_clipper`` LLM role).
DEFAULT_CLIPPER_PROMPT = (
    "You archive the early part of an agent's interaction with an environment so the agent can continue "
    "with a shorter context. Write a concise markdown summary of the turns you are given: what the agent "
    "tried, what the environment answered, facts learned (names, ids, values, file paths), and what is "
    "still left to do. Keep every detail the agent may need later; drop pleasantries and repetition. "
    "Answer with the summary only."
)


class ContextOptions(BaseModel):
    """Per-manager options, without the token budgets (the ``agent_flow.context`` config section holds these;
    its budgets come from the run's lengths)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Environment/tool message content is clipped to this many tokens, marker included. None = no clip (all).
    max_env_len: int | None = Field(default=4096, ge=1)
    #: Marker that replaces the clipped tail of a long observation; ``{n}`` = tokens removed (all).
    env_clip_marker: str = "\n...[{n} tokens truncated]"
    #: A generation needs at least this many free tokens; below it the manager reports ``exhausted`` (all).
    min_generation_tokens: int = Field(default=1, ge=1)
    #: Extra keyword arguments for ``tokenizer.apply_chat_template`` (e.g. ``enable_thinking``) (all).
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    #: Text appended to the last message of each context (``linear_think``); "" disables the hint.
    think_hint: str = DEFAULT_THINK_HINT
    #: Characters kept per action / observation in the running memory (``memory``).
    memory_entry_chars: int = Field(default=400, ge=16)
    #: Archive old turns when the next context would exceed this share of ``max_model_len`` (or of
    #: ``max_response_len`` for the response part) (``self_clip``).
    clip_threshold: float = Field(default=0.8, gt=0.0, le=1.0)
    #: Most recent turns kept verbatim when archiving (``self_clip``).
    keep_last_turns: int = Field(default=1, ge=0)
    #: System prompt of the archivist LLM (``self_clip``).
    clipper_prompt: str = DEFAULT_CLIPPER_PROMPT

    @field_validator("env_clip_marker")
    @classmethod
    def _marker_counts(cls, value: str) -> str:
        if "{n}" not in value:
            raise ValueError("env_clip_marker must contain '{n}' (the number of tokens removed)")
        return value


class FlowContextOptions(ContextOptions):
    """``agent_flow.context``: the context manager's options (budgets come from verl's lengths, see module doc);
    a turn needs 8 free tokens by default, so an episode ends instead of generating a few tokens at the edge."""

    min_generation_tokens: int = Field(default=8, ge=1)


class ToolsConfig(BaseModel):
    """``agent_flow.tools``: tool parsing and execution settings (defaults mirror verl's where verl has one).

    :mod:`agentevolver.module.tools.config` builds the parser and the episode's tool set from it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Parser name, ``{"name": ..., **options}``, or a list of those (composite, applied in order).
    tool_parser: str | dict[str, Any] | list[str | dict[str, Any]] = "hermes"
    #: Calls run per assistant turn; later ones are answered "not run". None = no limit. verl's default is 1.
    max_parallel_calls: int | None = Field(default=1, ge=1)
    #: Per-call timeout in seconds (class-tool creation included). None = no timeout.
    tool_timeout_s: float | None = Field(default=30.0, gt=0)
    #: Observation cap in characters, marker included. None = no cap.
    max_tool_response_chars: int | None = Field(default=4096, ge=1)
    #: Which part of a long observation is cut: left (keep the end), right (keep the start), middle.
    truncate_side: TruncateSide = "middle"
    #: How tool step rewards enter the episode reward: ignore, sum, last.
    tool_reward_mode: ToolRewardMode = "ignore"
    #: Render the tool schemas into the prompt (the chat template's ``tools`` block). False when the
    #: environment's own prompt already teaches the call format: on ``calc`` the block is ~320 tokens of each
    #: prompt, which the update's forward and backward passes pay for in every sample. Parsing and the
    #: env/local name-clash check still use the schemas.
    schemas_in_prompt: bool = True


class MadnessConfig(_Model):
    """``agent_flow.madness``: repetition ("madness") detection on each generation."""

    enable: bool = True
    ngram_size: int = Field(default=4, ge=1)
    min_tokens: int = Field(default=48, ge=2)
    max_repeat_ratio: float = Field(default=0.6, gt=0.0, lt=1.0)
    penalize: bool = True
    penalty_reward: float = -1.0
    terminate: bool = False


class DumpConfig(_Model):
    """``agent_flow.dump``: where and whether each step's episodes are written as JSON lines."""

    enable: bool = True
    dir: str | None = None
    include_messages: bool = True


class AgentFlowConfig(_Model):
    """``agent_flow``: the episode loop's knobs (see config/agentevolver.yaml for each key's meaning)."""

    context_template: str = "linear"
    max_steps: int = Field(default=30, ge=1)
    max_tokens_per_turn: int | None = Field(default=1024, ge=1)
    on_parse_error: Literal["feedback", "env", "terminate"] = "feedback"
    max_parse_errors: int = Field(default=3, ge=1)
    max_env_errors: int = Field(default=3, ge=1)
    episode_retries: int = Field(default=2, ge=0)
    episode_retry_backoff_s: float = Field(default=5.0, ge=0)
    max_failed_share: float = Field(default=0.5, ge=0, le=1)
    sparse_reward: bool = True
    success_threshold: float = 1.0
    tool_modules: list[str] = Field(default_factory=list)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    context: FlowContextOptions = Field(default_factory=FlowContextOptions)
    madness: MadnessConfig = Field(default_factory=MadnessConfig)
    dump: DumpConfig = Field(default_factory=DumpConfig)
