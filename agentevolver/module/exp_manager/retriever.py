"""Experience for one episode: ask the memory service with the task's text, format the answer for the prompt.

Runs inside the agent flow, right after the environment's ``/create`` (the task's text is known only then)
and before the first generation, for episodes the experience plan marked (``EpisodeSpec.add_experience``).
The ``n`` rollouts of a task share one GRPO group id and one query, so the answer is fetched once per group
and per worker process (later rollouts of the group await the same request) instead of ``n`` times.

``exp_manager.experience_kind`` picks what is asked for: ``advice`` sends ReMe's plain request and formats
the answer with ``experience_template``; ``exemplar`` asks for exemplars only (the most similar solved
episodes, already rendered as worked examples by the service) and formats them with ``exemplar_template``.

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

from agentevolver.client.http import ServiceClientError
from agentevolver.client.memory_client import MemoryClient, MemoryClientSettings
from agentevolver.schema.memory_wire import ADVICE, EXEMPLAR, ExperienceKind
from agentevolver.schema.message import ChatMessage

__all__ = ["ExperienceRetriever", "Retrieval", "format_experience", "task_query"]

logger = logging.getLogger(__name__)

#: Groups whose answers are kept per process; a step's groups fit many times over.
_CACHE_GROUPS = 4096


@dataclass(frozen=True)
class Retrieval:
    """What one episode got: the text to inject (None = nothing to inject), and why not when it failed."""

    experience: str | None
    error: str | None = None
    seconds: float = 0.0


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
    """Fetches and formats experience for episodes; one per worker process and run config."""

    def __init__(self, client: MemoryClient, *, workspace_id: str, top_k: int, template: str,
                 kind: ExperienceKind = ADVICE) -> None:
        if kind not in (ADVICE, EXEMPLAR):
            raise ValueError(f"exp_manager.experience_kind must be one of advice, exemplar; got {kind!r}")
        if "{}" not in template:
            raise ValueError(f"the {kind} template must contain '{{}}' where the retrieved text goes; got {template!r}")
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
        template = exp["exemplar_template"] if kind == EXEMPLAR else exp["experience_template"]
        return cls(MemoryClient(settings), workspace_id=str(memory["workspace_id"]),
                   top_k=int(memory["retrieve_top_k"]), template=str(template), kind=kind)  # type: ignore[arg-type]

    async def for_episode(self, group_id: str, messages: Sequence[ChatMessage | Mapping[str, Any]]) -> Retrieval:
        """The experience of the group's task (fetched by the group's first episode, shared by the rest)."""
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
            result = await self._fetch(task_query(chat))
        except BaseException as err:  # cancelled or a bug: never leave the group's other episodes waiting
            self._groups.pop(group_id, None)
            future.set_result(Retrieval(None, error=f"retrieval did not finish: {type(err).__name__}: {err}"))
            raise
        future.set_result(result)
        return result

    async def _fetch(self, query: str) -> Retrieval:
        started = time.perf_counter()
        try:
            # advice sends no experience_kind: ReMe's own request, so a real ReMe server answers it
            kind = EXEMPLAR if self.kind == EXEMPLAR else None
            response = await self.client.aretrieve(self.workspace_id, query, self.top_k, experience_kind=kind)
        except (ServiceClientError, OSError) as err:
            logger.warning("experience retrieval failed; this episode runs without experience: %s", err)
            return Retrieval(None, error=str(err), seconds=time.perf_counter() - started)
        answer = response.answer.strip()
        text = format_experience(self.template, answer) if answer else None
        return Retrieval(text, seconds=time.perf_counter() - started)
