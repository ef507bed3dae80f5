"""The trajectory viewer fuzzed against its own OpenAPI schema (schemathesis, in process).

The app is built in process over a small run folder written here (two steps of rollout dumps, one line of
which is corrupt, and a metrics file) and driven through schemathesis's ASGI transport with ``Accept:
application/json``, so errors come back as JSON: per operation ``EXAMPLES`` requests that fit the schema
and ``EXAMPLES`` that break it (6 operations: at most 6 x 2 x 25 = 300 requests, a few seconds). Required of
every answer: no 5xx; status, content type and body as ``/openapi.json`` declares them; every error JSON
``{"error": {code, message, field, hint}}`` naming the query parameter to change.

Half of the schema-fitting requests are pinned to the real run, steps and lines, so the pages render
real episodes instead of answering "not found".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import strategies as st
from schema_fuzz import asgi_schema, fuzz_schema, json_error_names_field, stop_apps

#: Generated requests per operation and mode (positive, negative) in the default suite.
EXAMPLES = 25
RUN = "runs/fuzz"


def _episode(step: int, line: int) -> dict[str, Any]:
    return {"step": step, "task_id": f"t{line}", "reward": {"outcome": float(line % 2)}, "success": line % 2 == 1,
            "num_turns": 1, "termination": "done",
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2 + 2?"},
                         {"role": "assistant", "content": "4"}],
            "prompt_ids": [1, 2, 3], "response_ids": [4, 5], "response_mask": [1, 1], "step_ids": [0, 0],
            "advantages": [0.5, 0.5], "step_flags": [True]}


@pytest.fixture
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from agentevolver.logview import create_app

    root = tmp_path_factory.mktemp("fuzz_logview")
    dumps = root / RUN / "rollouts"
    dumps.mkdir(parents=True)
    for step in (1, 2):
        lines = [json.dumps(_episode(step, line)) for line in (1, 2, 3)]
        lines.insert(1, "{not json")  # a corrupt line is a problem shown on the page, never a crash
        (dumps / f"step_{step}.jsonl").write_text("\n".join(lines) + "\n")
    (root / RUN / "metrics.jsonl").write_text("\n".join(
        json.dumps({"step": step, "critic/score/mean": step / 2}) for step in (1, 2)) + "\n")
    yield create_app(root)
    stop_apps()


def _pin(case: Any, data: st.DataObject) -> None:
    """Point half the schema-fitting requests at the real run, its steps and its lines."""
    query = case.query
    if not isinstance(query, dict) or not data.draw(st.booleans(), label="pin"):
        return
    if "run" in query:
        query["run"] = RUN
    if "step" in query:
        query["step"] = data.draw(st.sampled_from([1, 2]), label="step")
    if "line" in query:
        query["line"] = data.draw(st.sampled_from([1, 2, 3, 4]), label="line")


def test_viewer_answers_every_generated_request_as_its_schema_declares(app: Any) -> None:
    counts = fuzz_schema(asgi_schema(app), max_examples=EXAMPLES, headers={"Accept": "application/json"},
                         pin=_pin, checks=[json_error_names_field()])
    assert len(counts) == 6 and all(count >= 1 for count in counts.values()), counts


def test_a_run_that_is_no_usable_path_is_a_400_naming_run(app: Any) -> None:
    """Found while fuzzing: a NUL byte or an over-long name made ``Path.resolve`` raise, answered 500."""
    from schemathesis.python import asgi

    with asgi.get_client(app) as client:
        for route in ("/run", "/api/run", "/step"):
            for run in ("\x00", "..\x00", "a" * 5000, "x/" * 3000):
                answer = client.get(route, params={"run": run, "step": 1}, headers={"Accept": "application/json"})
                assert answer.status_code == 400, (route, run[:20], answer.text)
                error = answer.json()["error"]
                assert error["field"] == "run" and "not a usable path" in error["message"], error
