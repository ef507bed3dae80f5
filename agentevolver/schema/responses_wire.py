"""Wire models of the agent gateway's Responses API (``POST /episodes/<id>/v1/responses``).

Newer agent SDKs (the OpenAI Agents SDK by default, Codex-style clients) speak OpenAI's Responses API instead
of Chat Completions. The gateway answers it by turning each request into the chat-completions call it stands
for (:mod:`agentevolver.gateway.responses`), so both APIs share one recording path: token in, token out, and
a call that continues an earlier one extends its sample.

What a request may hold:

- ``input``: a string (one user message) or a list of items: messages (``role`` user / system / developer /
  assistant, ``content`` a string or text parts), ``function_call`` (a call the model made, echoed back) and
  ``function_call_output`` (its result). Other item kinds (images, files, reasoning, built-in tool calls,
  item references) are refused with a 400 naming the item.
- ``instructions``: the system message, put first; it is not carried over by ``previous_response_id``, as in
  OpenAI's API.
- ``previous_response_id``: continue a stored response (``store`` defaults to true): the earlier request's
  input items and its output come before this request's ``input``.
- ``tools``: ``function`` tools only (flat: ``name``, ``description``, ``parameters``, ``strict``).
- ``stream``: the reply as server-sent events (``response.created`` ... ``response.completed``).

Sampling is the run's, as on the chat route: ``temperature`` and ``top_p`` are accepted and ignored, and so
are fields that change nothing here (``include``, ``metadata``, ``reasoning``, ``truncation``, cache keys).
What would make the recorded tokens other than the policy's own sample (a JSON ``text.format``), or what the
gateway cannot honour (``background``, ``conversation``, ``prompt`` templates), is refused with a 400 naming
the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentevolver.schema.llm_wire import FieldError

__all__ = ["ResponsesRequest", "ResponsesTool"]


class ResponsesTool(BaseModel):
    """A ``function`` tool in the Responses API's flat form."""

    model_config = ConfigDict(extra="ignore")

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _function_only(self) -> ResponsesTool:
        if self.type != "function":  # a ValueError: the 400 then names tools.<i>, not a bare "type"
            raise ValueError(f"tools of type {self.type!r} are not served by the training gateway (the policy only "
                             "calls function tools); give your tools as type 'function'")
        if not self.name:
            raise ValueError("a function tool needs its name")
        return self


class ResponsesRequest(BaseModel):
    """``POST /episodes/{episode_id}/v1/responses`` (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(default="policy", min_length=1)
    input: str | list[dict[str, Any]] = Field(description="A user message, or a list of input items.")
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_tool_calls: int | None = Field(default=None, ge=1)
    text: dict[str, Any] | None = None
    # accepted and ignored: the run's rollout settings sample every call; the rest changes nothing here
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    stream_options: dict[str, Any] | None = None
    # refused (named): what the gateway cannot honour
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _trainable_only(self) -> ResponsesRequest:
        if self.background:
            raise FieldError("background", "background responses are not served by the training gateway: an "
                                           "episode's calls are answered while its program waits; leave it out")
        if self.conversation is not None:
            raise FieldError("conversation", "conversations are not kept by the training gateway; continue a "
                                             "response with previous_response_id, or send the whole input")
        if self.prompt is not None:
            raise FieldError("prompt", "stored prompt templates are not served by the training gateway; send "
                                       "instructions and input instead")
        text_format = (self.text or {}).get("format") or {}
        if text_format.get("type", "text") != "text":
            raise FieldError("text.format", "text.format json_object/json_schema is not supported by the training "
                                            "gateway: constrained decoding would train the policy on tokens it did "
                                            "not sample; leave it out")
        if isinstance(self.tool_choice, dict) and not (self.tool_choice.get("type") == "function"
                                                       and self.tool_choice.get("name")):
            raise FieldError("tool_choice", "tool_choice must be 'none', 'auto', 'required' or "
                                            "{'type': 'function', 'name': ...}")
        return self
