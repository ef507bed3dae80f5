"""The viewer's pages and ``/api/run``, as one router over the app's :class:`~agentevolver.logview.viewer.Viewer`.

Each route reaches the viewer (the folder of runs, templates, file cache, token decoder) through a
dependency that reads ``request.app.state``, so the routes are plain module-level functions and
:func:`agentevolver.logview.app.create_app` only builds the app and includes this router.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse, JSONResponse, Response

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
    ViewerError,
    discover_runs,
    list_steps,
    read_dump_file,
    resolve_run,
    step_path,
)
from agentevolver.logview.viewer import (
    API_ERRORS,
    PAGE_ERRORS,
    Health,
    RunState,
    Viewer,
    run_state_of,
    viewer_of,
)

__all__ = ["router"]

SortKey = Literal["line", "task", "reward", "turns", "termination", "tokens"]
_SORT_KEYS: dict[str, Any] = {
    "line": lambda row: row.line,
    "task": lambda row: (row.task_id, row.line),
    "reward": lambda row: (row.reward if row.reward is not None else float("-inf"), row.line),
    "turns": lambda row: (row.turns if row.turns is not None else -1, row.line),
    "termination": lambda row: (row.termination, row.line),
    "tokens": lambda row: (row.policy_tokens, row.line),
}



ViewerDep = Annotated[Viewer, Depends(viewer_of)]
#: A run id, as ``/openapi.json`` declares it: a path relative to the root, without NUL bytes, at most 255
#: characters. Declared, not enforced (any string is read): one that no file system can hold is answered
#: 400 "not a usable path" naming ``run`` (:func:`~agentevolver.logview.runs.resolve_run`).
RunId = Annotated[str, Query(json_schema_extra={"pattern": "^[^\\x00]*$", "maxLength": 255})]

router = APIRouter()


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> Response:
    return Response(status_code=204)

@router.get("/healthz", response_model=None, responses={200: {"model": Health}})
def healthz(viewer: ViewerDep) -> JSONResponse:
    return JSONResponse({"status": "ok", "root": str(viewer.root), "root_exists": viewer.root.is_dir()})

@router.get("/", response_class=HTMLResponse, responses=PAGE_ERRORS)
def index(viewer: ViewerDep) -> HTMLResponse:
    runs = discover_runs(viewer.root, viewer.max_depth)
    rows = []
    for run in runs:
        steps = list_steps(run)
        rows.append({"run": run, "steps": steps, "metrics": run.metrics_path.is_file()})
    return viewer.render("index.html.jinja", rows=rows, root_exists=viewer.root.is_dir(), max_depth=viewer.max_depth)

@router.get("/run", response_class=HTMLResponse, responses=PAGE_ERRORS)
def run_page(viewer: ViewerDep, run: RunId) -> HTMLResponse:
    found = resolve_run(viewer.root, run)
    problems: list[str] = []
    metrics = None
    try:
        metrics = viewer.metrics_of(found)
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
    steps = viewer.step_infos(found, metrics)
    return viewer.render("run.html.jinja", run=found, steps=steps, panels=panels, others=others, metrics=metrics,
                  problems=problems, state=run_state_of(found, metrics))

@router.get("/api/run", response_model=None, responses={200: {"model": RunState}, **API_ERRORS})
def run_state(viewer: ViewerDep, run: RunId) -> JSONResponse:
    found = resolve_run(viewer.root, run)
    try:
        metrics = viewer.metrics_of(found)
    except ViewerError:
        metrics = None
    return JSONResponse(run_state_of(found, metrics))

@router.get("/step", response_class=HTMLResponse, responses=PAGE_ERRORS)
def step_page(
    viewer: ViewerDep,
    run: RunId,
    step: int = Query(..., ge=0),
    failed: bool = False,
    task: str = "",
    termination: str = "",
    sort: SortKey = "line",
    order: Literal["asc", "desc"] = "asc",
) -> HTMLResponse:
    found = resolve_run(viewer.root, run)
    steps = list_steps(found)
    if step not in steps:
        raise ViewerError(
            f"run {found.id!r} has no dump for step {step} ({step_path(found, step).name})",
            hint=f"steps with dumps: {', '.join(map(str, steps)) or 'none yet'}", field="step")
    dump = viewer.cache.get(step_path(found, step), read_dump_file)
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
    return viewer.render(
        "step.html.jinja", run=found, step=step, rows=shown, total=len(rows), dump=dump, tasks=tasks,
        terminations=terminations, labelled=any(row.labelled for row in rows),
        filters={"failed": failed, "task": task, "termination": termination, "sort": sort, "order": order},
        previous=steps[index - 1] if index > 0 else None,
        next=steps[index + 1] if index + 1 < len(steps) else None,
        success_rate=(sum(row.success is True for row in rows) / len(rows)) if rows else None,
    )

@router.get("/episode", response_class=HTMLResponse, responses=PAGE_ERRORS)
def episode_page(viewer: ViewerDep, run: RunId, step: int = Query(..., ge=0), line: int = Query(..., ge=1),
                 sample: int = Query(-1, ge=-1)) -> HTMLResponse:
    found = resolve_run(viewer.root, run)
    dump = viewer.cache.get(step_path(found, step), read_dump_file)
    view, problems = parse_record(dump.record_at(line))
    samples = len(view.other_samples) + 1
    if sample >= samples:
        raise ViewerError(f"episode on line {line} has {samples} samples; there is no sample {sample}",
                          hint="samples are numbered from 0; -1 is the final one", field="sample")
    final = sample in (-1, samples - 1)
    tokens_of = view if final else view.other_samples[sample]
    labels = [step_label(flag) for flag in view.step_flags or []]
    advantages = view.advantages if final else None
    texts, decoded = viewer.decoder.decode(found.path, tokens_of.prompt_ids + tokens_of.response_ids)
    tokens = token_rows(tokens_of, texts, advantages=advantages, labels=labels)
    response = tokens[len(tokens_of.prompt_ids):]
    strip = heat_strip([t.advantage if t.kind == "policy" else None for t in response]) if advantages else None
    lines = [number for number, _ in dump.records]
    position = lines.index(line)
    opening, conversation = split_opening(view.messages or [])
    return viewer.render(
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
