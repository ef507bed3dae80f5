"""The routes of the environment service, as one router over the app's state.

Each route reaches what the app was built with (the :class:`InstanceManager`, the
:class:`~env_service.settings.ServiceSettings`) through a dependency that reads ``request.app.state``, so the
routes are plain module-level functions that read top to bottom, and :func:`env_service.app.create_app`
only builds the app and includes this router. Every route but ``/healthz`` (on the app) needs the token.
Request models come from ``agentevolver.schema``, the same ones the client sends; the declared answers
are :mod:`env_service.responses`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

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
from agentevolver.schema.task_writing import TaskWritingData, TaskWritingRequest
from agentevolver.service_common import error_response, require_token
from env_service import reference_shape
from env_service import responses as answers
from env_service.actions import read_action
from env_service.errors import EnvServiceError
from env_service.instances import InstanceManager
from env_service.responses import CREATE_ERRORS, ENV_ERRORS, INSTANCE_ERRORS
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

router = APIRouter(dependencies=[Depends(require_token)])


def _ok(data: Any) -> dict[str, Any]:
    return {"success": True, "data": data}


def _shape(params: dict[str, Any]) -> tuple[Shape, dict[str, Any]]:
    """``params.shape`` (default ``reference``) and the params without it (environments never see it)."""
    shape = params.get(SHAPE_PARAM, DEFAULT_SHAPE)
    if shape not in SHAPES:
        raise EnvServiceError(f"params.{SHAPE_PARAM} must be one of {', '.join(SHAPES)}; got {shape!r}",
                              field=f"params.{SHAPE_PARAM}")
    return shape, {key: value for key, value in params.items() if key != SHAPE_PARAM}


@router.get("/envs", response_model=None, responses={200: {"model": answers.EnvsAnswer}, **answers.COMMON_ERRORS})
async def list_envs(manager: Manager, settings: Settings) -> dict[str, Any]:
    return _ok([{"env_type": name, "splits": cls.splits(), "has_tools": cls.tool_schemas() is not None,
                 "isolation": settings.isolation.get(name, cls.isolation)}
                for name, cls in sorted(manager.envs.items())])


@router.get("/envs/{env_type}/tools", response_model=None,
            responses={200: {"model": answers.ToolsAnswer}, **ENV_ERRORS})
async def env_tools(env_type: str, manager: Manager) -> dict[str, Any]:
    return _ok(manager.env_class(env_type).tool_schemas())


@router.get("/envs/{env_type}/capabilities", response_model=None,
            responses={200: {"model": answers.CapabilitiesAnswer}, **ENV_ERRORS})
async def env_capabilities(env_type: str, manager: Manager) -> dict[str, Any]:
    cls = manager.env_class(env_type)
    return _ok(EnvCapabilities(env_type=env_type, capabilities=cls.capabilities()).model_dump())


@router.post("/step_labels", response_model=None,
             responses={200: {"model": answers.StepLabelsAnswer}, **ENV_ERRORS})
async def step_labels(body: StepLabelsRequest, manager: Manager) -> dict[str, Any]:
    # Class-level and pure: no instance (the episode's is released); off the event loop, since an
    # environment may replay tools to label.
    cls = manager.env_class(body.env_type)
    labels = await run_in_threadpool(cls.label_steps, body.task_id, body.messages, body.params)
    data = StepLabelsData(env_type=body.env_type, task_id=body.task_id, labels=labels)
    return _ok(data.model_dump())


@router.post("/task_writing", response_model=None,
             responses={200: {"model": answers.TaskWritingAnswer}, **ENV_ERRORS})
async def task_writing(body: TaskWritingRequest, manager: Manager) -> dict[str, Any]:
    # Class-level and pure like /step_labels: the exploration's instance is released by now.
    cls = manager.env_class(body.env_type)
    rendering = await run_in_threadpool(cls.write_tasks, body.calls, body.seed_query, body.limit)
    data = TaskWritingData(env_type=body.env_type, tasks=rendering.tasks, counts=rendering.counts)
    return _ok(data.model_dump())


@router.post("/get_env_profile", response_model=None,
             responses={200: {"model": answers.ProfileAnswer}, **ENV_ERRORS})
async def get_env_profile(body: ProfileRequest, manager: Manager) -> dict[str, Any]:
    cls = manager.env_class(body.env_type)
    split = str(body.params.get("split", "train"))
    cls.check_split(split)
    return _ok(cls.task_ids(split))


@router.post("/create", response_model=None,
             responses={200: {"model": answers.CreateAnswerEnvelope}, **CREATE_ERRORS})
async def create(body: CreateRequest, manager: Manager) -> dict[str, Any]:
    shape, params = _shape(body.params)
    instance_id, state = await manager.create(body.env_type, body.task_id, body.instance_id, params)
    if shape == "reference":
        state = reference_shape.opening(state, await _tools_of(manager, instance_id, body.env_type))
    return _ok({"state": state, "info": {"instance_id": instance_id, "task_id": body.task_id,
                                         "env_type": body.env_type}})


async def _tools_of(manager: InstanceManager, instance_id: str, env_type: str) -> list[dict[str, Any]] | None:
    """The instance's tools (a task may expose fewer than its environment's catalogue); None without."""
    if manager.env_class(env_type).tool_schemas() is None:
        return None
    info = await manager.call(instance_id, "info")
    tools = info.get("tools") if isinstance(info, dict) else None
    return tools if tools is not None else manager.env_class(env_type).tool_schemas()


@router.post("/step", response_model=None,
             responses={200: {"model": answers.StepAnswerEnvelope}, **INSTANCE_ERRORS})
async def step(body: StepRequest, manager: Manager) -> dict[str, Any]:
    shape, _ = _shape(body.params)
    outcome = await manager.call(body.instance_id, "step", read_action(body.messages))
    if shape == "reference":
        outcome["state"] = reference_shape.observation(outcome["state"], bool(outcome["is_terminated"]))
    return _ok(outcome)


@router.post("/evaluate", response_model=None,
             responses={200: {"model": answers.EvaluateAnswer}, **INSTANCE_ERRORS})
async def evaluate(body: EvaluateRequest, manager: Manager) -> dict[str, Any]:
    sparse = body.params.get("sparse", True)
    if not isinstance(sparse, bool):
        raise EnvServiceError(f"params.sparse must be true or false; got {sparse!r}", field="params.sparse")
    return _ok(await manager.call(body.instance_id, "evaluate", sparse))


@router.post("/get_info", response_model=None, responses={200: {"model": answers.InfoAnswer}, **INSTANCE_ERRORS})
async def get_info(body: InstanceRequest, manager: Manager) -> dict[str, Any]:
    return _ok(await manager.call(body.instance_id, "info"))


@router.post("/release", response_model=None,
             responses={200: {"model": answers.ReleaseAnswer}, **answers.COMMON_ERRORS})
async def release(body: InstanceRequest, manager: Manager, settings: Settings) -> Any:
    if await manager.release(body.instance_id):
        return _ok(True)
    # 200 as the reference answers it: its clients read ``success`` and would retry (or raise on) a 4xx.
    return error_response(ERROR_ENVELOPE, 200, "unknown_instance", f"nothing to release: no live instance "
                          f"{body.instance_id!r} (never created, already released, or reaped after idling "
                          f"{settings.idle_timeout_s:g} s)", "instance_id")


@router.get("/stats", response_model=None, responses={200: {"model": answers.StatsAnswer}, **answers.COMMON_ERRORS})
async def stats(manager: Manager, settings: Settings) -> dict[str, Any]:
    return _ok({"live_instances": manager.live, "max_instances": settings.max_instances, **manager.stats})
