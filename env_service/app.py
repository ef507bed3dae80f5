"""The HTTP surface of the environment service (FastAPI), wire-compatible with the reference.

Routes (all POST bodies are the envelope ``{env_type, task_id, instance_id, messages, params}``, all
answers ``{success, data}``): ``/healthz``, ``/get_env_profile``, ``/create``, ``/step``, ``/evaluate``,
``/get_info``, ``/release``; plus ``GET /envs`` (what is served), ``GET /envs/{env_type}/tools`` (tool
schemas in OpenAI function format), and the optional capabilities: ``GET /envs/{env_type}/capabilities``
lists them, ``POST /step_labels`` labels a finished episode's steps GOOD/BAD where the environment can
(:mod:`agentevolver.schema.step_labels`; an environment without it answers 400 ``capability_unsupported``). Request models come from ``agentevolver.schema``, the same ones the
client sends, so the two cannot drift. Every error is JSON ``{success: false, error: {code, message,
field}}`` with a 4xx/5xx status chosen in one place (``install_error_handlers`` of
:mod:`agentevolver.service_common`, shared with the memory service); no traceback ever leaves.

Compatibility with the reference's clients (table in docs/env_service.md): ``null`` ids, every tool-call
shape (:func:`env_service.actions.read_action`), the reference's answer shapes by default
(:mod:`env_service.reference_shape`; ``params.shape: native`` for the environments' own), and a release
of nothing answering ``success: false`` with 200, the status the reference answers it with.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from agentevolver import __version__
from agentevolver.schema import (
    DEFAULT_SHAPE,
    SHAPE_PARAM,
    SHAPES,
    CreateRequest,
    EvaluateRequest,
    InstanceRequest,
    ProfileRequest,
    Shape,
    StepRequest,
)
from agentevolver.schema.step_labels import EnvCapabilities, StepLabelsData, StepLabelsRequest
from agentevolver.service_common import error_response, install_error_handlers, read_auth_token, require_token
from env_service import reference_shape
from env_service import responses as answers
from env_service.actions import read_action
from env_service.base import BaseEnv, Isolation
from env_service.errors import EnvServiceError
from env_service.instances import InstanceManager, ManagerLimits
from env_service.responses import CREATE_ERRORS, ENV_ERRORS, INSTANCE_ERRORS

logger = logging.getLogger(__name__)


class ServiceSettings(BaseModel):
    """Everything the service is started with (the CLI builds this; tests build it directly)."""

    envs: list[str] = Field(min_length=1)
    max_instances: int = Field(default=256, ge=1)
    call_timeout_s: float = Field(default=120.0, gt=0)
    idle_timeout_s: float = Field(default=3600.0, gt=0)
    reap_interval_s: float = Field(default=60.0, gt=0)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    auth_token_env: str | None = None
    isolation: dict[str, Isolation] = Field(default_factory=dict)
    threads: int = Field(default=32, ge=1)


#: What an error answer carries besides ``error`` (the reference's ``{success, data}``).
_ERROR_ENVELOPE: dict[str, Any] = {"success": False, "data": None}
#: How the env service words the validation problems its clients meet most.
_PHRASES = {
    "extra_forbidden": "unknown field {field!r}; allowed: env_type, task_id, instance_id, messages, params",
    "missing": "{field} is required",
    "string_too_short": "{field} is required (got an empty string or null)",
}


def _error_response(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return error_response(_ERROR_ENVELOPE, status, code, message, field)


def _ok(data: Any) -> dict[str, Any]:
    return {"success": True, "data": data}


def _shape(params: dict[str, Any]) -> tuple[Shape, dict[str, Any]]:
    """``params.shape`` (default ``reference``) and the params without it (environments never see it)."""
    shape = params.get(SHAPE_PARAM, DEFAULT_SHAPE)
    if shape not in SHAPES:
        raise EnvServiceError(f"params.{SHAPE_PARAM} must be one of {', '.join(SHAPES)}; got {shape!r}",
                              field=f"params.{SHAPE_PARAM}")
    return shape, {key: value for key, value in params.items() if key != SHAPE_PARAM}


def create_app(settings: ServiceSettings, env_classes: dict[str, type[BaseEnv]]) -> FastAPI:
    """Build the app for the given (already imported) environment classes."""
    manager = InstanceManager(
        env_classes, settings.isolation,
        ManagerLimits(max_instances=settings.max_instances, call_timeout_s=settings.call_timeout_s,
                      idle_timeout_s=settings.idle_timeout_s, reap_interval_s=settings.reap_interval_s),
        threads=settings.threads,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager.start()
        logger.info("environment service ready: %s", ", ".join(sorted(env_classes)))
        try:
            yield
        finally:
            live = manager.live
            await manager.shutdown()
            logger.info("environment service stopped; released %d live instance(s)", live)

    app = FastAPI(title="AgentEvolver environment service", version=__version__, lifespan=lifespan)
    app.state.manager = manager
    app.state.auth_token = read_auth_token(settings.auth_token_env)
    api = APIRouter(dependencies=[Depends(require_token)])  # everything but /healthz needs the token
    install_error_handlers(app, _ERROR_ENVELOPE, service_name="environment service", logger=logger,
                           phrases=_PHRASES)

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
            return _error_response(413, "body_too_large",
                                   f"request body is {declared} bytes; the limit is {settings.max_body_bytes}", "body")
        if request.method == "POST" and declared is None:
            body = await request.body()  # chunked upload: measure what arrived
            if len(body) > settings.max_body_bytes:
                return _error_response(413, "body_too_large",
                                       f"request body exceeds the limit of {settings.max_body_bytes} bytes", "body")
        return await call_next(request)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "OK"

    @api.get("/envs", response_model=None, responses={200: {"model": answers.EnvsAnswer}, **answers.COMMON_ERRORS})
    async def list_envs() -> dict[str, Any]:
        return _ok(_env_list(env_classes, settings))

    @api.get("/envs/{env_type}/tools", response_model=None,
             responses={200: {"model": answers.ToolsAnswer}, **ENV_ERRORS})
    async def env_tools(env_type: str) -> dict[str, Any]:
        return _ok(manager.env_class(env_type).tool_schemas())

    @api.get("/envs/{env_type}/capabilities", response_model=None,
             responses={200: {"model": answers.CapabilitiesAnswer}, **ENV_ERRORS})
    async def env_capabilities(env_type: str) -> dict[str, Any]:
        cls = manager.env_class(env_type)
        return _ok(EnvCapabilities(env_type=env_type, capabilities=cls.capabilities()).model_dump())

    @api.post("/step_labels", response_model=None, responses={200: {"model": answers.StepLabelsAnswer}, **ENV_ERRORS})
    async def step_labels(body: StepLabelsRequest) -> dict[str, Any]:
        # Class-level and pure: no instance (the episode's is released); off the event loop, since an
        # environment may replay tools to label.
        cls = manager.env_class(body.env_type)
        labels = await run_in_threadpool(cls.label_steps, body.task_id, body.messages, body.params)
        data = StepLabelsData(env_type=body.env_type, task_id=body.task_id, labels=labels)
        return _ok(data.model_dump())

    @api.post("/get_env_profile", response_model=None,
              responses={200: {"model": answers.ProfileAnswer}, **ENV_ERRORS})
    async def get_env_profile(body: ProfileRequest) -> dict[str, Any]:
        cls = manager.env_class(body.env_type)
        split = str(body.params.get("split", "train"))
        cls.check_split(split)
        return _ok(cls.task_ids(split))

    @api.post("/create", response_model=None,
              responses={200: {"model": answers.CreateAnswerEnvelope}, **CREATE_ERRORS})
    async def create(body: CreateRequest) -> dict[str, Any]:
        shape, params = _shape(body.params)
        instance_id, state = await manager.create(body.env_type, body.task_id, body.instance_id, params)
        if shape == "reference":
            state = reference_shape.opening(state, await _tools_of(instance_id, body.env_type))
        return _ok({"state": state, "info": {"instance_id": instance_id, "task_id": body.task_id,
                                             "env_type": body.env_type}})

    async def _tools_of(instance_id: str, env_type: str) -> list[dict[str, Any]] | None:
        """The instance's tools (a task may expose fewer than its environment's catalogue); None without."""
        if manager.env_class(env_type).tool_schemas() is None:
            return None
        info = await manager.call(instance_id, "info")
        tools = info.get("tools") if isinstance(info, dict) else None
        return tools if tools is not None else manager.env_class(env_type).tool_schemas()

    @api.post("/step", response_model=None,
              responses={200: {"model": answers.StepAnswerEnvelope}, **INSTANCE_ERRORS})
    async def step(body: StepRequest) -> dict[str, Any]:
        shape, _ = _shape(body.params)
        outcome = await manager.call(body.instance_id, "step", read_action(body.messages))
        if shape == "reference":
            outcome["state"] = reference_shape.observation(outcome["state"], bool(outcome["is_terminated"]))
        return _ok(outcome)

    @api.post("/evaluate", response_model=None,
              responses={200: {"model": answers.EvaluateAnswer}, **INSTANCE_ERRORS})
    async def evaluate(body: EvaluateRequest) -> dict[str, Any]:
        sparse = body.params.get("sparse", True)
        if not isinstance(sparse, bool):
            raise EnvServiceError(f"params.sparse must be true or false; got {sparse!r}", field="params.sparse")
        return _ok(await manager.call(body.instance_id, "evaluate", sparse))

    @api.post("/get_info", response_model=None, responses={200: {"model": answers.InfoAnswer}, **INSTANCE_ERRORS})
    async def get_info(body: InstanceRequest) -> dict[str, Any]:
        return _ok(await manager.call(body.instance_id, "info"))

    @api.post("/release", response_model=None,
              responses={200: {"model": answers.ReleaseAnswer}, **answers.COMMON_ERRORS})
    async def release(body: InstanceRequest) -> Any:
        if await manager.release(body.instance_id):
            return _ok(True)
        # 200 as the reference answers it: its clients read ``success`` and would retry (or raise on) a 4xx.
        return _error_response(200, "unknown_instance", f"nothing to release: no live instance "
                               f"{body.instance_id!r} (never created, already released, or reaped after idling "
                               f"{settings.idle_timeout_s:g} s)", "instance_id")

    @api.get("/stats", response_model=None, responses={200: {"model": answers.StatsAnswer}, **answers.COMMON_ERRORS})
    async def stats() -> dict[str, Any]:
        return _ok({"live_instances": manager.live, "max_instances": settings.max_instances, **manager.stats})

    app.include_router(api)
    return app


def _env_list(env_classes: dict[str, type[BaseEnv]], settings: ServiceSettings) -> list[dict[str, Any]]:
    return [{"env_type": name, "splits": cls.splits(), "has_tools": cls.tool_schemas() is not None,
             "isolation": settings.isolation.get(name, cls.isolation)}
            for name, cls in sorted(env_classes.items())]
