"""Wire models of the agent gateway: what an agent program sends it, and what it is given.

The gateway (:mod:`agentevolver.gateway`) is an OpenAI-compatible chat-completions endpoint per training
episode (``<gateway>/episodes/<id>/v1``). A request is the local LLM server's
:class:`~agentevolver.schema.llm_wire.ChatCompletionRequest` (unknown fields are a 400 naming them) plus
vLLM's ``return_token_ids``; fields whose effect would make the recorded tokens something other than the
policy's own samples are refused with a 400 naming the field (:meth:`GatewayChatRequest._trainable_only`).

Sampling is the run's: ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty`` and ``seed`` are
accepted (agents set them) and ignored, because the update is only correct for tokens drawn with the
rollout's settings (``actor_rollout_ref.rollout.*``; validation greedy). Any ``model`` name is answered by
the policy, and the reply carries the name sent: an agent written for a hosted model runs unchanged.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentevolver.schema.llm_wire import ChatCompletionRequest, FieldError

__all__ = ["SAMPLING_IGNORED", "GatewayChatRequest", "ProgramTask", "RewardReport", "RewardReportAck"]

#: Request fields accepted and ignored: the run's rollout settings sample every call (module docstring).
SAMPLING_IGNORED = ("temperature", "top_p", "top_k", "repetition_penalty", "seed")


class GatewayChatRequest(ChatCompletionRequest):
    """``POST /episodes/{episode_id}/v1/chat/completions``."""

    return_token_ids: bool = Field(
        default=False, description="vLLM extra: the reply carries prompt_token_ids and each choice's token_ids")

    @model_validator(mode="after")
    def _trainable_only(self) -> GatewayChatRequest:
        """Refuse what would change the tokens away from the policy's own sample of the whole reply."""
        if self.n != 1:
            raise FieldError("n", f"n must be 1 (got {self.n}): every call of an episode is one sample of the "
                                  "policy; call again for another reply")
        if self.response_format is not None and self.response_format.type != "text":
            raise FieldError("response_format", "response_format json_object/json_schema is not supported by the "
                                                "training gateway: constrained decoding would train the policy on "
                                                "tokens it did not sample; leave it out")
        for name in ("stop", "stop_token_ids"):
            if getattr(self, name):
                raise FieldError(name, f"{name} is not supported by the training gateway: a reply cut at a stop "
                                       "string is not what the policy sampled; leave it out (the model stops at "
                                       "its end-of-turn token)")
        if self.return_token_ids and self.stream:
            raise FieldError("return_token_ids", "return_token_ids is only answered without streaming; leave "
                                                 "one of return_token_ids and stream out")
        if self.ignore_eos:
            raise FieldError("ignore_eos", "ignore_eos is not supported by the training gateway; leave it out")
        if self.chat_template_kwargs:
            raise FieldError("chat_template_kwargs", "chat_template_kwargs is set by the run "
                                                     "(agent_flow.context.chat_template_kwargs), not per request")
        return self


class RewardReport(BaseModel):
    """``POST /episodes/{episode_id}/reward``: the program's own score of its episode.

    Used when ``agent_program.reward`` is ``program`` and the program cannot return its reward (a command);
    a callable may return it instead. ``success`` defaults to ``reward >= agent_flow.success_threshold``.
    """

    model_config = ConfigDict(extra="forbid")

    reward: float = Field(description="The episode's outcome reward (a finite number).")
    success: bool | None = Field(default=None, description="Whether the task was solved (default: from reward).")
    answer: str | None = Field(default=None, description="The final answer, kept in the episode's record.")

    @field_validator("reward")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number; got {value}")
        return value


class RewardReportAck(BaseModel):
    """The answer to a reward report."""

    episode_id: str
    reward: float


class ProgramTask(BaseModel):
    """What an agent program is given for one episode (a callable's argument; ``AGENTEVOLVER_TASK`` for a
    command, as JSON).

    ``base_url`` is the episode's OpenAI-compatible endpoint (give it to the SDK: ``OpenAI(base_url=...,
    api_key=...)``; commands also get it as ``OPENAI_BASE_URL``), ``model`` the name to send. ``query`` is the
    task's question; ``messages`` the environment's opening conversation for it (system prompt,
    demonstrations, question), which a program may send as is; ``tools`` the environment's tool schemas.
    ``reward_url`` takes a :class:`RewardReport`.
    """

    model_config = ConfigDict(extra="forbid")

    episode_id: str
    base_url: str
    api_key: str
    model: str
    reward_url: str
    task_id: str
    env_type: str
    query: str
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
