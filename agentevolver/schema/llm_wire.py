"""Wire models of the local LLM server's OpenAI-compatible routes: request bodies, and the answers the SDK lacks.

Requests are our own pydantic models (the ``openai`` SDK ships request *TypedDicts*, whose validation
errors would name union branches rather than the field); chat and text completions are answered with the
SDK's own pydantic models (``openai.types``), so what the server sends is exactly what the official client
parses. The answers the SDK has no model for (``/v1/models`` with ``max_model_len``, ``/stats``, the error
body) are declared here. They live under ``schema``, next to the env and memory contracts, so that a
client or a test reads the contract without importing the server.

Policy for fields, chosen so that a request never means something other than what the caller wrote:

* unknown top-level fields are rejected (400 naming the field, with a close match if there is one), as
  the OpenAI API does, so a typo such as ``max_token`` is reported rather than ignored;
* OpenAI fields whose effect this server cannot produce (``top_logprobs > 0``, penalties, ``logit_bias``) are
  accepted only at their neutral value, else 400;
* ``response_format`` ``json_object`` / ``json_schema`` is enforced by grammar-constrained decoding
  (:mod:`agentevolver.llm_server.structured`); a schema it cannot enforce is a 400 naming the field inside it;
* ``tool_choice`` ``required`` or a named function is enforced the same way: the reply is decoded as the
  call(s) the tools' parameter schemas allow (:mod:`agentevolver.llm_server.forced_calls`);
* fields with no effect on the output (``user``, ``metadata``, ``store``, ``service_tier``,
  ``parallel_tool_calls`` without a forced ``tool_choice``, ``stream_options`` of a non-streamed request) are
  accepted and ignored;
* vLLM's extra sampling fields that the CPU generator implements (``top_k``, ``repetition_penalty``,
  ``stop_token_ids``, ``ignore_eos``, ``chat_template_kwargs``) are accepted, so a role can move between
  vLLM and this server without changing its requests.

Message objects themselves ignore unknown keys, as vLLM does: callers forward stored conversations whose
messages carry bookkeeping fields. A validator that rejects a combination of fields raises
:class:`FieldError`, so the server's 400 names the field to change rather than the body's root.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "ChatCompletionRequest",
    "ChatMessageIn",
    "CompletionRequest",
    "ErrorBody",
    "ErrorInfo",
    "FieldError",
    "ModelCard",
    "ModelList",
    "ResponseFormat",
    "ServerStats",
]


class FieldError(ValueError):
    """Raised in a model validator to name the field at fault (pydantic reports model errors at the root)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class ErrorInfo(BaseModel):
    """OpenAI's error object; ``param`` names the request field (or header) to change."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every error answer of this server (declared in the OpenAPI document for each route)."""

    error: ErrorInfo


class ModelCard(BaseModel):
    """One entry of ``GET /v1/models`` (OpenAI's model object plus vLLM's ``max_model_len``)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    """``GET /v1/models``: the one model this server serves."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class ServerStats(BaseModel):
    """``GET /stats``: the generator's batch counters, request counters and structured-output counters."""

    model: str
    generator: dict[str, Any]
    server: dict[str, int]
    structured: dict[str, Any]


# -- messages ------------------------------------------------------------------------------------------------


class TextPart(BaseModel):
    """One part of a multi-part message content; only text exists for a text-only model."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text"] = Field(
        description="Only 'text' parts are accepted: the served model reads text only."
    )
    text: str


class FunctionCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(BaseModel):
    """An earlier assistant tool call, replayed in the conversation (rendered by the chat template)."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(BaseModel):
    """One conversation message: system/developer, user, assistant (text and/or tool calls) or tool."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        """One clear error for an image/audio part, instead of one per branch of the content union."""
        if isinstance(value, list):
            for index, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind != "text":
                    raise ValueError(
                        f"part {index} has type {kind!r}: only {{'type': 'text', 'text': ...}} parts are accepted "
                        "(the served model reads text only)"
                    )
        elif value is not None and not isinstance(value, str):
            raise ValueError(f"must be a string or a list of text parts; got {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _content_needed(self) -> ChatMessageIn:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role!r} message needs 'content' (only assistant tool-call turns may omit it)")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it (``developer`` is rendered as ``system``)."""
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionSchema(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: FunctionSchema


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: dict[str, Any]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: OpenAI's named schema (``strict`` is accepted; every schema is enforced)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                      description="Letters, digits, '_' and '-', at most 64 (OpenAI's rule).")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON Schema every reply must validate against.")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: ``text`` (default), ``json_object`` (any JSON object) or ``json_schema``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise FieldError("response_format.json_schema", "response_format type 'json_schema' needs "
                              "response_format.json_schema: {'name': ..., 'schema': {...}}")
        if self.type != "json_schema" and self.json_schema is not None:
            raise FieldError("response_format.json_schema",
                              f"response_format.json_schema is only read with type 'json_schema' (got {self.type!r})")
        return self


