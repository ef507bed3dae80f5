"""The gateway's episodes: which are open, and how one chat-completions call is answered for one of them.

Kept apart from the HTTP routes (:mod:`.routes`) so the logic is one plain object: :class:`Gateway` holds the
open episodes by id, the policy's tokenizer and tool-call parser, and the generate function of the run's
rollout servers (verl's server manager: the CPU ``hf`` rollout server, vLLM on GPU), token in and token out.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletion

from agentevolver.gateway.calls import BudgetExhausted, CallRecord, EpisodeCalls
from agentevolver.llm_server.engine import Choice, TokenLogprob
from agentevolver.llm_server.errors import ServerError
from agentevolver.llm_server.replies import chat_response, dump, usage_of
from agentevolver.module.agent_flow.flow import GenerateFn
from agentevolver.schema.gateway_wire import GatewayChatRequest, RewardReport
from agentevolver.schema.message import ChatMessage

__all__ = ["Gateway", "GatewayEpisode"]

logger = logging.getLogger(__name__)

#: How many closed episode ids are remembered, so a late call gets 409 ("finished") rather than 404.
_CLOSED_KEPT = 4096


@dataclass
class GatewayEpisode:
    """One open episode: its calls, the run's sampling settings for it, and what its program reported."""

    episode_id: str
    request_id: str
    sampling_params: dict[str, Any]
    calls: EpisodeCalls
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reported: RewardReport | None = None
    closed: bool = False
    #: Calls refused: a bad request (400), a full context or too many calls; and generations that failed.
    refused: int = 0
    generate_errors: int = 0
    max_steps_hit: bool = False
    #: Responses API: each stored response's conversation (chat messages, its reply last), by response id, for
    #: ``previous_response_id`` (:mod:`agentevolver.gateway.responses`); gone with the episode.
    stored_responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


