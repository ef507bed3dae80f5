"""One program episode's calls, recorded as tokens: the gateway's side of "token in, token out".

An agent program sends whole conversations; the policy must be trained on the ids it generated, not on a
re-tokenisation of the text the program echoes back (vLLM's ``return_token_ids`` exists because
re-tokenising breaks RL). So each call is matched against what the episode has already seen:

* a call whose messages are an earlier call's messages, then the reply the gateway gave it, then new
  non-assistant messages (tool results, a user turn) **extends** that earlier call's context: the new
  messages are appended as observation tokens (mask 0) to the context manager that generated the reply,
  and the next prompt is the earlier prompt + the generated ids + the observation ids. Nothing is
  re-tokenised, so the merge is token-exact by construction; the context manager checks the extension
  (its ``Timeline.is_prefix_of``) and starts a new sample if a chat template ever rewrote history;
* any other call (edited history, another conversation such as a sub-agent, other tools) starts a **new
  chain**: a new context manager, rendered from the messages as sent. It becomes a sample of its own, and
  the multi-sample path trains every sample of the episode.

Each chain is a context manager of ``agent_flow.context_template`` with the run's budgets, so budgets,
masks, step ids (one per call: ADCA's steps are the calls) and Self-Navigating's experience (injected into
the episode's first call, stripped for training) work as in agent-flow episodes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentevolver.module.context_manager import ContextManager, make_context_manager
from agentevolver.schema.message import ChatMessage
from agentevolver.schema.sample import Sample
from agentevolver.schema.trajectory import Reward

__all__ = ["BudgetExhausted", "CallRecord", "EpisodeCalls", "PreparedCall", "message_key"]


class BudgetExhausted(Exception):
    """No generation fits the episode's token budget any more (answered as OpenAI's context_length_exceeded)."""


def _arguments_key(arguments: Any) -> str:
    """Tool-call arguments in one canonical form (a program may echo them as a dict or as JSON text)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def message_key(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must be equal for an echoed message to be the message the episode saw (OpenAI dict form).

    ``content`` None and "" are the same (SDKs send null for pure tool-call turns); call ids and a message's
    ``name`` are not compared for assistant turns, which some frameworks rewrite, while the calls' names and
    arguments are.
    """
    role = message.get("role")
    calls = tuple((call["function"]["name"], _arguments_key(call["function"].get("arguments", "{}")))
                  for call in message.get("tool_calls") or ())
    tool_call_id = message.get("tool_call_id") if role == "tool" else None
    return role, message.get("content") or "", calls, tool_call_id


@dataclass
class _Chain:
    """One context manager and the conversation (as keys) its current context holds, reply included."""

    manager: ContextManager
    tools_key: str
    seen: list[tuple[Any, ...]] = field(default_factory=list)
    alive: bool = True


@dataclass
class PreparedCall:
    """A call ready to generate: the chain it extends, its prompt ids and the most tokens it may produce."""

    chain: _Chain
    prompt_ids: list[int]
    max_tokens: int
    new_chain: bool


@dataclass
class CallRecord:
    """One answered call, as the episode's record and the reply's token ids."""

    step: int
    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    finish_reason: str
    new_chain: bool


class EpisodeCalls:
    """The calls of one episode folded into chains (see the module docstring); one per episode, not shared.

    ``experience`` (Self-Navigating: advice text or exemplar turns) goes into the episode's first call only,
    as the agent flow puts it into an episode's first prompt; ``strip_experience`` trains the samples without it.
    """

    def __init__(
        self,
        *,
        tokenizer: Any,
        context_template: str,
        context_config: Any,
        experience: str | Sequence[ChatMessage] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.context_template = context_template
        self.context_config = context_config
        self.experience = experience
        self.chains: list[_Chain] = []
        self.records: list[CallRecord] = []
        self.experience_injected = False
        self.budget_exhausted = False

    @property
    def num_calls(self) -> int:
        return len(self.records)

    def prepare(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                limit: int | None) -> PreparedCall:
        """The chain this call extends (or a new one) and its prompt; raises :class:`BudgetExhausted`."""
        tools_key = json.dumps(tools or [], sort_keys=True)
        keys = [message_key(message) for message in messages]
        chain, new_chain = self._extended_chain(keys, tools_key, messages), False
        if chain is None:
            chain, new_chain = self._new_chain(messages, tools, tools_key), True
        if chain.manager.exhausted:
            chain.alive = False
            self.budget_exhausted = True
            raise BudgetExhausted(f"the episode's context is full ({chain.manager.exhausted_reason} budget: "
                                  "data.max_prompt_length / actor_rollout_ref.rollout.response_length)")
        chain.seen = keys
        max_tokens = chain.manager.remaining_budget()
        if limit is not None:
            max_tokens = min(max_tokens, limit)
        return PreparedCall(chain, chain.manager.next_prompt_ids(), max_tokens, new_chain)

    def record(self, call: PreparedCall, token_ids: Sequence[int], log_probs: Sequence[float] | None) -> CallRecord:
        """Append the generated ids to the call's chain (as generated, up to EOS and the budget)."""
        step = len(self.records)
        message = call.chain.manager.add_generation(token_ids, log_probs, step=step)
        kept = list(message.generated_ids or ())
        ended = bool(kept) and kept[-1] == call.chain.manager.renderer.eos_id
        record = CallRecord(step=step, prompt_ids=call.prompt_ids, response_ids=kept, text=message.content,
                            finish_reason="stop" if ended else "length", new_chain=call.new_chain)
        self.records.append(record)
        return record

    def answered(self, call: PreparedCall, reply: Mapping[str, Any]) -> None:
        """Remember the assistant message the program was given, which it echoes in its next call."""
        call.chain.seen = [*call.chain.seen, message_key(reply)]

    def abandon(self, call: PreparedCall) -> None:
        """A call whose generation failed: its chain cannot be extended (its manager awaits a generation)."""
        call.chain.alive = False

    # ------------------------------------------------------------------ output
    def samples(self, *, task_id: str, group_id: str, rollout_id: int, reward: Reward,
                strip_experience: bool, extras: dict[str, Any]) -> list[Sample]:
        """Every sample of the episode (chains in call order), each with the episode's reward."""
        out: list[Sample] = []
        for chain in self.chains:
            if chain.manager.num_turns == 0:
                continue  # a chain whose only call failed: nothing was generated in it
            out += chain.manager.to_samples(task_id=task_id, group_id=group_id, rollout_id=rollout_id,
                                            reward=reward, strip_experience=strip_experience, extras=extras)
        return out

    def messages(self) -> list[dict[str, Any]]:
        """The episode as it happened, chain after chain (each message with ``chain``, its chain's index)."""
        out: list[dict[str, Any]] = []
        for index, chain in enumerate(self.chains):
            out += [{**message.to_dict(), "chain": index} for message in chain.manager.messages]
        return out

    def last_reply_text(self) -> str:
        """The text of the last generation (the program's answer when it returns none)."""
        return self.records[-1].text if self.records else ""

    def metrics(self) -> dict[str, float]:
        merged: dict[str, float] = {}
        for chain in self.chains:
            for key, value in chain.manager.metrics().items():
                merged[key] = max(merged.get(key, 0.0), value) if key.startswith("max_") else merged.get(key, 0.0) + value
        merged["chains"] = float(len(self.chains))
        return merged

    # ------------------------------------------------------------------ matching
    def _extended_chain(self, keys: list[tuple[Any, ...]], tools_key: str,
                        messages: list[dict[str, Any]]) -> _Chain | None:
        """The newest live chain whose conversation (reply included) these messages continue with new
        observations; the observations are appended to it. None when no chain fits."""
        for chain in reversed(self.chains):
            seen = len(chain.seen)
            if (not chain.alive or chain.tools_key != tools_key or len(keys) <= seen
                    or keys[:seen] != chain.seen or not chain.seen or chain.seen[-1][0] != "assistant"):
                continue
            rest = messages[seen:]
            if any(message.get("role") == "assistant" for message in rest):
                continue  # the program wrote an assistant turn itself: not the policy's, a new chain
            chain.manager.add_observation(rest)
            return chain
        return None

    def _new_chain(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   tools_key: str) -> _Chain:
        manager = make_context_manager(self.context_template, self.tokenizer, self.context_config, tools=tools)
        experience = self.experience if not self.chains else None
        if experience and not isinstance(experience, str) and messages[-1].get("role") != "user":
            experience = None  # exemplar turns go before a question; this call does not end with one
        manager.start(messages, experience=experience)
        self.experience_injected = self.experience_injected or bool(experience)
        chain = _Chain(manager=manager, tools_key=tools_key)
        self.chains.append(chain)
        return chain


def new_episode_id() -> str:
    """An episode id that is safe in a URL path and unguessable enough to keep programs apart."""
    return uuid.uuid4().hex
