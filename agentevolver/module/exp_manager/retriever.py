"""Experience for one episode: ask the memory service with the task's text, format the answer for the prompt.

Runs inside the agent flow, right after the environment's ``/create`` (the task's text is known only then)
and before the first generation, for episodes the experience plan marked (``EpisodeSpec.add_experience``).
The ``n`` rollouts of a task share one GRPO group id and one query, so the answer is fetched once per group
and per worker process (later rollouts of the group await the same request) instead of ``n`` times.

``exp_manager.experience_kind`` picks what is asked for: ``advice`` sends ReMe's plain request and formats
the answer with ``experience_template`` (text appended to the task); ``exemplar`` asks for exemplars only,
never of the episode's own task, and returns their stored messages as chat turns (the most similar solved
episodes, the most similar last), which the context manager puts before the task's question, as the
environment's own demonstrations are. Text after the question did not work: SmolLM2-135M solved 0 of 32
calc tasks with the example written there, and 21 of 32 with it as turns (issue 24's measurement).

A memory service that is down, slow or failing never fails an episode: the episode runs without
experience and reports the failure (``exp/retrieve_errors``), which the trainer sums into the step's
metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from agentevolver.client.http import ServiceClientError
from agentevolver.client.memory_client import MemoryClient, MemoryClientSettings
from agentevolver.schema.memory_wire import ADVICE, EXEMPLAR, ExperienceKind, TaskMemory
from agentevolver.schema.message import ChatMessage

__all__ = ["ExperienceRetriever", "Retrieval", "exemplar_turns", "format_experience", "in_policy_dialect",
           "task_query"]

logger = logging.getLogger(__name__)

#: Groups whose answers are kept per process; a step's groups fit many times over.
_CACHE_GROUPS = 4096


@dataclass(frozen=True)
class Retrieval:
    """What one episode got: advice text or exemplar turns to inject (None = nothing), and why not when it
    failed."""

    experience: str | list[ChatMessage] | None
    error: str | None = None
    seconds: float = 0.0


def exemplar_turns(memories: Sequence[TaskMemory], query: str) -> list[ChatMessage]:
    """The stored messages of retrieved exemplars as one run of chat turns, the most similar one last (next
    to the question it is an example for).

    An exemplar whose task text is the query itself is left out (a task must never be shown its own solved
    episode; memories without a ``task_id``, e.g. imported ones, are caught here), and so is one whose
    ``metadata.messages`` is missing or not chat messages (logged).
    """
    turns: list[ChatMessage] = []
    for memory in reversed(memories):
        if memory.when_to_use.strip() == query.strip():
            continue
        try:
            messages = [ChatMessage.model_validate(m) for m in memory.metadata.get("messages") or []]
        except ValidationError as err:
            logger.warning("exemplar %s has unreadable metadata.messages; skipped: %s", memory.memory_id, err)
            continue
        if not messages or messages[0].role != "user":
            logger.warning("exemplar %s does not start with its task's user message; skipped", memory.memory_id)
            continue
        turns += messages
    return turns


def in_policy_dialect(turns: Sequence[ChatMessage], parser: Any) -> list[ChatMessage]:
    """Exemplar turns as the policy would see its own: an assistant message whose text already holds its
    tool calls in the policy's dialect (``parser`` finds them) keeps that text and loses the structured
    ``tool_calls`` (else the chat template would show the calls twice); one whose calls exist only as
    ``tool_calls`` (the environments' demonstration form, or another dialect) keeps them, and the chat
    template writes them in its own dialect, as it does for the demonstrations."""
    out = []
    for message in turns:
        if message.role == "assistant" and message.tool_calls and message.content.strip() \
                and parser.parse(message.content).tool_calls:
            message = message.model_copy(update={"tool_calls": None})
        out.append(message)
    return out


def format_experience(template: str, answer: str) -> str:
    """The template with ``{}`` replaced by the answer (literally: braces in either are not format fields)."""
    return template.replace("{}", answer, 1)


def task_query(messages: Sequence[ChatMessage]) -> str:
    """The retrieval query of an episode: its task, i.e. the last user message of the opening messages."""
    for message in reversed(messages):
        if message.role == "user" and message.content:
            return message.content
    return messages[-1].content if messages else ""


class ExperienceRetriever:
    """Fetches and formats experience for episodes; one per worker process and run config.

    ``template`` (advice only) must hold ``{}`` where the retrieved text goes; exemplars need none.
    """

    def __init__(self, client: MemoryClient, *, workspace_id: str, top_k: int, template: str | None = None,
                 kind: ExperienceKind = ADVICE) -> None:
        if kind not in (ADVICE, EXEMPLAR):
            raise ValueError(f"exp_manager.experience_kind must be one of advice, exemplar; got {kind!r}")
        if kind == ADVICE and (template is None or "{}" not in template):
            raise ValueError("exp_manager.experience_template must contain '{}' where the retrieved text goes; "
                             f"got {template!r}")
        self.client = client
        self.workspace_id = workspace_id
        self.top_k = top_k
        self.template = template
        self.kind: ExperienceKind = kind
        self._groups: OrderedDict[str, asyncio.Future[Retrieval]] = OrderedDict()

    @classmethod
    def from_config(cls, config: Any) -> ExperienceRetriever:
        """From the run config's ``memory`` (service, workspace, top-k) and ``exp_manager`` (kind, template)."""
        memory, exp = config["memory"], config["exp_manager"]
        settings = MemoryClientSettings.from_config(memory)
        kind = str(exp["experience_kind"])
        return cls(MemoryClient(settings), workspace_id=str(memory["workspace_id"]),
                   top_k=int(memory["retrieve_top_k"]), template=str(exp["experience_template"]),
                   kind=kind)  # type: ignore[arg-type]

    async def for_episode(self, group_id: str, messages: Sequence[ChatMessage | Mapping[str, Any]],
                          task_id: str = "") -> Retrieval:
        """The experience of the group's task (fetched by the group's first episode, shared by the rest);
        exemplars of ``task_id`` itself are never returned."""
        chat = [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(dict(m)) for m in messages]
        loop = asyncio.get_running_loop()
        future = self._groups.get(group_id)
        if future is not None and future.get_loop() is loop:
            return await asyncio.shield(future)
        future = loop.create_future()
        self._groups[group_id] = future
        while len(self._groups) > _CACHE_GROUPS:
            self._groups.popitem(last=False)
        try:
            result = await self._fetch(task_query(chat), task_id)
        except BaseException as err:  # cancelled or a bug: never leave the group's other episodes waiting
            self._groups.pop(group_id, None)
            future.set_result(Retrieval(None, error=f"retrieval did not finish: {type(err).__name__}: {err}"))
            raise
        future.set_result(result)
        return result

    async def _fetch(self, query: str, task_id: str) -> Retrieval:
        started = time.perf_counter()
        try:
            if self.kind == EXEMPLAR:
                response = await self.client.aretrieve(self.workspace_id, query, self.top_k, experience_kind=EXEMPLAR,
                                                       exclude_task_ids=[task_id] if task_id else None)
            else:  # advice sends neither field: ReMe's own request, so a real ReMe server answers it
                response = await self.client.aretrieve(self.workspace_id, query, self.top_k)
        except (ServiceClientError, OSError) as err:
            logger.warning("experience retrieval failed; this episode runs without experience: %s", err)
            return Retrieval(None, error=str(err), seconds=time.perf_counter() - started)
        seconds = time.perf_counter() - started
        if self.kind == EXEMPLAR:
            turns = exemplar_turns(response.metadata.memory_list, query)
            return Retrieval(turns or None, seconds=seconds)
        answer = response.answer.strip()
        assert self.template is not None
        return Retrieval(format_experience(self.template, answer) if answer else None, seconds=seconds)
