"""The context manager contract: one episode's conversation -> the token sequences the model reads and
the training samples they become.

The agent flow drives it per episode::

    cm = make_context_manager(name, tokenizer, config, tools=schemas, llm=clipper)
    cm.start(initial_messages, experience=text_or_None)
    while not cm.exhausted and ...:
        out = generate(cm.next_prompt_ids(), max_tokens=cm.remaining_budget())
        cm.add_generation(out.token_ids, out.log_probs, step=k)
        ... env.step / tools ...
        cm.add_observation(observation_messages)
    samples = cm.to_samples(task_id=..., group_id=..., strip_experience=discard_experience)

Subclasses only decide *what the model sees next* (:meth:`ContextManager.build_context`); this class turns
that into ids (via :class:`ContextRenderer`), appends them to the current sample when they extend it or
starts a new sample when history was rewritten (see :mod:`.timeline`), and keeps every budget.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from agentevolver.module.context_manager.clip import clip_text_to_tokens
from agentevolver.module.context_manager.config import ContextManagerConfig
from agentevolver.module.context_manager.messages import Author, ContextMessage, as_chat_message
from agentevolver.module.context_manager.render import ContextRenderer, RenderedContext
from agentevolver.module.context_manager.timeline import ContextResult, Timeline
from agentevolver.schema.message import ChatMessage
from agentevolver.schema.sample import Sample
from agentevolver.schema.trajectory import Reward

logger = logging.getLogger(__name__)

__all__ = ["BudgetReason", "ContextManager", "ContextOrderError", "Turn"]

#: Why no further generation fits: the window (max_model_len), the response cap (max_response_len), or the
#: prompt cap of a fresh context (max_prompt_len).
BudgetReason = Literal["window", "response", "prompt"]
_Phase = Literal["new", "generate", "observe", "done"]


class ContextOrderError(RuntimeError):
    """The agent flow called the context manager out of order (e.g. two generations without an observation)."""


@dataclass
class Turn:
    """One agent step: the assistant message (with its generated ids) and the observations answering it."""

    assistant: ContextMessage
    observations: list[ContextMessage] = field(default_factory=list)


class ContextManager(ABC):
    """Base of every context manager; see the module docstring for the call sequence.

    Token accounting (seed 001, section 10): generated ids are appended exactly as generated (mask 1, their
    logprobs, ``step_ids`` = the step); everything else appended between two generations (the template's
    closing of the assistant turn, the observation turn, the next generation header) has mask 0, logprob
    0.0 and step -1. Nothing generated is ever decoded and re-encoded for training.
    """

    #: Registry name (set by :func:`register_context_manager`).
    name: ClassVar[str] = ""
    #: Managers whose contexts only ever grow say so; a rewrite then is a template problem worth a warning.
    append_only: ClassVar[bool] = False

    def __init__(
        self,
        tokenizer: Any,
        config: ContextManagerConfig | Mapping[str, Any] | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        llm: Any = None,
    ) -> None:
        if config is None:
            config = ContextManagerConfig()
        elif not isinstance(config, ContextManagerConfig):
            config = ContextManagerConfig.model_validate(dict(config))
        self.config: ContextManagerConfig = config
        self.renderer = ContextRenderer(tokenizer, tools, config.chat_template_kwargs)
        self.llm = llm
        self._initial: list[ContextMessage] = []
        self._turns: list[Turn] = []
        self._timelines: list[Timeline] = []
        self._phase: _Phase = "new"
        self._exhausted_reason: BudgetReason | None = None
        self._with_logprobs: bool | None = None
        self._stats: Counter[str] = Counter()

    # ------------------------------------------------------------------ what subclasses decide
    @abstractmethod
    def build_context(self) -> list[ContextMessage]:
        """The messages the model sees at its next generation, built from :attr:`initial` and :attr:`turns`."""

    def next_context(self) -> RenderedContext:
        """Render :meth:`build_context`; managers that react to the size of the result override this."""
        return self.renderer.render(self.build_context())

    # ------------------------------------------------------------------ the episode
    def start(
        self,
        messages: Sequence[ChatMessage | Mapping[str, Any]],
        experience: str | Sequence[ChatMessage | Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Record the environment's opening messages and the episode's experience, and return the first
        prompt's ids, generation header included.

        ``experience`` is text appended to the last opening message (advice), or whole chat turns inserted
        right before it (exemplars: a solved episode of a similar task, shown as the environment's own
        demonstrations are, just before the task's question). Either way it is recorded as its token span
        (``ContextResult.experience_span``); ``results(strip_experience=True)`` re-renders each prompt
        without it for training.
        """
        self._expect("new", "start()")
        chat = [as_chat_message(message) for message in messages]
        if not chat:
            raise ValueError("start() needs at least one message (the task)")
        self._initial = [
            ContextMessage(message, Author.SYSTEM if message.role == "system" else Author.ENV) for message in chat
        ]
        if isinstance(experience, str):
            if experience:
                self._initial.append(ContextMessage(
                    ChatMessage(role=chat[-1].role, content=experience), Author.EXPERIENCE, join_previous=True
                ))
        elif experience:
            if chat[-1].role != "user":
                raise ValueError(f"experience turns go before the task's question, the last opening message, "
                                 f"which must be a user message; it is a {chat[-1].role!r} message")
            turns = [ContextMessage(as_chat_message(m), Author.EXPERIENCE) for m in experience]
            self._initial[-1:-1] = turns
        rendered = self.next_context()
        self._timelines.append(self._fresh_timeline(rendered))
        self._exhausted_reason = self._overflow(len(rendered.ids), 0, prompt_len=len(rendered.ids))
        if self._exhausted_reason:
            logger.warning("%s: the initial prompt (%d tokens) leaves no room to generate (%s budget)",
                           self.name, len(rendered.ids), self._exhausted_reason)
        self._phase = "generate"
        return list(rendered.ids)

    def next_prompt_ids(self) -> list[int]:
        """Ids to send to the rollout server for the next generation (the whole current context)."""
        if self._exhausted_reason and self._phase in ("generate", "done"):
            raise ContextOrderError(
                f"{self.name}: the {self._exhausted_reason} budget is exhausted; end the episode instead of "
                "generating (check cm.exhausted before each step)"
            )
        self._expect("generate", "next_prompt_ids()")
        return self._timelines[-1].sequence()

    def add_generation(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        *,
        step: int | None = None,
        text: str | None = None,
    ) -> ContextMessage:
        """Record one generation as policy tokens (mask 1) and return its assistant message.

        ``token_ids`` are kept as generated, up to and including the first EOS (anything a server returns
        after EOS is dropped: the next prompt continues from the EOS). ``step`` defaults to the number of
        earlier generations. ``text`` is only for the record (and for history a manager rewrites); it is
        decoded from the ids when not given.
        """
        self._expect("generate", "add_generation()")
        ids = [int(token) for token in token_ids]
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"got {len(logprobs)} logprobs for {len(ids)} generated tokens; they must align")
        step = len(self._turns) if step is None else step
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer >= 0; got {step!r}")
        if self._with_logprobs is not None and self._with_logprobs != (logprobs is not None):
            raise ValueError("logprobs must be given for every generation of an episode or for none")
        self._with_logprobs = logprobs is not None
        keep = self._keep_length(ids)
        if keep < len(ids):
            text = None  # the caller's text covers tokens that were dropped; decode what is kept
        ids, lps = ids[:keep], (list(logprobs)[:keep] if logprobs is not None else None)
        message = ContextMessage(
            ChatMessage(role="assistant", content=self._generated_text(ids, text)),
            Author.LLM,
            step=step,
            generated_ids=tuple(ids),
        )
        self._turns.append(Turn(message))
        timeline = self._timelines[-1]
        timeline.append_generation(ids, lps, step, message)
        self._stats["generated_tokens"] += len(ids)
        self._exhausted_reason = self._overflow(len(timeline), len(timeline.response_ids))
        self._phase = "observe"
        return message

    def add_observation(self, messages: Sequence[ChatMessage | Mapping[str, Any]]) -> None:
        """Record the environment's answer to the last generation and prepare the next context.

        Each content is clipped to ``max_env_len`` tokens first. The new tokens (the template's closing of
        the assistant turn, the observation turn, the next generation header) are appended with mask 0;
        when they would leave no room for a generation, they are not appended, the messages are recorded
        as not in context, and :attr:`exhausted` turns True.
        """
        self._expect("observe", "add_observation()")
        turn = self._turns[-1]
        turn.observations = [self._observation(as_chat_message(m), turn.assistant.step) for m in messages]
        if self._exhausted_reason is None:
            rendered = self.next_context()
            if self._advance(rendered):
                self._phase = "generate"
                return
        turn.observations = [obs.replace(in_context=False) for obs in turn.observations]
        self._phase = "done"

    # ------------------------------------------------------------------ budgets and state
    def remaining_budget(self) -> int:
        """Tokens the next generation may produce (0 when none fit): pass it as the server's max_tokens."""
        if not self._timelines or self._phase == "done":
            return 0
        timeline = self._timelines[-1]
        room = self.config.max_model_len - len(timeline)
        if self.config.max_response_len is not None:
            room = min(room, self.config.max_response_len - len(timeline.response_ids))
        return max(room, 0)

    @property
    def exhausted(self) -> bool:
        """True when no further generation fits (the episode should end with termination "budget")."""
        return self._exhausted_reason is not None

    @property
    def exhausted_reason(self) -> BudgetReason | None:
        """Which budget ran out: "window", "response" or "prompt"; None while there is room."""
        return self._exhausted_reason

    @property
    def initial(self) -> list[ContextMessage]:
        """The opening messages (and the experience span joined to the last one)."""
        return list(self._initial)

    @property
    def turns(self) -> list[Turn]:
        """The agent steps so far."""
        return list(self._turns)

    @property
    def num_turns(self) -> int:
        """Number of generations recorded."""
        return len(self._turns)

    @property
    def messages(self) -> list[ContextMessage]:
        """The whole episode as it happened (not as any one context shows it), each message with its author."""
        out = list(self._initial)
        for turn in self._turns:
            out.append(turn.assistant)
            out += turn.observations
        return out

    # ------------------------------------------------------------------ output
    def results(self, strip_experience: bool = False) -> list[ContextResult]:
        """One result per sample: every sequence that holds at least one generation, in order.

        An episode without any generation still yields its prompt as one result (empty response), so the
        caller always has a sample to account for the episode.

        ``strip_experience`` (Self-Navigating's "discard" mode): every result whose prompt holds the
        injected experience gets that prompt rendered again from its own messages without the experience
        item (see :meth:`_strip_experience` for why re-rendering); its response is returned untouched and
        the result is marked (``experience_stripped``, ``experience_span_generated``). Results without
        experience are returned as they are: their training context is their generation context.
        """
        finished = [t for t in self._timelines if t.num_generations] or self._timelines[:1]
        with_logprobs = bool(self._with_logprobs)
        results = [timeline.result(with_logprobs, index) for index, timeline in enumerate(finished)]
        if strip_experience:
            results = [self._strip_experience(timeline, result)
                       for timeline, result in zip(finished, results, strict=True)]
        return results

    def result(self, strip_experience: bool = False) -> ContextResult:
        """The single result of an episode; raises when the manager produced several (use :meth:`results`)."""
        results = self.results(strip_experience)
        if len(results) != 1:
            raise ValueError(f"context manager {self.name!r} produced {len(results)} samples for this episode; "
                             "use results() / to_samples()")
        return results[0]

    def to_samples(
        self,
        *,
        task_id: str,
        group_id: str,
        rollout_id: int = 0,
        reward: Reward | None = None,
        strip_experience: bool = False,
        extras: dict[str, Any] | None = None,
    ) -> list[Sample]:
        """Validated samples of the episode (all share task, group, rollout id and reward).

        ``strip_experience=True`` trains on prompts without the injected experience (see :meth:`results`);
        each sample's ``exp_mask`` is then True exactly when its prompt had experience to strip, i.e. when
        its training context differs from the context the policy generated in.
        """
        results = self.results(strip_experience)
        common = {"context_manager": self.name, "num_samples": len(results), **(extras or {})}
        return [
            result.to_sample(task_id=task_id, group_id=group_id, rollout_id=rollout_id, reward=reward,
                             extras=common)
            for result in results
        ]

    def to_sample(self, **fields: Any) -> Sample:
        """The single sample of an episode (see :meth:`result`); takes :meth:`to_samples`' keywords
        (``strip_experience`` included)."""
        samples = self.to_samples(**fields)
        if len(samples) != 1:
            raise ValueError(f"context manager {self.name!r} produced {len(samples)} samples for this episode; "
                             "use to_samples()")
        return samples[0]

    def metrics(self) -> dict[str, float]:
        """Per-episode numbers for logging (counts of samples, clipped observations, ...)."""
        out = {key: float(value) for key, value in self._stats.items()}
        out["num_samples"] = float(len(self.results()))
        out["num_turns"] = float(len(self._turns))
        out["max_context_tokens"] = float(max((len(t) for t in self._timelines), default=0))
        out["exhausted"] = float(self.exhausted)
        return out

    # ------------------------------------------------------------------ internals
    def _expect(self, phase: _Phase, call: str) -> None:
        if self._phase != phase:
            wanted = {"new": "start()", "generate": "next_prompt_ids()/add_generation()",
                      "observe": "add_observation()", "done": "nothing (the episode is over)"}
            raise ContextOrderError(f"{self.name}: {call} called out of order; the next call must be "
                                    f"{wanted[self._phase]}")

    def _keep_length(self, ids: list[int]) -> int:
        """How many generated ids to keep: up to the first EOS, and no more than the budget allows."""
        keep = len(ids)
        eos = self.renderer.eos_id
        if eos in ids:
            keep = ids.index(eos) + 1
            if keep < len(ids):
                logger.warning("%s: dropped %d tokens generated after EOS", self.name, len(ids) - keep)
                self._stats["tokens_after_eos"] += len(ids) - keep
        room = self.remaining_budget()
        if keep > room:
            logger.warning("%s: generation of %d tokens exceeds the remaining budget of %d; truncated "
                           "(pass remaining_budget() as max_tokens)", self.name, keep, room)
            keep = room
        return keep

    def _generated_text(self, ids: list[int], text: str | None) -> str:
        """Text of a generation for the record: the given text or the decoded ids, without a trailing EOS."""
        eos = self.renderer.eos_text
        if text is None:
            text = self.renderer.decode(ids[:-1] if ids and ids[-1] == self.renderer.eos_id else ids)
        return text[: -len(eos)] if text.endswith(eos) else text

    def _observation(self, message: ChatMessage, step: int) -> ContextMessage:
        """An environment message with its content clipped to ``max_env_len`` tokens."""
        content, removed = clip_text_to_tokens(
            message.content, self.config.max_env_len, self.renderer, self.config.env_clip_marker
        )
        if removed:
            self._stats["clipped_observations"] += 1
            self._stats["observation_tokens_removed"] += removed
            message = message.model_copy(update={"content": content})
        return ContextMessage(message, Author.ENV, step=step, tokens_removed=removed)

    def _advance(self, rendered: RenderedContext) -> bool:
        """Append ``rendered`` to the current sample if it extends it, else start a new sample; False (and
        nothing appended) when the result would leave no room for a generation."""
        current = self._timelines[-1]
        if current.is_prefix_of(rendered.ids):
            extension = rendered.ids[len(current):]
            reason = self._overflow(len(rendered.ids), len(current.response_ids) + len(extension))
            if reason:
                return self._stop(reason, len(extension))
            current.append_observation(extension, list(rendered.items))
            return True
        reason = self._overflow(len(rendered.ids), 0, prompt_len=len(rendered.ids))
        if reason:
            return self._stop(reason, len(rendered.ids))
        if self.append_only:
            logger.warning("%s: the chat template rewrote earlier turns; starting a new sample", self.name)
        self._timelines.append(self._fresh_timeline(rendered))
        return True

    def _stop(self, reason: BudgetReason, tokens: int) -> bool:
        self._exhausted_reason = reason
        logger.info("%s: %d new context tokens would exceed the %s budget; episode context is full",
                    self.name, tokens, reason)
        return False

    def _overflow(self, context_len: int, response_len: int, prompt_len: int | None = None) -> BudgetReason | None:
        """Which budget a context of this size breaks (leaving fewer than ``min_generation_tokens``)."""
        need = self.config.min_generation_tokens
        if context_len + need > self.config.max_model_len:
            return "window"
        if self.config.max_response_len is not None and response_len + need > self.config.max_response_len:
            return "response"
        if prompt_len is not None and self.config.max_prompt_len is not None and prompt_len > self.config.max_prompt_len:
            return "prompt"
        return None

    def _fresh_timeline(self, rendered: RenderedContext) -> Timeline:
        """A new sample whose prompt is ``rendered``: policy messages in it are history, not trained here.

        The rendered items are kept as they are (``prompt_messages``) so the prompt can be rendered again
        without the experience; every context is rendered with the generation header (``next_context``).
        """
        items = [m.replace(author=Author.LLM_DO_NOT_TRAIN) if m.author is Author.LLM else m for m in rendered.items]
        return Timeline(prompt_ids=list(rendered.ids), messages=items, prompt_messages=tuple(rendered.items),
                        experience_span=rendered.span_of(Author.EXPERIENCE))

    def _strip_experience(self, timeline: Timeline, result: ContextResult) -> ContextResult:
        """``result`` with its prompt rendered again from the timeline's prompt messages minus the experience.

        Why re-render and not edit what was generated with: a regex over decoded text can drift (the
        experience may contain template-like text such as ``<|im_end|>``, braces or regex metacharacters, and
        decode/encode is not an identity), and cutting the recorded token span is only right when the
        template lays out the message the experience was joined to the same way with or without it (true
        for the ChatML templates we ship, not for a template that trims or inspects contents). Rendering
        the same messages without the experience item, through the same renderer and template with the
        same generation header, gives by construction the prompt that an episode without experience would
        have had, given the same generations and observations. The span cut is still computed as a
        consistency check and a mismatch is logged at DEBUG; the re-rendered ids are used either way. A prompt without experience is returned as it is.
        """
        if timeline.experience_span is None:
            return result
        stripped = self.renderer.render(timeline.prompt_messages_without_experience()).ids
        start, end = timeline.experience_span
        cut = timeline.prompt_ids[:start] + timeline.prompt_ids[end:]
        if stripped != cut:
            first = next((i for i, (a, b) in enumerate(zip(stripped, cut, strict=False)) if a != b),
                         min(len(stripped), len(cut)))
            logger.debug("%s: sample %d: the re-rendered prompt without experience (%d tokens) differs from "
                         "the prompt with its experience span [%d, %d) cut (%d tokens) from token %d on; "
                         "the chat template lays out the host message differently without it. Using the "
                         "re-rendered prompt.", self.name, result.index, len(stripped), start, end, len(cut), first)
        return result.without_experience(stripped)
