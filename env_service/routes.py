"""The routes of the environment service, as one router over the app's state.

Each route reaches what the app was built with (the :class:`InstanceManager`, the
:class:`~env_service.settings.ServiceSettings`) through a dependency that reads ``request.app.state``, so the
routes are plain module-level functions that read top to bottom, and :func:`env_service.app.create_app`
only builds the app and includes this router. Every route but ``/healthz`` (on the app) needs the token.
Request models come from ``agentevolver.schema``, the same ones the client sends; each route returns its
answer model (:mod:`agentevolver.schema.env_answers`, the ones the client parses), which FastAPI validates
on the way out; the errors each route may answer are declared in :mod:`env_service.responses`.

Answers are rendered by :class:`JSONResponse` (``json.dumps``), as before they were typed, rather than by
FastAPI's pydantic fast path, whose float spelling differs (``1e-5`` for ``1e-05``): the wire stays
byte-for-byte the reference-compatible one. ``/create``, ``/step`` and ``/release`` are serialised with
``exclude_unset``: they pass on what an environment said, and a key it did not send stays absent.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from agentevolver.schema import (
    DEFAULT_SHAPE,
    SHAPE_PARAM,
    SHAPES,
    CreateRequest,
    ErrorDetail,
    EvaluateRequest,
    InstanceRequest,
    ProfileRequest,
    Shape,
    StepRequest,
)
from agentevolver.schema.env_answers import (
    CapabilitiesAnswer,
    CreateAnswer,
    EnvListing,
    EnvsAnswer,
    EvaluateAnswer,
    InfoAnswer,
    ProfileAnswer,
    ReleaseAnswer,
    StatsAnswer,
    StepAnswer,
    StepLabelsAnswer,
    TaskWritingAnswer,
    ToolsAnswer,
)
from agentevolver.schema.step_labels import EnvCapabilities, StepLabelsData, StepLabelsRequest
from agentevolver.schema.task_writing import TaskWritingData, TaskWritingRequest
from agentevolver.service_common import require_token
from env_service import reference_shape
from env_service.actions import read_action
from env_service.errors import EnvServiceError
from env_service.instances import InstanceManager
from env_service.responses import COMMON_ERRORS, CREATE_ERRORS, ENV_ERRORS, INSTANCE_ERRORS
from env_service.settings import ServiceSettings

__all__ = ["ERROR_ENVELOPE", "router"]

#: What an error answer carries besides ``error`` (the reference's ``{success, data}``).
ERROR_ENVELOPE: dict[str, Any] = {"success": False, "data": None}


def _manager(request: Request) -> InstanceManager:
    return request.app.state.manager


def _settings(request: Request) -> ServiceSettings:
    return request.app.state.settings


Manager = Annotated[InstanceManager, Depends(_manager)]
Settings = Annotated[ServiceSettings, Depends(_settings)]

router = APIRouter(dependencies=[Depends(require_token)], default_response_class=JSONResponse)


def _shape(params: dict[str, Any]) -> tuple[Shape, dict[str, Any]]:
    """``params.shape`` (default ``reference``) and the params without it (environments never see it)."""
    shape = params.get(SHAPE_PARAM, DEFAULT_SHAPE)
    if shape not in SHAPES:
        raise EnvServiceError(f"params.{SHAPE_PARAM} must be one of {', '.join(SHAPES)}; got {shape!r}",
                              field=f"params.{SHAPE_PARAM}")
    return shape, {key: value for key, value in params.items() if key != SHAPE_PARAM}


@router.get("/envs", responses=COMMON_ERRORS)
async def list_envs(manager: Manager, settings: Settings) -> EnvsAnswer:
    return EnvsAnswer.of([EnvListing(env_type=name, splits=cls.splits(), has_tools=cls.tool_schemas() is not None,
                                     isolation=settings.isolation.get(name, cls.isolation))
                          for name, cls in sorted(manager.envs.items())])


@router.get("/envs/{env_type}/tools", responses=ENV_ERRORS)
async def env_tools(env_type: str, manager: Manager) -> ToolsAnswer:
    return ToolsAnswer.of(manager.env_class(env_type).tool_schemas())


@router.get("/envs/{env_type}/capabilities", responses=ENV_ERRORS)
async def env_capabilities(env_type: str, manager: Manager) -> CapabilitiesAnswer:
    cls = manager.env_class(env_type)
    return CapabilitiesAnswer.of(EnvCapabilities(env_type=env_type, capabilities=cls.capabilities()))


@router.post("/step_labels", responses=ENV_ERRORS)
async def step_labels(body: StepLabelsRequest, manager: Manager) -> StepLabelsAnswer:
    # Class-level and pure: no instance (the episode's is released); off the event loop, since an
    # environment may replay tools to label.
    cls = manager.env_class(body.env_type)
    labels = await run_in_threadpool(cls.label_steps, body.task_id, body.messages, body.params)
    return StepLabelsAnswer.of(StepLabelsData(env_type=body.env_type, task_id=body.task_id, labels=labels))


@router.post("/task_writing", responses=ENV_ERRORS)
async def task_writing(body: TaskWritingRequest, manager: Manager) -> TaskWritingAnswer:
    # Class-level and pure like /step_labels: the exploration's instance is released by now.
    cls = manager.env_class(body.env_type)
    rendering = await run_in_threadpool(cls.write_tasks, body.calls, body.seed_query, body.limit,
                                        body.all_renderings)
    return TaskWritingAnswer.of(TaskWritingData(env_type=body.env_type, tasks=rendering.tasks,
                                                counts=rendering.counts))


@router.post("/get_env_profile", responses=ENV_ERRORS)
async def get_env_profile(body: ProfileRequest, manager: Manager) -> ProfileAnswer:
    cls = manager.env_class(body.env_type)
    split = str(body.params.get("split", "train"))
    cls.check_split(split)
    return ProfileAnswer.of(cls.task_ids(split))


@router.post("/create", response_model_exclude_unset=True, responses=CREATE_ERRORS)
async def create(body: CreateRequest, manager: Manager) -> CreateAnswer:
    shape, params = _shape(body.params)
    instance_id, state = await manager.create(body.env_type, body.task_id, body.instance_id, params)
    if shape == "reference":
        state = reference_shape.opening(state, await _tools_of(manager, instance_id, body.env_type))
    return CreateAnswer.of({"state": state, "info": {"instance_id": instance_id, "task_id": body.task_id,
                                                     "env_type": body.env_type}})


async def _tools_of(manager: InstanceManager, instance_id: str, env_type: str) -> list[dict[str, Any]] | None:
    """The instance's tools (a task may expose fewer than its environment's catalogue); None without."""
    if manager.env_class(env_type).tool_schemas() is None:
        return None
    info = await manager.call(instance_id, "info")
    tools = info.get("tools") if isinstance(info, dict) else None
    return tools if tools is not None else manager.env_class(env_type).tool_schemas()


@router.post("/step", response_model_exclude_unset=True, responses=INSTANCE_ERRORS)
async def step(body: StepRequest, manager: Manager) -> StepAnswer:
    shape, _ = _shape(body.params)
    outcome = await manager.call(body.instance_id, "step", read_action(body.messages))
    if shape == "reference":
        outcome["state"] = reference_shape.observation(outcome["state"], bool(outcome["is_terminated"]))
    return StepAnswer.of(outcome)


@router.post("/evaluate", responses=INSTANCE_ERRORS)
async def evaluate(body: EvaluateRequest, manager: Manager) -> EvaluateAnswer:
    sparse = body.params.get("sparse", True)
    if not isinstance(sparse, bool):
        raise EnvServiceError(f"params.sparse must be true or false; got {sparse!r}", field="params.sparse")
    return EvaluateAnswer.of(await manager.call(body.instance_id, "evaluate", sparse))


@router.post("/get_info", responses=INSTANCE_ERRORS)
async def get_info(body: InstanceRequest, manager: Manager) -> InfoAnswer:
    return InfoAnswer.of(await manager.call(body.instance_id, "info"))


@router.post("/release", response_model_exclude_unset=True, responses=COMMON_ERRORS)
async def release(body: InstanceRequest, manager: Manager, settings: Settings) -> ReleaseAnswer:
    if await manager.release(body.instance_id):
        return ReleaseAnswer(success=True, data=True)
    # 200 as the reference answers it: its clients read ``success`` and would retry (or raise on) a 4xx.
    return ReleaseAnswer(success=False, data=None, error=ErrorDetail(
        code="unknown_instance", field="instance_id",
        message=f"nothing to release: no live instance {body.instance_id!r} (never created, already released, "
                f"or reaped after idling {settings.idle_timeout_s:g} s)"))


@router.get("/stats", responses=COMMON_ERRORS)
async def stats(manager: Manager, settings: Settings) -> StatsAnswer:
    return StatsAnswer.of({"live_instances": manager.live, "max_instances": settings.max_instances, **manager.stats})
