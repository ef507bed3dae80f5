"""FastAPI plumbing shared by the framework's JSON services (the environment and the memory service).

Both answer every error as JSON ``{..., error: {code, message, field}}`` with its status chosen in one
place and never a traceback, and both guard every route but ``/healthz`` with an optional bearer token read
from a named environment variable. Only the envelope around ``error`` differs (the environment service's
``{success, data}``, ReMe's ``{success, answer, metadata}``), and how a few validation problems are
phrased, so those are parameters.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentevolver.service_errors import ServiceError

__all__ = [
    "describe_validation_error",
    "error_response",
    "install_error_handlers",
    "read_auth_token",
    "require_token",
]


def error_response(envelope: Mapping[str, Any], status: int, code: str, message: str,
                   field: str | None = None) -> JSONResponse:
    """A JSON error answer: the service's ``envelope`` keys, then ``error: {code, message, field}``."""
    return JSONResponse(status_code=status,
                        content={**envelope, "error": {"code": code, "message": message, "field": field}})


def describe_validation_error(err: RequestValidationError,
                              phrases: Mapping[str, str]) -> tuple[str, str | None]:
    """The first validation problem as (message, dotted body-relative field).

    ``phrases`` maps a pydantic error type (``extra_forbidden``, ``missing``) to the service's own wording,
    a template with ``{field!r}``; other problems read ``<field>: <pydantic's message>``.
    """
    problems = err.errors()
    if not problems:
        return "invalid request", None
    first = problems[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", first.get("msg"))
        return f"request body is not valid JSON: {reason}", "body"
    if field is None and tuple(first.get("loc", ())) == ("body",):
        # The body as a whole has the wrong type (``[null]``, ``"x"``): name it, so the error says what to fix.
        return f"request body must be a JSON object; got {type(first.get('input')).__name__}", "body"
    phrase = phrases.get(str(first.get("type")))
    if phrase is not None:
        return phrase.format(field=field), field
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{field or 'body'}: {message}{more}", field


def install_error_handlers(app: FastAPI, envelope: Mapping[str, Any], *, service_name: str,
                           logger: logging.Logger, phrases: Mapping[str, str],
                           warn_on_5xx: bool = False) -> None:
    """Map every error to a JSON answer: a :class:`ServiceError` to its own status, a failed bearer check
    to 401, a request the models reject to 400 (not JSON) or 422, anything else to 500 (logged).

    ``warn_on_5xx`` also logs the service's own 5xx errors (a failing backend the operator should see).
    """

    @app.exception_handler(ServiceError)
    async def on_service_error(_: Request, err: ServiceError) -> JSONResponse:
        if warn_on_5xx and err.status >= 500:
            logger.warning("%s: %s", err.code, err.message)
        return error_response(envelope, err.status, err.code, err.message, err.field)

    @app.exception_handler(_Unauthorized)
    async def on_unauthorized(_: Request, __: _Unauthorized) -> JSONResponse:
        response = error_response(envelope, 401, "unauthorized",
                                  "missing or wrong bearer token: send 'Authorization: Bearer <token>' with the "
                                  "token the service's auth_token_env variable holds", "Authorization")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        # What FastAPI/Starlette raise themselves: a body that is not UTF-8 JSON (400, which would otherwise
        # answer ``{"detail": ...}`` without the envelope), an unknown path (404), a wrong method (405).
        code, field, message = _HTTP_ERRORS.get(err.status_code, (f"http_{err.status_code}", None, str(err.detail)))
        response = error_response(envelope, err.status_code, code,
                                  message.format(path=request.url.path, method=request.method), field)
        response.headers.update(err.headers or {})
        return response

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        message, field = describe_validation_error(err, phrases)
        status = 400 if err.errors() and err.errors()[0].get("type") == "json_invalid" else 422
        return error_response(envelope, status, "invalid_json" if status == 400 else "invalid_request",
                              message, field)

    @app.exception_handler(Exception)
    async def on_unexpected(_: Request, err: Exception) -> JSONResponse:
        logger.exception("unexpected error in the %s", service_name)
        return error_response(envelope, 500, "internal_error", f"{type(err).__name__}: {err}")


#: Starlette's own errors as (code, field, message): the request part to fix is named as for any other error.
_HTTP_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_json", "body", "request body is not valid JSON: send a UTF-8 JSON object"),
    404: ("not_found", "path", "no route {path!r}: see /docs for the routes of this service"),
    405: ("method_not_allowed", "method", "{method} is not allowed on {path}: see /docs for its methods"),
}


def read_auth_token(auth_token_env: str | None) -> str | None:
    """The bearer token from the environment variable the settings name (None: no auth).

    A named but unset variable stops start-up: a service meant to be protected must not come up open.
    """
    token = os.environ.get(auth_token_env) if auth_token_env else None
    if auth_token_env and not token:
        raise ValueError(f"auth_token_env names {auth_token_env!r} but that environment variable is unset")
    return token


_BEARER = HTTPBearer(auto_error=False)
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


async def require_token(request: Request, credentials: _Credentials) -> None:
    """Auth as a dependency: with a token in ``app.state.auth_token``, a route needs ``Bearer <token>``."""
    token = request.app.state.auth_token
    if token is None:
        return
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), token.encode()):
        raise _Unauthorized()


class _Unauthorized(Exception):
    """Raised by :func:`require_token`; mapped to a 401 JSON error."""
