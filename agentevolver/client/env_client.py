"""The one client of the environment service (sync and async), used by the agent flow, the task manager and tests.

Failure policy, chosen per route by what a retry can break:

* every route retries connection failures, 429 (service full) and 503, with full-jitter exponential backoff
  (these mean the request was not processed);
* read-only routes (``get_env_profile``, ``evaluate``, ``get_info``, ``release``, ``envs``, ``tools``,
  ``capabilities``, ``step_labels``, ``task_writing``) also retry timeouts and 500s; ``create`` retries them after releasing
  the half-created instance (the client picks the instance id, so it can);
* ``step`` is not idempotent, so a timeout is not retried; when a step finally fails it returns a
  *fallback observation* instead of raising, flagged ``info["fallback"] = True`` so the trainer counts it:
  non-terminal ("please retry") when the failure may be transient, terminal with
  ``info["instance_lost"] = True`` when the instance is gone (crashed, hung, reaped), since further steps
  on it cannot succeed;
* every other failure raises :class:`EnvClientError`, carrying the service's error code and field, and a
  message that leads with the service's own words (``environment service rejected /step:
  messages.role: ...``);
* ``release`` of an instance that is not live answers ``success: false`` (``unknown_instance``) and
  returns False quietly: cleaning up twice is normal.

``create`` and ``step`` ask for this framework's answer shape (``params.shape: native``): every opening
message (demonstrations as real turns) and one ``tool`` message per tool call, which the context managers
render with the model's own chat template. Without it the service answers in the reference trainer's shape
(docs/env_service.md); a ``shape`` in the caller's ``params`` overrides the client's choice.

Answers are parsed with the service's own answer models (:mod:`agentevolver.schema.env_answers`, which the
service validates its answers against), so client and service cannot drift; an answer that is not its
route's model raises :class:`EnvClientError` naming the route.

Each operation is written once, as a :data:`~agentevolver.client.http.Flow` (its request, its failure policy,
its parsing); the sync method and its ``a``-prefixed async twin are one-line facades that drive it with the
sync pool or the running loop's. The plumbing (pools, auth header, the retry loop, the drivers) is
:class:`~agentevolver.client.http.ServiceClient`, shared with the memory client; this module holds the
environment routes and their failure policy.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import httpx

from agentevolver.client.http import Call, Flow, ServiceClient, ServiceClientError
from agentevolver.schema import SHAPE_PARAM, ChatMessage, CreateData, StepData
from agentevolver.schema.env_answers import (
    Answer,
    CapabilitiesAnswer,
    CreateAnswer,
    EnvsAnswer,
    EvaluateAnswer,
    InfoAnswer,
    ProfileAnswer,
    ReleaseAnswer,
    StepAnswer,
    StepLabelsAnswer,
    TaskWritingAnswer,
    ToolsAnswer,
)
from agentevolver.schema.step_labels import StepLabelsData, wire_messages
from agentevolver.schema.task_writing import ObservedCall, TaskWritingData, TaskWritingRequest

__all__ = ["EnvClient", "EnvClientError", "EnvClientSettings"]

logger = logging.getLogger(__name__)

#: Statuses meaning "this instance can serve no more calls".
_INSTANCE_LOST_CODES = frozenset({"unknown_instance", "instance_gone", "instance_failed", "instance_timeout"})
#: What ``create`` and ``step`` send in ``params``: this framework's richer answer shape.
_NATIVE = {SHAPE_PARAM: "native"}

_D = TypeVar("_D")


class EnvClientError(ServiceClientError):
    """A request to the environment service failed for good; ``code`` / ``field`` come from the service."""


@dataclass(frozen=True)
class EnvClientSettings:
    """Connection settings (the ``env_service`` config section supplies them; see config/agentevolver.yaml)."""

    env_url: str
    timeout_s: float = 180.0
    max_retries: int = 3
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    max_connections: int = 256
    auth_token_env: str | None = None

    @classmethod
    def from_config(cls, section: Any) -> EnvClientSettings:
        """Build from the validated ``env_service`` section (pydantic model, mapping or Hydra node)."""
        get = section.get if isinstance(section, Mapping) else lambda key: getattr(section, key)
        return cls(env_url=get("env_url"), timeout_s=get("timeout_s"), max_retries=get("max_retries"),
                   backoff_initial_s=get("backoff_initial_s"), backoff_max_s=get("backoff_max_s"),
                   max_connections=get("max_connections"), auth_token_env=get("auth_token_env"))


def _get(route: str) -> Call:
    return Call("GET", route, idempotent=True)


def _post(route: str, body: dict[str, Any], *, idempotent: bool) -> Call:
    return Call("POST", route, idempotent=idempotent, options={"json": body})


def _envelope(env_type: str = "", task_id: str = "", instance_id: str = "", messages: Any = None,
              params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The request envelope every POST route takes (unused fields empty, as the reference's clients send)."""
    return {"env_type": env_type, "task_id": task_id, "instance_id": instance_id,
            "messages": messages if messages is not None else {}, "params": dict(params or {})}


