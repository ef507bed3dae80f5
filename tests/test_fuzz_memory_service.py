"""The memory service fuzzed against its own OpenAPI schema (schemathesis, in process).

The app is built in process around a real :class:`MemoryService` (MiniLM embedder, faiss store on a temporary
folder, ``io_root`` confining dump/load to it, a bearer token required) with the scripted OpenAI-compatible
server as its LLM, so summarisation, rerank and rewrite run for real. Per operation ``EXAMPLES`` requests
that fit the schema and ``EXAMPLES`` that break it (8 operations: at most 8 x 2 x 15 = 240 requests; the
embedder makes a request cost ~10-50 ms, about 30 s in all on the 2-core machine). Required of every
answer: no 5xx; status, content type and body as ``/openapi.json`` declares them; every error JSON
``{success: false, answer: "", metadata: {}, error: {code, message, field}}`` with the field named.

Half of the schema-fitting requests are pinned to a workspace that holds memories, so copy, list, export,
retrieve and delete reach stored data instead of answering "empty".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import strategies as st
from memory_service_fixture import task_summariser
from schema_fuzz import asgi_schema, fuzz_schema, json_error_names_field, stop_apps
from scripted_openai_server import SCRIPTED_API_KEY_ENV, shared_scripted_llm_server

#: Generated requests per operation and mode (positive, negative) in the default suite.
EXAMPLES = 15
TOKEN_ENV = "AGENTEVOLVER_FUZZ_MEMORY_TOKEN"
TOKEN = "fuzz-token"
SEEDED = "fuzz-seeded"
SEED_LINES = b"\n".join([
    b'{"content": "Call the calculator before answering.", "when_to_use": "arithmetic questions"}',
    b'{"content": "List the folder before moving files.", "when_to_use": "file system tasks"}',
])


@pytest.fixture
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from agentevolver.memory_service.app import create_app
    from agentevolver.memory_service.service import MemoryService
    from agentevolver.memory_service.settings import MemoryServiceSettings

    data = tmp_path_factory.mktemp("fuzz_memory")
    llm = shared_scripted_llm_server()
    llm.respond_with(task_summariser)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TOKEN_ENV, TOKEN)
        patch.setenv(SCRIPTED_API_KEY_ENV, "unused")
        settings = MemoryServiceSettings(data_dir=data / "store", io_root=data, auth_token_env=TOKEN_ENV,
                                         llm=llm.llm_config())
        yield create_app(MemoryService.open(settings))
        stop_apps()
        llm.respond_with(None)


def _pin(case: Any, data: st.DataObject) -> None:
    """Point half the schema-fitting requests at the seeded workspace (and the io_root for dump/load)."""
    if not data.draw(st.booleans(), label="pin"):
        return
    if "workspace_id" in (case.path_parameters or {}):
        case.path_parameters["workspace_id"] = SEEDED
    if isinstance(case.body, dict) and "workspace_id" in case.body:
        case.body["workspace_id"] = data.draw(st.sampled_from([SEEDED, "fuzz-other"]), label="workspace_id")
        if case.body.get("src_workspace_id") is not None:
            case.body["src_workspace_id"] = SEEDED
        if case.body.get("path") is not None:
            case.body["path"] = "dumps"


def test_memory_service_answers_every_generated_request_as_its_schema_declares(app: Any) -> None:
    from schemathesis.python import asgi

    headers = {"Authorization": f"Bearer {TOKEN}"}
    with asgi.get_client(app) as client:
        seeded = client.post(f"/workspaces/{SEEDED}/import", headers=headers, data=SEED_LINES)
        assert seeded.status_code == 200, seeded.text
    # 400 bad_file (a dump/load path) and 422 (copy without src, ...): rules across fields a schema cannot state
    counts = fuzz_schema(asgi_schema(app, domain_rejections=(400, 422)), max_examples=EXAMPLES, headers=headers,
                         pin=_pin, checks=[json_error_names_field()])
    assert len(counts) == 8 and all(count >= 1 for count in counts.values()), counts


def test_a_dump_path_no_file_system_takes_is_a_400_naming_path(app: Any) -> None:
    """Found while fuzzing: a NUL byte in ``path`` made ``Path.resolve`` / ``open`` raise ValueError (500)."""
    from schemathesis.python import asgi

    with asgi.get_client(app) as client:
        for action in ("dump", "load"):
            for path in ("\x00", "dumps/\x00x", "a" * 5000):
                answer = client.post("/vector_store", headers={"Authorization": f"Bearer {TOKEN}"},
                                     json={"workspace_id": SEEDED, "action": action, "path": path})
                assert answer.status_code == 400, (action, path[:20], answer.text)
                assert (answer.json()["error"]["code"], answer.json()["error"]["field"]) == ("bad_file", "path")
