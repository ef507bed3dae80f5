"""What the viewer's routes share: the folder of runs, the page templates, the file cache and the decoder.

One :class:`Viewer` per app, kept at ``app.state.viewer``; the routes (:mod:`.routes`) and the error
handlers (:mod:`.app`) reach it through ``request.app.state``. The JSON models here are what ``/api/*``
answers and what every route declares in ``/openapi.json``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import BaseModel

from agentevolver.logview.runs import FileCache, MetricsFile, Run, list_steps, read_metrics_file, step_path
from agentevolver.logview.tokens import TokenDecoder

__all__ = [
    "API_ERRORS",
    "PAGE_ERRORS",
    "ErrorBody",
    "ErrorInfo",
    "Health",
    "RunState",
    "StepInfo",
    "Viewer",
    "run_state_of",
    "viewer_of",
]


class ErrorInfo(BaseModel):
    code: str
    message: str
    field: str | None = None
    hint: str | None = None


class ErrorBody(BaseModel):
    """An error as JSON (``/api/*``, and pages asked for with ``Accept: application/json``)."""

    error: ErrorInfo


class RunState(BaseModel):
    """``/api/run``: what the run page polls to notice new steps."""

    steps: list[int]
    metrics_lines: int


class Health(BaseModel):
    status: str
    root: str
    root_exists: bool


#: ``/api/run``'s errors: always JSON (registers the ErrorBody component the pages' errors refer to).
API_ERRORS: dict[int | str, dict[str, Any]] = {status: {"model": ErrorBody} for status in (400, 404, 422)}
#: A page's errors: a page by default, JSON with ``Accept: application/json``. A page names a run (400
#: outside the root, 404 missing) and reads files (500 unreadable). Written out because FastAPI would
#: put a ``model`` under the route's own media type (text/html) only.
PAGE_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"content": {"text/html": {"schema": {"type": "string"}},
                         "application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
    for status in (400, 404, 422, 500)}


@dataclass
class StepInfo:
    step: int
    size: str
    modified: str
    metrics: dict[str, float]


def _wants_html(request: Request) -> bool:
    """Pages answer errors as pages (a browser, curl), unless the client asks for JSON (``Accept:
    application/json``, as a script would); ``/api/*`` always answers JSON."""
    return not request.url.path.startswith("/api/") and "application/json" not in request.headers.get("accept", "")


def _size(num: float) -> str:
    for unit in ("B", "KB", "MB"):
        if num < 1024:
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.1f} GB"


def _modified(path: Path) -> tuple[str, int]:
    info = path.stat()
    return dt.datetime.fromtimestamp(info.st_mtime).strftime("%Y-%m-%d %H:%M:%S"), info.st_size


def _page_templates() -> Environment:
    pages = Environment(loader=PackageLoader("agentevolver.logview", "templates"),
                        autoescape=select_autoescape(default=True, default_for_string=True))
    pages.filters["num"] = lambda value, digits=3: "—" if value is None else f"{value:.{digits}f}"
    return pages


@dataclass
class Viewer:
    """The viewer over ``root`` (a run folder or a folder of runs; it may not exist yet)."""

    root: Path
    max_depth: int
    decoder: TokenDecoder
    pages: Environment = field(default_factory=_page_templates)
    cache: FileCache = field(default_factory=FileCache)

    def render(self, name: str, code: int = 200, **context: Any) -> HTMLResponse:
        body = self.pages.get_template(name).render(root=self.root, **context)
        return HTMLResponse(body, status_code=code)

    def metrics_of(self, run: Run) -> MetricsFile | None:
        if not run.metrics_path.is_file():
            return None
        return self.cache.get(run.metrics_path, read_metrics_file)

    def step_infos(self, run: Run, metrics: MetricsFile | None) -> list[StepInfo]:
        infos = []
        for step in list_steps(run):
            try:
                modified, size = _modified(step_path(run, step))
            except OSError:
                continue  # replaced between the listing and the stat
            infos.append(StepInfo(step, _size(size), modified, metrics.at_step(step) if metrics else {}))
        return infos

    def error(self, request: Request, status: int, code: str, message: str, hint: str | None,
              field: str | None) -> Response:
        """An error as a page, or as JSON :class:`ErrorBody` when the client asks for JSON."""
        if _wants_html(request):
            return self.render("error.html.jinja", status, message=message, hint=hint, status=status)
        body = ErrorBody(error=ErrorInfo(code=code, message=message, field=field, hint=hint))
        return JSONResponse(body.model_dump(), status_code=status)


def run_state_of(run: Run, metrics: MetricsFile | None) -> dict[str, Any]:
    """What ``/api/run`` answers and the run page starts from (:class:`RunState`)."""
    return {"steps": list_steps(run), "metrics_lines": metrics.lines if metrics else 0}


def viewer_of(request: Request) -> Viewer:
    """The app's viewer (a dependency of every route, and what the error handlers render with)."""
    return request.app.state.viewer