# -- requests ------------------------------------------------------------------------------------------------


class _SamplingFields(BaseModel):
    """Fields shared by chat and text completions (OpenAI names, plus vLLM's extra sampling fields)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0, description="0 = greedy; default 1.0")
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, description="vLLM extra; -1 or 0 = off")
    repetition_penalty: float | None = Field(default=None, gt=0, description="vLLM extra; 1 = off")
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=128)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, description="vLLM extra")
    ignore_eos: bool = Field(default=False, description="vLLM extra")
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # accepted and ignored: no effect on the output

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        for item in [value] if isinstance(value, str) else value or []:
            if not item:
                raise ValueError("stop strings must be non-empty")
        return value

    @model_validator(mode="after")
    def _neutral_only(self) -> _SamplingFields:
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0):
                raise FieldError(
                    name, f"{name} is not supported by this server (only 0); use repetition_penalty (> 0, 1 = off)"
                )
        if self.logit_bias:
            raise FieldError("logit_bias", "logit_bias is not supported by this server; leave it out")
        return self

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    #: with tool_choice 'auto' every parsed call is returned; with a forced tool_choice, false allows one call
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="vLLM extra")
    metadata: dict[str, Any] | None = None  # accepted and ignored
    store: bool | None = None  # accepted and ignored
    service_tier: str | None = None  # accepted and ignored

    @model_validator(mode="after")
    def _chat_checks(self) -> ChatCompletionRequest:
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise FieldError(
                "max_completion_tokens",
                f"max_tokens ({self.max_tokens}) and max_completion_tokens ({self.max_completion_tokens}) "
                "disagree; send one of them",
            )
        if self.top_logprobs:
            raise FieldError(
                "top_logprobs",
                "top_logprobs > 0 is not supported: this server returns the log-prob of each chosen token only "
                "(send logprobs: true with top_logprobs 0 or absent)",
            )
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
        if self.forced_tool_choice:
            self._check_forced_tool_choice()
        if self.response_format is not None and self.response_format.type != "text" and self.ignore_eos:
            raise FieldError("ignore_eos", "ignore_eos cannot be combined with a JSON response_format: the reply "
                                            "ends when its JSON is complete; leave ignore_eos out")
        return self

    def _check_forced_tool_choice(self) -> None:
        """``required`` / a named function: there must be tools to call (the named one among them), and the
        reply's shape is the call's, so no JSON ``response_format`` or ``ignore_eos`` beside it."""
        what = "tool_choice 'required'" if self.tool_choice == "required" else "a named tool_choice"
        if not self.tools:
            raise FieldError("tool_choice", f"{what} needs tools to call; send tools, or tool_choice 'auto'")
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.get("name")
            names = [tool.function.name for tool in self.tools]
            if name not in names:
                raise FieldError("tool_choice.function.name",
                                 f"tool_choice names the function {name!r}, which is not among the tools "
                                 f"({', '.join(names)}); name one of them")
        if self.response_format is not None and self.response_format.type != "text":
            raise FieldError("response_format", f"{what} decides the reply's shape (the call's arguments); leave "
                                                "response_format out or send type 'text'")
        if self.ignore_eos:
            raise FieldError("ignore_eos", f"{what} ends the reply when the call is complete; leave ignore_eos out")

    @property
    def forced_tool_choice(self) -> bool:
        """Whether the reply must be a tool call (``required`` or a named function): decoded under a grammar
        (:mod:`agentevolver.llm_server.forced_calls`)."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def limit_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @property
    def parse_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: raw prompts, no chat template."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _completion_checks(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise FieldError("prompt", "prompt is an empty list; send a string, a list of strings or token ids")
        if any(isinstance(p, list) and not p for p in self.prompt if isinstance(self.prompt, list)):
            raise FieldError("prompt", "prompt holds an empty token list")
        if self.logprobs:
            raise FieldError(
                "logprobs",
                "logprobs > 0 (top alternatives) is not supported: send logprobs: 0 for the chosen tokens' log-probs",
            )
        if self.echo:
            raise FieldError("echo", "echo is not supported; leave it out or false")
        if self.suffix:
            raise FieldError("suffix", "suffix (insertion) is not supported; leave it out")
        if self.best_of is not None and self.best_of != self.n:
            raise FieldError("best_of", f"best_of must equal n ({self.n}) or be left out")
        if self.stream:
            raise FieldError("stream", "stream is not supported on /v1/completions; use /v1/chat/completions "
                                        "or leave stream false")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompt(s) as a list: each a text or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]