class Gateway:
    """Open episodes by id and the answer to each call (see the module docstring).

    ``max_calls`` is ``agent_flow.max_steps``; ``max_tokens_per_turn`` caps each call as it caps each turn
    of the agent flow. ``served_name`` is the model name ``/v1/models`` lists and programs are told to send;
    a reply carries the name its request sent, so a program written for another model name runs unchanged.
    """

    def __init__(self, *, tokenizer: Any, generate: GenerateFn, parser: Any, context_template: str,
                 context_config: Any, served_name: str, max_calls: int, max_tokens_per_turn: int | None) -> None:
        self.tokenizer = tokenizer
        self.generate = generate
        self.parser = parser
        self.context_template = context_template
        self.context_config = context_config
        self.served_name = served_name
        self.max_calls = max_calls
        self.max_tokens_per_turn = max_tokens_per_turn
        self.stop_token_ids: list[int] = parser.stop_token_ids(tokenizer)
        self.episodes: dict[str, GatewayEpisode] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()
        self.counters: dict[str, int] = {"calls": 0, "refused": 0, "opened": 0, "closed": 0}

    # ------------------------------------------------------------------ episodes
    def open(self, episode_id: str, *, request_id: str, sampling_params: Mapping[str, Any],
             experience: str | Sequence[ChatMessage] | None = None) -> GatewayEpisode:
        calls = EpisodeCalls(tokenizer=self.tokenizer, context_template=self.context_template,
                             context_config=self.context_config, experience=experience)
        episode = GatewayEpisode(episode_id, request_id, dict(sampling_params), calls)
        self.episodes[episode_id] = episode
        self.counters["opened"] += 1
        return episode

    async def close(self, episode_id: str) -> GatewayEpisode:
        """Close an episode: a call still running finishes first; later calls get 409."""
        episode = self.episodes.pop(episode_id)
        async with episode.lock:
            episode.closed = True
        self._closed[episode_id] = None
        while len(self._closed) > _CLOSED_KEPT:
            self._closed.popitem(last=False)
        self.counters["closed"] += 1
        return episode

    def get(self, episode_id: str) -> GatewayEpisode:
        """The open episode, or the 404 (never opened) / 409 (already finished) that names it."""
        episode = self.episodes.get(episode_id)
        if episode is not None and not episode.closed:
            return episode
        if episode is not None or episode_id in self._closed:
            raise ServerError(409, f"episode {episode_id!r} has finished: its program's time is up or it returned; "
                                   "a program must not call after that", param="episode_id", type_="conflict",
                              code="episode_finished")
        raise ServerError(404, f"no episode {episode_id!r} on this gateway: use the base_url the episode's task "
                               "gave (…/episodes/<id>/v1)", param="episode_id", code="episode_not_found")

    def report(self, episode_id: str, report: RewardReport) -> None:
        episode = self.get(episode_id)
        episode.reported = report

    # ------------------------------------------------------------------ one call
    async def chat(self, episode_id: str, body: GatewayChatRequest) -> tuple[ChatCompletion, dict[str, Any]]:
        """Answer one call: the reply as the SDK's model, and the token ids asked for (``return_token_ids``:
        ``prompt_token_ids`` for the reply's top level, ``token_ids`` for its choice)."""
        episode = self.get(episode_id)
        async with episode.lock:
            episode = self.get(episode_id)  # it may have closed while this call waited for the lock
            self.counters["calls"] += 1
            try:
                return await self._answer(episode, body)
            except ServerError as err:
                if err.status < 500:
                    episode.refused += 1
                    self.counters["refused"] += 1
                raise

    async def _answer(self, episode: GatewayEpisode, body: GatewayChatRequest) -> tuple[ChatCompletion, dict[str, Any]]:
        calls = episode.calls
        if calls.num_calls >= self.max_calls:
            episode.max_steps_hit = True
            raise ServerError(400, f"this episode made {calls.num_calls} calls, its limit (agent_flow.max_steps); "
                                   "end the episode", code="max_calls_exceeded")
        messages = [message.for_template() for message in body.messages]
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
        limit = body.completion_limit
        if self.max_tokens_per_turn is not None:
            limit = min(limit, self.max_tokens_per_turn) if limit is not None else self.max_tokens_per_turn
        try:
            call = calls.prepare(messages, tools, limit)
        except BudgetExhausted as err:
            raise ServerError(400, str(err), param="messages", code="context_length_exceeded") from err
        except ValueError as err:
            raise ServerError(400, f"messages: the policy's chat template cannot render them ({err})",
                              param="messages") from err
        params: dict[str, Any] = {**episode.sampling_params, "max_tokens": call.max_tokens, "logprobs": True}
        if self.stop_token_ids:
            params["stop_token_ids"] = sorted({*(params.get("stop_token_ids") or ()), *self.stop_token_ids})
        try:
            output = await self.generate(episode.request_id, prompt_ids=call.prompt_ids, sampling_params=params)
        except Exception as err:
            calls.abandon(call)
            episode.generate_errors += 1
            logger.warning("gateway episode %s: generation failed: %s", episode.episode_id, err)
            raise ServerError(500, f"generation failed: {type(err).__name__}: {err}", type_="server_error") from err
        record = calls.record(call, output.token_ids, output.log_probs)
        response = self._response(record, output.log_probs, body, tools)
        calls.answered(call, dump(response.choices[0].message))
        extra: dict[str, Any] = {}
        if body.return_token_ids:  # vLLM's fields: the prompt's ids at the top, the reply's in its choice
            extra = {"prompt_token_ids": list(record.prompt_ids), "token_ids": list(record.response_ids)}
        return response, extra

    def _response(self, record: CallRecord, log_probs: Sequence[float] | None, body: GatewayChatRequest,
                  tools: list[dict[str, Any]] | None) -> ChatCompletion:
        """The reply, built as the local LLM server builds its replies (tool calls parsed out of the text)."""
        items = None
        if body.logprobs:
            items = [TokenLogprob(self.tokenizer.decode([token]), float(lp))
                     for token, lp in zip(record.response_ids, log_probs or [0.0] * len(record.response_ids),
                                          strict=False)]
        choice = Choice(text=record.text, finish_reason=record.finish_reason,
                        completion_tokens=len(record.response_ids), logprobs=items)
        response = chat_response(body.model, [choice], usage_of(len(record.prompt_ids), [choice]),
                                 self.parser if body.parse_tools else None, tools)
        return response
