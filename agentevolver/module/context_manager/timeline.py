"""One growing token sequence (a future training sample) and the finished result it becomes.

A context manager appends to its current :class:`Timeline` as long as each new context extends the
previous one token for token (prompt + everything generated and observed so far is a prefix of it). When
a manager rewrites history (stripped thoughts, a memory summary, an archive), the next context is no longer
such an extension; the current timeline is closed and a new one starts with the new context as its
prompt. So every sample is exactly one sequence the model read and wrote, and every generated token is
trained once, in the sample whose prompt is what the model actually saw when it generated that token.

Experience stripping (Self-Navigating's "discard" mode): a timeline keeps the messages its prompt was
rendered from (:attr:`Timeline.prompt_messages`), so the context manager can render that prompt again
without the injected experience (:meth:`ContextResult.without_experience` takes the re-rendered ids). Only
the prompt changes; the response (generated ids, observation chunks, masks, logprobs, step ids) is kept
token for token, because the experience is only ever part of a prompt: every manager puts the opening
messages, and the experience joined to them, at the start of every context.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from agentevolver.module.context_manager.messages import Author, ContextMessage
from agentevolver.schema.sample import Sample
from agentevolver.schema.trajectory import Reward

__all__ = ["ContextResult", "Timeline"]


@dataclass
class Timeline:
    """A prompt plus an interleaved response: policy tokens (mask 1) and observation tokens (mask 0).

    ``messages`` is the conversation as a record (policy turns in the prompt re-authored as history; it grows
    with the response); ``prompt_messages`` are the items ``prompt_ids`` were rendered from, exactly as the
    renderer got them (with the generation header, as every context is), so the prompt can be rendered again
    (e.g. without the experience) to the same layout.
    """

    prompt_ids: list[int]
    messages: list[ContextMessage]
    prompt_messages: tuple[ContextMessage, ...]
    experience_span: tuple[int, int] | None = None
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    step_ids: list[int] = field(default_factory=list)
    num_generations: int = 0
    #: Length of the response up to and including the last generated token (trailing observations cut).
    trained_end: int = 0
    #: How many of ``messages`` that part holds (the prompt's messages until a token is generated).
    trained_messages: int = -1

    def __post_init__(self) -> None:
        if self.trained_messages < 0:
            self.trained_messages = len(self.messages)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def sequence(self) -> list[int]:
        """Everything the model reads next: prompt then response."""
        return self.prompt_ids + self.response_ids

    def is_prefix_of(self, ids: list[int]) -> bool:
        """True when ``ids`` continues this sequence without changing any token of it."""
        n_prompt, n_all = len(self.prompt_ids), len(self)
        return (len(ids) >= n_all and ids[:n_prompt] == self.prompt_ids
                and ids[n_prompt:n_all] == self.response_ids)

    def prompt_messages_without_experience(self) -> list[ContextMessage]:
        """The prompt's items minus the injected experience: what the prompt would have been without it.

        The experience is a ``join_previous`` span appended to an opening message (advice) or whole turns
        before the task's question (exemplars); dropping its items leaves every other message (and any other
        span joined to one, e.g. ``linear_think``'s hint) exactly as it was.
        """
        return [item for item in self.prompt_messages if item.author is not Author.EXPERIENCE]

    def append_observation(self, ids: list[int], messages: list[ContextMessage]) -> None:
        """Context tokens (template closings, observations, headers): mask 0, logprob 0.0, step -1.

        ``messages`` is the whole context just rendered; policy turns that were already in this sample's
        prompt stay authored as history (they are trained in the sample that generated them, not here).
        """
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        self.response_logprobs += [0.0] * len(ids)
        self.step_ids += [-1] * len(ids)
        history = {id(item) for item in self.prompt_messages if item.author is Author.LLM}
        self.messages = [item.replace(author=Author.LLM_DO_NOT_TRAIN) if id(item) in history else item
                         for item in messages]

    def append_generation(self, ids: list[int], logprobs: list[float] | None, step: int,
                          message: ContextMessage) -> None:
        """Policy tokens exactly as generated: mask 1, their rollout logprobs, the step index."""
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        self.response_logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.step_ids += [step] * len(ids)
        self.messages.append(message)
        self.num_generations += 1
        if ids:  # an empty generation adds nothing to train on; the sample still ends at the last token
            self.trained_end = len(self.response_ids)
            self.trained_messages = len(self.messages)

    def result(self, with_logprobs: bool, index: int) -> ContextResult:
        """The finished sample: the response ends at the last generated token (observations after it carry
        no loss, and verl puts the reward on the last response token, which must be the policy's)."""
        end = self.trained_end
        messages = self.messages[: self.trained_messages]
        return ContextResult(
            prompt_ids=list(self.prompt_ids),
            response_ids=self.response_ids[:end],
            response_mask=self.response_mask[:end],
            response_logprobs=self.response_logprobs[:end] if with_logprobs else None,
            step_ids=self.step_ids[:end],
            messages=messages,
            experience_span=self.experience_span,
            num_generations=self.num_generations,
            index=index,
        )


@dataclass(frozen=True)
class ContextResult:
    """One training sample of an episode, before the trainer adds ids, rewards and advantages.

    ``messages`` is the conversation this sample renders (what the model saw at its last turn plus what it
    generated), each with its author; ``experience_span`` is ``[start, end)`` of the injected experience in
    ``prompt_ids`` (None when there is none).

    A result whose experience was stripped (:meth:`without_experience`, via
    ``ContextManager.results(strip_experience=True)``) has the re-rendered prompt in ``prompt_ids``,
    ``experience_span`` None, no experience item in ``messages``, and ``experience_span_generated`` = where
    the experience was in the prompt the model generated from. Its training context then differs from its
    generation context, which is what ``Sample.exp_mask`` says (:meth:`to_sample` sets it from this).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    step_ids: list[int]
    messages: list[ContextMessage]
    experience_span: tuple[int, int] | None
    num_generations: int
    index: int = 0
    experience_span_generated: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.experience_span_generated is not None and self.experience_span is not None:
            raise ValueError("a result whose experience was stripped has no experience_span left")

    @property
    def experience_stripped(self) -> bool:
        """True when ``prompt_ids`` is the re-rendered prompt without the experience the model generated with."""
        return self.experience_span_generated is not None

    def without_experience(self, prompt_ids: list[int]) -> ContextResult:
        """This result with ``prompt_ids`` (the prompt re-rendered without the experience) as its prompt.

        The response lists are shared unchanged: the experience lives in the prompt only, and the response
        is what the policy generated and observed, which stripping must not touch.
        """
        if self.experience_span is None:
            raise ValueError("this result's prompt holds no experience span; there is nothing to strip")
        return dataclasses.replace(
            self,
            prompt_ids=list(prompt_ids),
            messages=[message for message in self.messages if message.author is not Author.EXPERIENCE],
            experience_span=None,
            experience_span_generated=self.experience_span,
        )

    def to_sample(
        self,
        *,
        task_id: str,
        group_id: str,
        rollout_id: int = 0,
        reward: Reward | None = None,
        extras: dict[str, Any] | None = None,
    ) -> Sample:
        """A validated :class:`Sample`; messages and the experience span travel in ``extras``.

        ``exp_mask`` is not a choice here: it is True exactly when the experience was stripped, i.e. when
        the training context (``prompt_ids``) differs from the context the policy generated in.
        """
        merged: dict[str, Any] = {
            "messages": [message.to_dict() for message in self.messages],
            "experience_span": list(self.experience_span) if self.experience_span else None,
            "experience_stripped": self.experience_stripped,
            "experience_span_generated": (list(self.experience_span_generated)
                                          if self.experience_span_generated else None),
            "sample_index": self.index,
            "num_generations": self.num_generations,
        }
        merged.update(extras or {})
        return Sample(
            task_id=task_id,
            group_id=group_id,
            rollout_id=rollout_id,
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            response_mask=self.response_mask,
            response_logprobs=self.response_logprobs,
            step_ids=self.step_ids,
            exp_mask=self.experience_stripped,
            reward=reward if reward is not None else Reward(),
            extras=merged,
        )
