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

The routes are one router (:mod:`env_service.routes`) that reaches the instance manager and the settings
through ``request.app.state``; this module only builds the app: state, lifespan, error handlers, the body
limit and ``/healthz``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from agentevolver import __version__
from agentevolver.service_common import error_response, install_error_handlers, read_auth_token
from env_service.base import BaseEnv
from env_service.instances import InstanceManager, ManagerLimits
from env_service.routes import ERROR_ENVELOPE, router
from env_service.settings import ServiceSettings

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

#: How the env service words the validation problems its clients meet most.
_PHRASES = {
    "extra_forbidden": "unknown field {field!r}; allowed: env_type, task_id, instance_id, messages, params",
    "missing": "{field} is required",
    "string_too_short": "{field} is required (got an empty string or null)",
}


def create_app(settings: ServiceSettings, env_classes: dict[str, type[BaseEnv]]) -> FastAPI:
    """Build the app for the given (already imported) environment classes; the routes are :mod:`.routes`."""
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
    app.state.settings = settings
    app.state.auth_token = read_auth_token(settings.auth_token_env)
    install_error_handlers(app, ERROR_ENVELOPE, service_name="environment service", logger=logger,
                           phrases=_PHRASES)
    app.middleware("http")(limit_body)
    app.get("/healthz", response_class=PlainTextResponse)(healthz)  # the one route without the token
    app.include_router(router)
    return app


async def healthz() -> str:
    return "OK"


async def limit_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """413 for a body over ``max_body_bytes``: by its declared length, or as it arrived when chunked."""
    limit = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return error_response(ERROR_ENVELOPE, 413, "body_too_large",
                              f"request body is {declared} bytes; the limit is {limit}", "body")
    if request.method == "POST" and declared is None:
        body = await request.body()  # chunked upload: measure what arrived
        if len(body) > limit:
            return error_response(ERROR_ENVELOPE, 413, "body_too_large",
                                  f"request body exceeds the limit of {limit} bytes", "body")
    return await call_next(request)
