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

The plumbing (pools, auth header, the retry loop) is :class:`~agentevolver.client.http.ServiceClient`,
shared with the memory client; this module holds the environment routes and their failure policy.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from agentevolver.client.http import (
    NOT_PROCESSED,
    ServiceClient,
    ServiceClientError,
    describe_failure,
    error_detail,
)
from agentevolver.schema import SHAPE_PARAM, ChatMessage, CreateData, StepData
from agentevolver.schema.step_labels import EnvCapabilities, StepLabelsData, wire_messages
from agentevolver.schema.task_writing import ObservedCall, TaskWritingData, TaskWritingRequest

__all__ = ["EnvClient", "EnvClientError", "EnvClientSettings"]

logger = logging.getLogger(__name__)

#: Statuses meaning "this instance can serve no more calls".
_INSTANCE_LOST_CODES = frozenset({"unknown_instance", "instance_gone", "instance_failed", "instance_timeout"})
#: What ``create`` and ``step`` send in ``params``: this framework's richer answer shape.
_NATIVE = {SHAPE_PARAM: "native"}


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
    def _accept(self, where: str, response: httpx.Response, idempotent: bool) -> Any:
        """``data`` of a good answer; retry 429/503 everywhere, other 5xx on idempotent routes unless the
        instance is gone (a repeat cannot bring it back)."""
        try:
            body = response.json() if response.headers.get("content-type", "").startswith("application/json") \
                else None
        except ValueError:
            body = None
        if response.status_code == 200 and isinstance(body, dict) and body.get("success") is True:
            return body.get("data")
        code, field, message = error_detail(response)
        reason = describe_failure(self.service_name, self._base, where, response.status_code, code, field, message)
        retry = response.status_code in NOT_PROCESSED or (idempotent and response.status_code >= 500
                                                          and code not in _INSTANCE_LOST_CODES)
        raise self._reject(reason, retry, response, code, field)

    def _request(self, method: str, route: str, body: dict[str, Any] | None, idempotent: bool) -> Any:
        return self._send(method, route, idempotent=idempotent, json=body)

    async def _arequest(self, method: str, route: str, body: dict[str, Any] | None, idempotent: bool) -> Any:
        return await self._asend(method, route, idempotent=idempotent, json=body)

    @staticmethod
    def _envelope(env_type: str = "", task_id: str = "", instance_id: str = "",
                  messages: Any = None, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {"env_type": env_type, "task_id": task_id, "instance_id": instance_id,
                "messages": messages if messages is not None else {}, "params": dict(params or {})}

    # ------------------------------------------------------------------ step fallback
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

    @staticmethod
    def _action(action: ChatMessage | Mapping[str, Any]) -> dict[str, Any]:
        if isinstance(action, ChatMessage):
            return action.model_dump(mode="json", exclude_none=True)
        return dict(action)

    # ------------------------------------------------------------------ sync API
    def list_envs(self) -> list[dict[str, Any]]:
        return self._request("GET", "/envs", None, True)

    def tools(self, env_type: str) -> list[dict[str, Any]] | None:
        return self._request("GET", f"/envs/{env_type}/tools", None, True)

    def capabilities(self, env_type: str) -> list[str]:
        """Optional capabilities the environment offers (e.g. ``step_labels``); [] for none."""
        return EnvCapabilities.model_validate(
            self._request("GET", f"/envs/{env_type}/capabilities", None, True)).capabilities

    def step_labels(self, env_type: str, task_id: str, messages: Sequence[ChatMessage | Mapping[str, Any]],
                    params: Mapping[str, Any] | None = None) -> StepLabelsData:
        """GOOD/BAD per agent step of a finished episode, from the environment (capability ``step_labels``).

        ``messages`` is the episode as the agent flow recorded it (with ``step`` fields); no instance is
        needed. Read-only, so retried like ``evaluate``; an environment without the capability raises
        :class:`EnvClientError` with code ``capability_unsupported``, one that cannot label this episode
        ``cannot_label`` (both with the service's message and field).
        """
        body = self._envelope(env_type, task_id, messages=wire_messages(messages), params=params)
        return StepLabelsData.model_validate(self._request("POST", "/step_labels", body, True))

    def write_tasks(self, env_type: str, calls: Sequence[ObservedCall], *, seed_query: str | None = None,
                    limit: int | None = None) -> TaskWritingData:
        """The tasks an exploration's tool ``calls`` determine, rendered by the environment (capability
        ``task_writing``; no LLM). Pure, so retried like ``evaluate``; an environment without the capability
        raises :class:`EnvClientError` with code ``capability_unsupported``."""
        body = TaskWritingRequest(env_type=env_type, calls=list(calls), seed_query=seed_query, limit=limit)
        return TaskWritingData.model_validate(self._request("POST", "/task_writing", body.model_dump(mode="json"), True))

    def get_env_profile(self, env_type: str, split: str = "train") -> list[str]:
        """Task ids of a split."""
        return self._request("POST", "/get_env_profile", self._envelope(env_type, params={"split": split}), True)

    def create(self, env_type: str, task_id: str, *, instance_id: str | None = None,
               params: Mapping[str, Any] | None = None) -> CreateData:
        """Create an instance (the client picks its id so a retried create can clean up after itself)."""
        instance_id = instance_id or uuid.uuid4().hex
        body = self._envelope(env_type, task_id, instance_id, params={**_NATIVE, **(params or {})})
        try:
            data = self._request("POST", "/create", body, False)
        except EnvClientError as err:
            if err.status is None or err.status >= 500:  # it may exist server-side: clean up, try once more
                self.release(instance_id)
                data = self._request("POST", "/create", body, False)
            else:
                raise
        return CreateData.model_validate(data)

    def step(self, instance_id: str, action: ChatMessage | Mapping[str, Any],
             params: Mapping[str, Any] | None = None) -> StepData:
        """Apply an action; never raises for service failures (returns a flagged fallback instead)."""
        body = self._envelope(instance_id=instance_id, messages=self._action(action),
                              params={**_NATIVE, **(params or {})})
        try:
            return StepData.model_validate(self._request("POST", "/step", body, False))
        except EnvClientError as err:
            if err.code == "bad_action":
                raise
            return self._fallback(err)

    def evaluate(self, instance_id: str, *, sparse: bool = True) -> float:
        return float(self._request("POST", "/evaluate", self._envelope(instance_id=instance_id,
                                                                        params={"sparse": sparse}), True))

    def get_info(self, instance_id: str) -> dict[str, Any]:
        return self._request("POST", "/get_info", self._envelope(instance_id=instance_id), True)

    def release(self, instance_id: str) -> bool:
        """Release an instance; False (not an error) if it was not live. Never raises for service failures."""
        try:
            return bool(self._request("POST", "/release", self._envelope(instance_id=instance_id), True))
        except EnvClientError as err:
            return self._release_failed(instance_id, err)

    @staticmethod
    def _release_failed(instance_id: str, err: EnvClientError) -> bool:
        """False; a warning unless there was simply nothing to release."""
        if err.code == "unknown_instance":
            logger.debug("release of %s: it was not live", instance_id)
        else:
            logger.warning("release of %s failed: %s", instance_id, err)
        return False

    # ------------------------------------------------------------------ async API
    async def alist_envs(self) -> list[dict[str, Any]]:
        return await self._arequest("GET", "/envs", None, True)

    async def atools(self, env_type: str) -> list[dict[str, Any]] | None:
        """Tool schemas the environment serves (None when it takes free text)."""
        return await self._arequest("GET", f"/envs/{env_type}/tools", None, True)

    async def acapabilities(self, env_type: str) -> list[str]:
        """Async :meth:`capabilities`."""
        return EnvCapabilities.model_validate(
            await self._arequest("GET", f"/envs/{env_type}/capabilities", None, True)).capabilities

    async def astep_labels(self, env_type: str, task_id: str, messages: Sequence[ChatMessage | Mapping[str, Any]],
                           params: Mapping[str, Any] | None = None) -> StepLabelsData:
        """Async :meth:`step_labels`."""
        body = self._envelope(env_type, task_id, messages=wire_messages(messages), params=params)
        return StepLabelsData.model_validate(await self._arequest("POST", "/step_labels", body, True))

    async def aget_env_profile(self, env_type: str, split: str = "train") -> list[str]:
        return await self._arequest("POST", "/get_env_profile",
                                    self._envelope(env_type, params={"split": split}), True)

    async def acreate(self, env_type: str, task_id: str, *, instance_id: str | None = None,
                      params: Mapping[str, Any] | None = None) -> CreateData:
        instance_id = instance_id or uuid.uuid4().hex
        body = self._envelope(env_type, task_id, instance_id, params={**_NATIVE, **(params or {})})
        try:
            data = await self._arequest("POST", "/create", body, False)
        except EnvClientError as err:
            if err.status is None or err.status >= 500:
                await self.arelease(instance_id)
                data = await self._arequest("POST", "/create", body, False)
            else:
                raise
        return CreateData.model_validate(data)

    async def astep(self, instance_id: str, action: ChatMessage | Mapping[str, Any],
                    params: Mapping[str, Any] | None = None) -> StepData:
        body = self._envelope(instance_id=instance_id, messages=self._action(action),
                              params={**_NATIVE, **(params or {})})
        try:
            return StepData.model_validate(await self._arequest("POST", "/step", body, False))
        except EnvClientError as err:
            if err.code == "bad_action":
                raise
            return self._fallback(err)

    async def aevaluate(self, instance_id: str, *, sparse: bool = True) -> float:
        return float(await self._arequest("POST", "/evaluate", self._envelope(instance_id=instance_id,
                                                                               params={"sparse": sparse}), True))

    async def aget_info(self, instance_id: str) -> dict[str, Any]:
        return await self._arequest("POST", "/get_info", self._envelope(instance_id=instance_id), True)

    async def arelease(self, instance_id: str) -> bool:
        try:
            return bool(await self._arequest("POST", "/release", self._envelope(instance_id=instance_id), True))
        except EnvClientError as err:
            return self._release_failed(instance_id, err)
