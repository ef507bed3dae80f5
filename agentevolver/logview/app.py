"""The viewer's web app: server-rendered pages over a folder of runs (see docs/logview.md).

Pages: ``/`` runs, ``/run`` steps and metric curves, ``/step`` the episodes of one step (filters, sort),
``/episode`` one episode (conversation and token view); ``/api/run`` lets the run page notice new steps
of a run that is still writing; ``/healthz`` answers the launcher. Every problem a user can meet (root
not there yet, missing step, corrupt line, wrong field type, bad query parameter) renders as a page that
says what is wrong; nothing in the files can crash the server. A client that sends ``Accept:
application/json`` (and every ``/api/*`` caller) gets the same errors as JSON ``{"error": {code, message,
field, hint}}`` naming the query parameter to change; every route declares its answers in ``/openapi.json``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentevolver.logview.episodes import (
    EpisodeRow,
    advantage_range,
    episode_row,
    parse_record,
    split_opening,
    step_label,
    token_rows,
)
from agentevolver.logview.plots import heat_strip, line_chart, panels_for
from agentevolver.logview.runs import (
    METRICS_FILE,
    FileCache,
    MetricsFile,
    Run,
    ViewerError,
    discover_runs,
    list_steps,
    read_dump_file,
    read_metrics_file,
    resolve_run,
    step_path,
)
from agentevolver.logview.tokens import TokenDecoder

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

SortKey = Literal["line", "task", "reward", "turns", "termination", "tokens"]
_SORT_KEYS: dict[str, Any] = {
    "line": lambda row: row.line,
    "task": lambda row: (row.task_id, row.line),
    "reward": lambda row: (row.reward if row.reward is not None else float("-inf"), row.line),
    "turns": lambda row: (row.turns if row.turns is not None else -1, row.line),
    "termination": lambda row: (row.termination, row.line),
    "tokens": lambda row: (row.policy_tokens, row.line),
}


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
_API_ERRORS: dict[int | str, dict[str, Any]] = {status: {"model": ErrorBody} for status in (400, 404, 422)}
#: A page's errors: a page by default, JSON with ``Accept: application/json``. A page names a run (400
#: outside the root, 404 missing) and reads files (500 unreadable). Written out because FastAPI would
#: put a ``model`` under the route's own media type (text/html) only.
_PAGE_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"content": {"text/html": {"schema": {"type": "string"}},
                         "application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
    for status in (400, 404, 422, 500)}


def _wants_html(request: Request) -> bool:
    """Pages answer errors as pages (a browser, curl), unless the client asks for JSON (``Accept:
    application/json``, as a script would); ``/api/*`` always answers JSON."""
    return not request.url.path.startswith("/api/") and "application/json" not in request.headers.get("accept", "")


@dataclass
class StepInfo:
    step: int
    size: str
    modified: str
    metrics: dict[str, float]


def _size(num: int) -> str:
    for unit in ("B", "KB", "MB"):
        if num < 1024:
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.1f} GB"


def _modified(path: Path) -> tuple[str, int]:
    info = path.stat()
    return dt.datetime.fromtimestamp(info.st_mtime).strftime("%Y-%m-%d %H:%M:%S"), info.st_size


def create_app(root: str | Path, *, tokenizer: str | None = None, max_depth: int = 4) -> FastAPI:
    """The viewer over ``root`` (a run folder or a folder of runs; it may not exist yet)."""
    root = Path(root).expanduser().resolve()
    decoder = TokenDecoder(tokenizer)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        threading.Thread(target=decoder.preload, name="logview-tokenizer", daemon=True).start()
        yield

    app = FastAPI(title="AgentEvolver trajectory viewer", docs_url=None, redoc_url=None, lifespan=lifespan)
    pages = Environment(loader=PackageLoader("agentevolver.logview", "templates"),
                        autoescape=select_autoescape(default=True, default_for_string=True))
    pages.filters["num"] = lambda value, digits=3: "—" if value is None else f"{value:.{digits}f}"
    cache = FileCache()

    def render(name: str, code: int = 200, **context: Any) -> HTMLResponse:
        body = pages.get_template(name).render(root=root, **context)
        return HTMLResponse(body, status_code=code)

    def metrics_of(run: Run) -> MetricsFile | None:
        if not run.metrics_path.is_file():
            return None
        return cache.get(run.metrics_path, read_metrics_file)

    def step_infos(run: Run, metrics: MetricsFile | None) -> list[StepInfo]:
        infos = []
        for step in list_steps(run):
            try:
                modified, size = _modified(step_path(run, step))
            except OSError:
                continue  # replaced between the listing and the stat
            infos.append(StepInfo(step, _size(size), modified, metrics.at_step(step) if metrics else {}))
        return infos

    def error(request: Request, status: int, code: str, message: str, hint: str | None,
              field: str | None) -> Response:
        if _wants_html(request):
            return render("error.html.jinja", status, message=message, hint=hint, status=status)
        body = ErrorBody(error=ErrorInfo(code=code, message=message, field=field, hint=hint))
        return JSONResponse(body.model_dump(), status_code=status)

    @app.exception_handler(ViewerError)
    async def viewer_error(request: Request, err: ViewerError) -> Response:
        return error(request, err.status, "not_found" if err.status == 404 else "viewer_error", err.message,
                     err.hint, err.field)

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request: Request, err: RequestValidationError) -> Response:
        problems = err.errors()
        lines = [f"query parameter {'.'.join(str(p) for p in e['loc'][1:])!r}: {e['msg']}" for e in problems]
        field = ".".join(str(p) for p in problems[0]["loc"][1:]) if problems else None
        return error(request, 422, "invalid_parameter", "; ".join(lines),
                     "use the links and forms of the pages instead of editing the address", field)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        field = {404: "path", 405: "method"}.get(err.status_code)
        return error(request, err.status_code, f"http_{err.status_code}", f"{request.url.path}: {err.detail}",
                     None, field)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> Response:
        logger.exception("viewer error on %s", request.url)
        return error(request, 500, "internal_error", f"the viewer failed: {type(err).__name__}: {err}",
                     "this is a bug in the viewer; the server log has the details", None)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/healthz", response_model=None, responses={200: {"model": Health}})
    def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "root": str(root), "root_exists": root.is_dir()})

    @app.get("/", response_class=HTMLResponse, responses=_PAGE_ERRORS)
    def index() -> HTMLResponse:
        runs = discover_runs(root, max_depth)
        rows = []
        for run in runs:
            steps = list_steps(run)
            rows.append({"run": run, "steps": steps, "metrics": run.metrics_path.is_file()})
        return render("index.html.jinja", rows=rows, root_exists=root.is_dir(), max_depth=max_depth)

    @app.get("/run", response_class=HTMLResponse, responses=_PAGE_ERRORS)
    def run_page(run: str = Query(...)) -> HTMLResponse:
        found = resolve_run(root, run)
        problems: list[str] = []
        metrics = None
        try:
            metrics = metrics_of(found)
        except ViewerError as err:
            problems.append(err.message)
        panels = []
        if metrics is not None:
            problems.extend(f"{METRICS_FILE} {problem}" for problem in metrics.problems)
            panels = [line_chart(panel.series, title=panel.title) for panel in panels_for(metrics.series)]
        others = []
        if metrics is not None:
            others = [line_chart({name: points}, title=name, width=300, height=140)
                      for name, points in metrics.series.items()]
        steps = step_infos(found, metrics)
        return render("run.html.jinja", run=found, steps=steps, panels=panels, others=others, metrics=metrics,
                      problems=problems, state=_state(found, metrics))

    def _state(run: Run, metrics: MetricsFile | None) -> dict[str, Any]:
        return {"steps": list_steps(run), "metrics_lines": metrics.lines if metrics else 0}

    @app.get("/api/run", response_model=None, responses={200: {"model": RunState}, **_API_ERRORS})
    def run_state(run: str = Query(...)) -> JSONResponse:
        found = resolve_run(root, run)
        try:
            metrics = metrics_of(found)
        except ViewerError:
            metrics = None
        return JSONResponse(_state(found, metrics))

    @app.get("/step", response_class=HTMLResponse, responses=_PAGE_ERRORS)
    def step_page(
        run: str = Query(...),
        step: int = Query(..., ge=0),
        failed: bool = False,
        task: str = "",
        termination: str = "",
        sort: SortKey = "line",
        order: Literal["asc", "desc"] = "asc",
    ) -> HTMLResponse:
        found = resolve_run(root, run)
        steps = list_steps(found)
        if step not in steps:
            raise ViewerError(
                f"run {found.id!r} has no dump for step {step} ({step_path(found, step).name})",
                hint=f"steps with dumps: {', '.join(map(str, steps)) or 'none yet'}", field="step")
        dump = cache.get(step_path(found, step), read_dump_file)
        if "rows" not in dump.derived:  # computed once per version of the file, kept with it in the cache
            dump.derived["rows"] = [episode_row(line, record) for line, record in dump.records]
        rows: list[EpisodeRow] = list(dump.derived["rows"])
        tasks = sorted({row.task_id for row in rows})
        terminations = sorted({row.termination for row in rows})
        shown = [row for row in rows
                 if (not failed or row.success is not True)
                 and (not task or row.task_id == task)
                 and (not termination or row.termination == termination)]
        shown.sort(key=_SORT_KEYS[sort], reverse=order == "desc")
        index = steps.index(step)
        return render(
            "step.html.jinja", run=found, step=step, rows=shown, total=len(rows), dump=dump, tasks=tasks,
            terminations=terminations, labelled=any(row.labelled for row in rows),
            filters={"failed": failed, "task": task, "termination": termination, "sort": sort, "order": order},
            previous=steps[index - 1] if index > 0 else None,
            next=steps[index + 1] if index + 1 < len(steps) else None,
            success_rate=(sum(row.success is True for row in rows) / len(rows)) if rows else None,
        )

    @app.get("/episode", response_class=HTMLResponse, responses=_PAGE_ERRORS)
    def episode_page(run: str = Query(...), step: int = Query(..., ge=0), line: int = Query(..., ge=1),
                     sample: int = Query(-1, ge=-1)) -> HTMLResponse:
        found = resolve_run(root, run)
        dump = cache.get(step_path(found, step), read_dump_file)
        view, problems = parse_record(dump.record_at(line))
        samples = len(view.other_samples) + 1
        if sample >= samples:
            raise ViewerError(f"episode on line {line} has {samples} samples; there is no sample {sample}",
                              hint="samples are numbered from 0; -1 is the final one", field="sample")
        final = sample in (-1, samples - 1)
        tokens_of = view if final else view.other_samples[sample]
        labels = [step_label(flag) for flag in view.step_flags or []]
        advantages = view.advantages if final else None
        texts, decoded = decoder.decode(found.path, tokens_of.prompt_ids + tokens_of.response_ids)
        tokens = token_rows(tokens_of, texts, advantages=advantages, labels=labels)
        response = tokens[len(tokens_of.prompt_ids):]
        strip = heat_strip([t.advantage if t.kind == "policy" else None for t in response]) if advantages else None
        lines = [number for number, _ in dump.records]
        position = lines.index(line)
        opening, conversation = split_opening(view.messages or [])
        return render(
            "episode.html.jinja", run=found, step=step, line=line, view=view, problems=problems,
            tokens=tokens, prompt_len=len(tokens_of.prompt_ids), decoded=decoded, strip=strip, labels=labels,
            sample=sample, samples=samples, final=final, opening=opening, conversation=conversation,
            advantage=advantage_range(tokens_of, advantages),
            previous=lines[position - 1] if position > 0 else None,
            next=lines[position + 1] if position + 1 < len(lines) else None,
            counts={"prompt": len(tokens_of.prompt_ids), "policy": sum(t.kind == "policy" for t in response),
                    "observation": sum(t.kind == "observation" for t in response),
                    "experience": sum(t.experience for t in tokens)},
        )

    return app
