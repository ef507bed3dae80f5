"""The gateway's routes: OpenAI's chat completions, Responses API and model list per episode, and the reward
report.

Every route reaches the :class:`~agentevolver.gateway.episodes.Gateway` through ``app.state.gateway``.
Errors are OpenAI's ``{"error": {message, type, param, code}}``: 400 a field (named), 404 an episode this
gateway never opened, 409 an episode that has finished, 500 a failed generation.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from openai.types import Model
from openai.types.chat import ChatCompletion
from openai.types.responses import Response as ResponsesReply

from agentevolver.gateway.episodes import Gateway
from agentevolver.gateway.responses import answer_response, response_events
from agentevolver.llm_server.replies import chat_chunks, dump
from agentevolver.llm_server.routes import errors
from agentevolver.schema.gateway_wire import GatewayChatRequest, RewardReport, RewardReportAck
from agentevolver.schema.llm_wire import ModelList
from agentevolver.schema.responses_wire import ResponsesRequest

__all__ = ["router"]


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(_gateway)]

router = APIRouter()


@router.get("/stats", response_model=dict[str, int])
async def stats(gateway: GatewayDep) -> dict[str, int]:
    """Counters of this gateway: episodes opened, closed and open now; calls answered and refused."""
    return {**gateway.counters, "open": len(gateway.episodes)}


@router.get("/episodes/{episode_id}/v1/models", response_model=ModelList, responses=errors(404, 409))
async def models(episode_id: str, gateway: GatewayDep) -> dict[str, Any]:
    """The one model an episode talks to: the policy being trained."""
    gateway.get(episode_id)
    card = Model(id=gateway.served_name, created=int(time.time()), object="model", owned_by="agentevolver")
    max_len = int(gateway.context_config.max_model_len)
    return {"object": "list", "data": [{**dump(card), "max_model_len": max_len}]}


@router.post("/episodes/{episode_id}/v1/chat/completions", response_model=ChatCompletion, responses={
    200: {"content": {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}}}},
          "description": "The completion (JSON), or server-sent events with 'stream: true'."},
    **errors(400, 404, 409, 500)})
async def chat_completions(episode_id: str, body: GatewayChatRequest, gateway: GatewayDep) -> Response:
    """One call of the episode's program, answered by the policy and recorded token for token
    (:mod:`agentevolver.gateway.calls`)."""
    response, token_ids = await gateway.chat(episode_id, body)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(chat_chunks(response, include_usage), media_type="text/event-stream")
    data = dump(response)
    if token_ids:
        data["prompt_token_ids"] = token_ids["prompt_token_ids"]
        data["choices"][0]["token_ids"] = token_ids["token_ids"]
    return JSONResponse(data)


@router.post("/episodes/{episode_id}/v1/responses", response_model=ResponsesReply, responses={
    200: {"content": {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}}},
          "description": "The response (JSON), or server-sent events with 'stream: true'."},
    **errors(400, 404, 409, 500)})
async def responses(episode_id: str, body: ResponsesRequest, gateway: GatewayDep) -> Response:
    """One Responses API call of the episode's program, answered and recorded as the chat-completions call it
    stands for (:mod:`agentevolver.gateway.responses`)."""
    response = await answer_response(gateway, episode_id, body)
    if body.stream:
        return StreamingResponse(response_events(response), media_type="text/event-stream")
    return JSONResponse(dump(response))


@router.post("/episodes/{episode_id}/reward", response_model=RewardReportAck, responses=errors(400, 404, 409))
async def reward(episode_id: str, body: RewardReport, gateway: GatewayDep) -> dict[str, Any]:
    """The program's own score of its episode (``agent_program.reward: program``); a later report replaces
    an earlier one."""
    gateway.report(episode_id, body)
    return {"episode_id": episode_id, "reward": body.reward}
