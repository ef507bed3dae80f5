"""The error answers each route declares (the OpenAPI ``responses=`` of :mod:`env_service.routes`).

A route's success answer is its ``response_model``, one of :mod:`agentevolver.schema.env_answers` (the
models the client parses too), validated and serialised by FastAPI on the way out. Errors are written by the
error handlers (``install_error_handlers`` of :mod:`agentevolver.service_common`), so they are declared here
by status: ``tests/test_fuzz_env_service.py`` checks that every answer has a status and body a route declares.
"""

from __future__ import annotations

from typing import Any

from agentevolver.schema.env_answers import ErrorAnswer

__all__ = ["COMMON_ERRORS", "CREATE_ERRORS", "ENV_ERRORS", "INSTANCE_ERRORS"]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorAnswer} for status in statuses}


#: Every route guarded by the token may answer these (400 not JSON, 401 token, 413 body, 422 a field).
COMMON_ERRORS = _errors(400, 401, 413, 422)
#: Routes that name an environment (404 unknown_env / unknown_split / unknown_task, 503 env_unavailable).
ENV_ERRORS = {**COMMON_ERRORS, **_errors(404, 503)}
#: Routes that address a live instance (404 unknown, 410 gone, 502 crashed, 504 timed out).
INSTANCE_ERRORS = {**COMMON_ERRORS, **_errors(404, 410, 502, 504)}
#: ``/create``: an environment and a new instance (409 duplicate id, 429 service full).
CREATE_ERRORS = {**ENV_ERRORS, **INSTANCE_ERRORS, **_errors(409, 429)}