def _action(action: ChatMessage | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(action, ChatMessage):
        return action.model_dump(mode="json", exclude_none=True)
    return dict(action)


class EnvClient(ServiceClient):
    """Talk to one environment service. Thread-safe; usable from any number of event loops."""

    service_name: ClassVar[str] = "environment service"
    error_type: ClassVar[type[ServiceClientError]] = EnvClientError
    log: ClassVar[logging.Logger] = logger
    settings: EnvClientSettings

    def __init__(self, settings: EnvClientSettings) -> None:
        super().__init__(settings, settings.env_url, max_connections=settings.max_connections,
                         max_keepalive_connections=settings.max_connections)
        self.stats.update(step_fallbacks=0, instances_lost=0)

    @classmethod
    def from_config(cls, section: Any) -> EnvClient:
        """A client for the ``env_service`` config section."""
        return cls(EnvClientSettings.from_config(section))

    # ------------------------------------------------------------------ request core
    def _accept(self, where: str, response: httpx.Response, idempotent: bool) -> dict[str, Any]:
        """The body of a good answer (200, ``success: true``); any other answer raises :meth:`_refusal`'s error."""
        try:
            body = response.json() if response.headers.get("content-type", "").startswith("application/json") \
                else None
        except ValueError:
            body = None
        if response.status_code == 200 and isinstance(body, dict) and body.get("success") is True:
            return body
        raise self._refusal(where, response, idempotent)

    def _repeatable(self, status: int, code: str | None) -> bool:
        """Any 5xx on an idempotent route, unless the instance is gone (a repeat cannot bring it back)."""
        return status >= 500 and code not in _INSTANCE_LOST_CODES

    def _request(self, method: str, route: str, body: dict[str, Any] | None, idempotent: bool) -> Any:
        """The raw ``data`` of one route, unparsed, under the retry policy (for a route without a method here)."""
        return self._send(method, route, idempotent=idempotent, json=body).get("data")

    def _data(self, call: Call, answer: type[Answer[_D]]) -> Flow[_D]:
        """One request and the ``data`` of its answer, parsed as the route's ``answer`` model."""
        parsed = yield from self._answer(call, answer)
        return parsed.data

    # ------------------------------------------------------------------ operations, each written once
    def _list_envs(self) -> Flow[list[dict[str, Any]]]:
        listings = yield from self._data(_get("/envs"), EnvsAnswer)
        return [listing.model_dump() for listing in listings]

    def _tools(self, env_type: str) -> Flow[list[dict[str, Any]] | None]:
        return self._data(_get(f"/envs/{env_type}/tools"), ToolsAnswer)

    def _capabilities(self, env_type: str) -> Flow[list[str]]:
        offered = yield from self._data(_get(f"/envs/{env_type}/capabilities"), CapabilitiesAnswer)
        return offered.capabilities

    def _step_labels(self, env_type: str, task_id: str, messages: Sequence[ChatMessage | Mapping[str, Any]],
                     params: Mapping[str, Any] | None) -> Flow[StepLabelsData]:
        body = _envelope(env_type, task_id, messages=wire_messages(messages), params=params)
        return self._data(_post("/step_labels", body, idempotent=True), StepLabelsAnswer)

    def _write_tasks(self, env_type: str, calls: Sequence[ObservedCall], seed_query: str | None,
                     limit: int | None, all_renderings: bool) -> Flow[TaskWritingData]:
        body = TaskWritingRequest(env_type=env_type, calls=list(calls), seed_query=seed_query, limit=limit,
                                  all_renderings=all_renderings)
        return self._data(_post("/task_writing", body.model_dump(mode="json"), idempotent=True), TaskWritingAnswer)

    def _get_env_profile(self, env_type: str, split: str) -> Flow[list[str]]:
        body = _envelope(env_type, params={"split": split})
        return self._data(_post("/get_env_profile", body, idempotent=True), ProfileAnswer)

    def _create(self, env_type: str, task_id: str, instance_id: str | None,
                params: Mapping[str, Any] | None) -> Flow[CreateData]:
        instance_id = instance_id or uuid.uuid4().hex
        call = _post("/create", _envelope(env_type, task_id, instance_id, params={**_NATIVE, **(params or {})}),
                     idempotent=False)
        try:
            answer = yield call
        except EnvClientError as err:
            if err.status is not None and err.status < 500:
                raise
            yield from self._release(instance_id)  # it may exist server-side: clean up, try once more
            answer = yield call
        return self._parse("/create", answer, CreateAnswer).data

    def _step(self, instance_id: str, action: ChatMessage | Mapping[str, Any],
              params: Mapping[str, Any] | None) -> Flow[StepData]:
        call = _post("/step", _envelope(instance_id=instance_id, messages=_action(action),
                                        params={**_NATIVE, **(params or {})}), idempotent=False)
        try:
            answer = yield call
        except EnvClientError as err:
            if err.code == "bad_action":
                raise
            return self._fallback(err)
        return self._parse("/step", answer, StepAnswer).data

    def _evaluate(self, instance_id: str, sparse: bool) -> Flow[float]:
        body = _envelope(instance_id=instance_id, params={"sparse": sparse})
        return self._data(_post("/evaluate", body, idempotent=True), EvaluateAnswer)

    def _get_info(self, instance_id: str) -> Flow[dict[str, Any]]:
        return self._data(_post("/get_info", _envelope(instance_id=instance_id), idempotent=True), InfoAnswer)

    def _release(self, instance_id: str) -> Flow[bool]:
        try:
            answer = yield _post("/release", _envelope(instance_id=instance_id), idempotent=True)
            return bool(self._parse("/release", answer, ReleaseAnswer).data)
        except EnvClientError as err:
            if err.code == "unknown_instance":
                logger.debug("release of %s: it was not live", instance_id)
            else:
                logger.warning("release of %s failed: %s", instance_id, err)
            return False

    def _fallback(self, err: EnvClientError) -> StepData:
        lost = err.code in _INSTANCE_LOST_CODES
        self.stats["step_fallbacks"] += 1
        self.stats["instances_lost"] += int(lost)
        text = ("[environment error] the environment instance was lost and the episode cannot continue."
                if lost else "[environment error] this step could not be executed; please retry your action.")
        logger.warning("step failed, returning a %s fallback observation: %s",
                       "terminal" if lost else "non-terminal", err)
        return StepData(state=[ChatMessage(role="user", content=text)], reward=0.0, is_terminated=lost,
                        info={"fallback": True, "instance_lost": lost, "error": str(err), "error_code": err.code})

    # ------------------------------------------------------------------ sync API (facades over the operations)
    def list_envs(self) -> list[dict[str, Any]]:
        """What is served: ``{env_type, splits, has_tools, isolation}`` per environment."""
        return self._run(self._list_envs())

    def tools(self, env_type: str) -> list[dict[str, Any]] | None:
        """Tool schemas the environment serves (None when it takes free text)."""
        return self._run(self._tools(env_type))

    def capabilities(self, env_type: str) -> list[str]:
        """Optional capabilities the environment offers (e.g. ``step_labels``); [] for none."""
        return self._run(self._capabilities(env_type))

    def step_labels(self, env_type: str, task_id: str, messages: Sequence[ChatMessage | Mapping[str, Any]],
                    params: Mapping[str, Any] | None = None) -> StepLabelsData:
        """GOOD/BAD per agent step of a finished episode, from the environment (capability ``step_labels``).

        ``messages`` is the episode as the agent flow recorded it (with ``step`` fields); no instance is
        needed. Read-only, so retried like ``evaluate``; an environment without the capability raises
        :class:`EnvClientError` with code ``capability_unsupported``, one that cannot label this episode
        ``cannot_label`` (both with the service's message and field).
        """
        return self._run(self._step_labels(env_type, task_id, messages, params))

    def write_tasks(self, env_type: str, calls: Sequence[ObservedCall], *, seed_query: str | None = None,
                    limit: int | None = None, all_renderings: bool = False) -> TaskWritingData:
        """The tasks an exploration's tool ``calls`` determine, rendered by the environment (capability
        ``task_writing``; no LLM); ``all_renderings``: every question a call can be written as. Pure, so
        retried like ``evaluate``; an environment without the capability raises :class:`EnvClientError` with
        code ``capability_unsupported``."""
        return self._run(self._write_tasks(env_type, calls, seed_query, limit, all_renderings))

    def get_env_profile(self, env_type: str, split: str = "train") -> list[str]:
        """Task ids of a split."""
        return self._run(self._get_env_profile(env_type, split))

    def create(self, env_type: str, task_id: str, *, instance_id: str | None = None,
               params: Mapping[str, Any] | None = None) -> CreateData:
        """Create an instance (the client picks its id so a retried create can clean up after itself)."""
        return self._run(self._create(env_type, task_id, instance_id, params))

    def step(self, instance_id: str, action: ChatMessage | Mapping[str, Any],
             params: Mapping[str, Any] | None = None) -> StepData:
        """Apply an action; never raises for service failures (returns a flagged fallback instead)."""
        return self._run(self._step(instance_id, action, params))

    def evaluate(self, instance_id: str, *, sparse: bool = True) -> float:
        """The instance's score (``sparse``: 1/0 all-or-nothing instead of passes/total)."""
        return self._run(self._evaluate(instance_id, sparse))

    def get_info(self, instance_id: str) -> dict[str, Any]:
        """What the environment says about the instance (its own keys)."""
        return self._run(self._get_info(instance_id))

    def release(self, instance_id: str) -> bool:
        """Release an instance; False (not an error) if it was not live. Never raises for service failures."""
        return self._run(self._release(instance_id))

    # ------------------------------------------------------------------ async API (the same operations)
    async def alist_envs(self) -> list[dict[str, Any]]:
        """Async :meth:`list_envs`."""
        return await self._arun(self._list_envs())

    async def atools(self, env_type: str) -> list[dict[str, Any]] | None:
        """Async :meth:`tools`."""
        return await self._arun(self._tools(env_type))

    async def acapabilities(self, env_type: str) -> list[str]:
        """Async :meth:`capabilities`."""
        return await self._arun(self._capabilities(env_type))

    async def astep_labels(self, env_type: str, task_id: str, messages: Sequence[ChatMessage | Mapping[str, Any]],
                           params: Mapping[str, Any] | None = None) -> StepLabelsData:
        """Async :meth:`step_labels`."""
        return await self._arun(self._step_labels(env_type, task_id, messages, params))

    async def aget_env_profile(self, env_type: str, split: str = "train") -> list[str]:
        """Async :meth:`get_env_profile`."""
        return await self._arun(self._get_env_profile(env_type, split))

    async def acreate(self, env_type: str, task_id: str, *, instance_id: str | None = None,
                      params: Mapping[str, Any] | None = None) -> CreateData:
        """Async :meth:`create`."""
        return await self._arun(self._create(env_type, task_id, instance_id, params))

    async def astep(self, instance_id: str, action: ChatMessage | Mapping[str, Any],
                    params: Mapping[str, Any] | None = None) -> StepData:
        """Async :meth:`step`."""
        return await self._arun(self._step(instance_id, action, params))

    async def aevaluate(self, instance_id: str, *, sparse: bool = True) -> float:
        """Async :meth:`evaluate`."""
        return await self._arun(self._evaluate(instance_id, sparse))

    async def aget_info(self, instance_id: str) -> dict[str, Any]:
        """Async :meth:`get_info`."""
        return await self._arun(self._get_info(instance_id))

    async def arelease(self, instance_id: str) -> bool:
        """Async :meth:`release`."""
        return await self._arun(self._release(instance_id))
