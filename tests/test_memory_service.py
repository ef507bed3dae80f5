"""The experience memory service, through HTTP against the real service started by its real command.

``python -m agentevolver.memory_service`` runs as a subprocess with the shipped all-MiniLM-L6-v2 embedder and
the faiss store on a temporary data folder; the scripted OpenAI-compatible server (tests/scripted_openai_server.py)
plays the summariser / reranker LLM -- the only test double, at the edge. Unit tests of the store, the prompt
parsing and the settings follow at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from memory_service_fixture import Service, memory_service
from ports import free_port
from scripted_openai_server import Reply, ScriptedOpenAIServer, shared_scripted_llm_server

from agentevolver.client.memory_client import MemoryClientError
from agentevolver.embedders import EmbeddingSettings
from agentevolver.errors import ConfigError
from agentevolver.memory_service import prompts
from agentevolver.memory_service.errors import StoreMismatch
from agentevolver.memory_service.settings import StoreSettings, load_settings
from agentevolver.memory_service.store import open_store
from agentevolver.schema.memory_wire import TaskMemory

REPO_ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------------------
# Running the real service
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm() -> ScriptedOpenAIServer:
    return shared_scripted_llm_server()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedOpenAIServer) -> Iterator[Service]:
    """One service with an LLM for the module (starting one loads torch + MiniLM: seconds)."""
    folder = tmp_path_factory.mktemp("memory")
    with memory_service(folder / "data", folder / "service.log", "--llm-base-url", llm.base_url,
                        "--llm-model", "scripted-model") as running:
        yield running


@pytest.fixture
def scripted(llm: ScriptedOpenAIServer) -> Iterator[ScriptedOpenAIServer]:
    llm.reset()
    try:
        yield llm
    finally:
        llm.reset()


# ---------------------------------------------------------------------------------------------------------
# A scripted summariser: answers by prompt kind and by which task the prompt is about
# ---------------------------------------------------------------------------------------------------------

TASKS = {
    "sort": "Sort the list [5, 3, 9] in ascending order with the python tool and report the result.",
    "flight": "Book the cheapest flight from Berlin to Paris for next Monday.",
    "email": "Send an email to Alice with the quarterly sales report attached.",
}
EXPERIENCE = {
    ("sort", "success"): ("Sorting a list of numbers into increasing order",
                          "Call the python tool with sorted(values) and report the returned list."),
    ("sort", "failure"): ("Ordering numeric lists",
                          "Do not sort by hand: mental sorting swapped elements; always run the code."),
    ("sort", "comparison"): ("Sorting numbers with a code tool",
                             "The better attempt executed sorted() instead of guessing the order."),
    ("flight", "success"): ("Booking airline tickets between two cities",
                            "Search all flights for the date first, then book the cheapest fare."),
    ("flight", "failure"): ("Reserving plane travel",
                            "Booking the first result missed cheaper fares; compare prices before booking."),
    ("flight", "comparison"): ("Choosing among flight offers",
                               "The better attempt sorted offers by price before booking."),
    ("email", "success"): ("Sending an email with a file attachment",
                           "Attach the file before calling send, and confirm the recipient address."),
    ("email", "failure"): ("Emailing documents to a colleague",
                           "BADIDEA: send the email twice to make sure it arrives."),
    ("email", "comparison"): ("Mailing reports",
                              "The better attempt attached the report before sending."),
}


def _kind(system: str) -> str:
    for kind, text in (("success", prompts.SUCCESS_SYSTEM), ("failure", prompts.FAILURE_SYSTEM),
                       ("comparison", prompts.COMPARISON_SYSTEM)):
        if system == text.format(n=3):
            return kind
    return {prompts.VALIDATION_SYSTEM: "validation", prompts.RERANK_SYSTEM: "rerank",
            prompts.REWRITE_SYSTEM: "rewrite"}[system]


def summariser(body: dict[str, Any]) -> str:
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    kind = _kind(system)
    if kind == "validation":
        return '{"score": 0.1, "reason": "harmful"}' if "BADIDEA" in user else '{"score": 0.9, "reason": "useful"}'
    task = next(name for name, text in TASKS.items() if text in user)
    when, advice = EXPERIENCE[(task, kind)]
    return "Here you go:\n```json\n" + json.dumps([{"when_to_use": when, "experience": advice}]) + "\n```"


def episode(task: str, score: float, answer: str = "done") -> dict[str, Any]:
    return {"task_id": task, "score": score, "messages": [
        {"role": "system", "content": "You are an agent with tools."},
        {"role": "user", "content": TASKS[task]},
        {"role": "assistant", "content": answer},
    ]}


def summarise_all(service: Service, scripted: ScriptedOpenAIServer, workspace: str) -> dict[str, Any]:
    scripted.respond_with(summariser)
    trajectories = [episode(t, 1.0, "success path") for t in TASKS] + [episode(t, 0.0, "failed path") for t in TASKS]
    response = service.post("/summary_task_memory", {"workspace_id": workspace, "trajectories": trajectories})
    assert response.status_code == 200, response.text
    return response.json()


# ---------------------------------------------------------------------------------------------------------
# Acceptance: summarise then retrieve; workspaces; restart; bad input
# ---------------------------------------------------------------------------------------------------------


def test_summarise_then_retrieve_returns_the_related_experience_first(service: Service, scripted):
    body = summarise_all(service, scripted, "acceptance")
    stats = body["metadata"]["stats"]
    assert body["success"] is True
    assert (stats["trajectories"], stats["tasks"], stats["successes"], stats["failures"]) == (6, 3, 3, 3)
    # per task: one success, one failure and one comparison extraction, then one validation per candidate
    kinds = [_kind(b["messages"][0]["content"]) for b in scripted.bodies]
    assert sorted(k for k in kinds if k != "validation") == ["comparison"] * 3 + ["failure"] * 3 + ["success"] * 3
    assert kinds.count("validation") == 9
    # grouping per task: each comparison prompt holds the two episodes of one task only
    for b in scripted.bodies:
        if _kind(b["messages"][0]["content"]) == "comparison":
            user = b["messages"][1]["content"]
            assert sum(text in user for text in TASKS.values()) == 1
            assert "success path" in user and "failed path" in user
    # the validation threshold kept the BADIDEA failure lesson out
    stored = body["metadata"]["memory_list"]
    assert stats["stored"] == len(stored) == 8 and stats["rejected"] == 1
    assert "BADIDEA" in body["metadata"]["rejected"][0]["content"]
    assert "threshold" in body["metadata"]["rejected"][0]["reason"]
    assert all(m["author"] == "scripted-model" and m["score"] == pytest.approx(0.9) for m in stored)

    for query, task in (("How do I put numbers in increasing order?", "sort"),
                        ("Buy a plane ticket from Rome to Madrid", "flight"),
                        ("Mail the budget spreadsheet to Bob as an attachment", "email")):
        answer = service.post("/retrieve_task_memory", {"workspace_id": "acceptance", "query": query, "top_k": 3})
        assert answer.status_code == 200, answer.text
        found = answer.json()["metadata"]["memory_list"]
        assert found[0]["metadata"]["task_id"] == task, (query, found)
        assert found[0]["similarity"] >= found[1]["similarity"] >= found[2]["similarity"]
        assert answer.json()["answer"].startswith(f"Experience 1 (applies when: {found[0]['when_to_use']})")


def test_reference_trainer_query_form_and_messages_retrieve_the_task(service: Service, scripted):
    summarise_all(service, scripted, "query-forms")
    steps = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": TASKS["flight"]}]
    by_query = service.post("/retrieve_task_memory",
                            {"workspace_id": "query-forms", "query": json.dumps(steps), "top_k": 1}).json()
    by_messages = service.post("/retrieve_task_memory",
                               {"workspace_id": "query-forms", "messages": steps, "top_k": 1}).json()
    for body in (by_query, by_messages):
        assert body["metadata"]["query"] == TASKS["flight"]
        assert body["metadata"]["memory_list"][0]["metadata"]["task_id"] == "flight"


def test_workspaces_are_separate(service: Service, scripted):
    summarise_all(service, scripted, "ws-a")
    client = service.client()
    empty = client.retrieve("ws-b", "sort numbers", top_k=3)
    assert empty.answer == "" and empty.metadata.memory_list == []
    assert client.list_memories("ws-b") == []
    in_a = client.list_memories("ws-a")
    assert len(in_a) == 8 and {m.workspace_id for m in in_a} == {"ws-a"}

    assert client.copy_workspace("ws-a", "ws-b") == {"copied": 8}
    assert {m.memory_id for m in client.list_memories("ws-b")} == {m.memory_id for m in in_a}
    sort_ids = [m.memory_id for m in client.list_memories("ws-b") if m.metadata["task_id"] == "sort"]
    assert client.delete_ids("ws-b", sort_ids) == {"deleted": 3}
    top = client.retrieve("ws-b", "How do I put numbers in increasing order?", top_k=1)
    assert top.metadata.memory_list[0].metadata["task_id"] != "sort"  # gone from ws-b ...
    assert client.retrieve("ws-a", "How do I put numbers in increasing order?", 1).metadata.memory_list[0] \
        .metadata["task_id"] == "sort"  # ... but not from ws-a
    assert client.delete_workspace("ws-b") == {"deleted": 5}
    assert client.workspaces().get("ws-b") is None and client.workspaces()["ws-a"] == 8
    client.close()


def test_restart_keeps_data_even_after_a_kill(service: Service, scripted, tmp_path: Path):
    """Summarised and imported memories, several workspaces; SIGKILL; the same service command again."""
    summarise_all(service, scripted, "before-restart")
    seed = tmp_path / "seed.jsonl"
    seed.write_text("".join(json.dumps({"when_to_use": EXPERIENCE[key][0], "content": EXPERIENCE[key][1],
                                        "metadata": {"task_id": key[0]}}) + "\n" for key in EXPERIENCE))
    client = service.client()
    assert client.import_jsonl("seeded", seed) == len(EXPERIENCE)
    before = {ws: [m.model_dump() for m in client.list_memories(ws)] for ws in client.workspaces()}
    client.close()
    # a second process may not open the folder while the service holds it (its index would go stale)
    with pytest.raises(StoreMismatch, match="in use by another memory service"):
        open_store(StoreSettings(), service.data_dir, "sentence_transformers:all-MiniLM-L6-v2:384", 384)

    service.kill()
    service.start()
    client = service.client()
    after = {ws: [m.model_dump() for m in client.list_memories(ws)] for ws in client.workspaces()}
    assert after == before and len(after["before-restart"]) == 8
    top = client.retrieve("seeded", "Purchase the cheapest airline ticket to Lisbon", top_k=1)
    assert top.metadata.memory_list[0].metadata["task_id"] == "flight"
    client.close()


def _episode_with(**changes: Any) -> dict[str, Any]:
    return {**episode("sort", 1.0), **changes}


BAD_INPUT = [
    ("/summary_task_memory", {"trajectories": [episode("sort", 1.0)]}, 422, "workspace_id"),
    ("/summary_task_memory", {"workspace_id": "w", "trajectories": []}, 422, "trajectories"),
    ("/summary_task_memory", {"workspace_id": "w", "trajectories": [_episode_with(score="high")]}, 422,
     "trajectories.0.score"),
    ("/summary_task_memory", {"workspace_id": "w", "trajectories": [_episode_with(messages=[])]}, 422,
     "trajectories.0.messages"),
    ("/summary_task_memory", {"workspace_id": "w", "trajectories": [
        _episode_with(messages=[{"role": "robot", "content": "x"}])]}, 422, "trajectories.0.messages.0.role"),
    ("/summary_task_memory", {"workspace_id": "../etc", "trajectories": [episode("sort", 1.0)]}, 422,
     "workspace_id"),
    ("/retrieve_task_memory", {"workspace_id": "w", "query": "x", "top_k": 0}, 422, "top_k"),
    ("/retrieve_task_memory", {"workspace_id": "w", "query": "x", "top_k": 51}, 422, "top_k"),
    ("/retrieve_task_memory", {"workspace_id": "w", "query": "  "}, 422, "query"),
    ("/retrieve_task_memory", {"workspace_id": "w", "query": "x", "topk": 3}, 422, "topk"),
    ("/vector_store", {"workspace_id": "w", "action": "explode"}, 422, "action"),
    ("/vector_store", {"workspace_id": "w", "action": "copy"}, 422, "src_workspace_id"),
    ("/vector_store", {"workspace_id": "w", "action": "copy", "src_workspace_id": "never-written"}, 404,
     "src_workspace_id"),
    ("/vector_store", {"workspace_id": "w", "action": "delete_ids"}, 422, "memory_ids"),
    ("/vector_store", {"workspace_id": "w", "action": "dump"}, 400, "path"),
    ("/vector_store", {"workspace_id": "w", "action": "load", "path": "/nonexistent/folder"}, 400, "path"),
]


@pytest.mark.parametrize(("route", "body", "status", "field"), BAD_INPUT,
                         ids=[f"{r.strip('/')}-{f}-{i}" for i, (r, _, _, f) in enumerate(BAD_INPUT)])
def test_bad_input_answers_4xx_naming_the_field(service: Service, route, body, status, field):
    response = service.post(route, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field and field.split(".")[-1] in error["message"], error
    assert response.json()["success"] is False


def test_body_that_is_not_json_answers_400(service: Service):
    response = httpx.post(f"{service.url}/retrieve_task_memory", content=b"{not json",
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["field"] == "body"


def test_llm_that_rejects_the_request_fails_the_summary_with_502_and_stores_nothing(service: Service, scripted):
    scripted.respond_with(lambda body: Reply.error(400, "model does not exist"))
    response = service.post("/summary_task_memory", {"workspace_id": "llm-down", "trajectories": [episode("sort", 1)]})
    assert response.status_code == 502 and response.json()["error"]["code"] == "llm_failed"
    assert "model does not exist" in response.json()["error"]["message"]
    assert service.client().list_memories("llm-down") == []


def test_unparsable_llm_replies_are_counted_not_fatal(service: Service, scripted):
    scripted.respond_with(lambda body: "I think the agent did well overall.")
    body = service.post("/summary_task_memory", {"workspace_id": "chatty", "trajectories": [episode("sort", 1)]}).json()
    assert body["success"] is True and body["metadata"]["stats"]["unparsable_replies"] == 1
    assert body["metadata"]["memory_list"] == []


def test_near_duplicates_are_not_stored_twice(service: Service, scripted):
    summarise_all(service, scripted, "dedup")
    again = summarise_all(service, scripted, "dedup")
    assert again["metadata"]["stats"]["stored"] == 0 and again["metadata"]["stats"]["duplicates"] == 8
    assert len(service.client().list_memories("dedup")) == 8


def test_llm_rerank_and_rewrite_on_request(service: Service, scripted):
    summarise_all(service, scripted, "rerank")
    scripted.reset()
    scripted.plan("[3, 1]", "Run sorted() on the list; never order numbers by hand.")
    body = service.post("/retrieve_task_memory", {"workspace_id": "rerank", "query": TASKS["sort"], "top_k": 2,
                                                  "enable_llm_rerank": True, "enable_llm_rewrite": True}).json()
    recall_prompt = scripted.bodies[0]["messages"][1]["content"]
    assert _kind(scripted.bodies[0]["messages"][0]["content"]) == "rerank"
    assert len(re.findall(r"^\d+\. applies when:", recall_prompt, re.M)) == 6  # top_k 2 x recall_multiplier 3
    meta = body["metadata"]
    assert meta["reranked"] and meta["rewritten"] and len(meta["memory_list"]) == 2
    candidates = re.findall(r"^\d+\. applies when: (.*?) \|", recall_prompt, re.M)
    assert [m["when_to_use"] for m in meta["memory_list"]] == [candidates[2], candidates[0]]
    assert body["answer"] == "Run sorted() on the list; never order numbers by hand."

    scripted.plan("no idea")
    fallback = service.post("/retrieve_task_memory", {"workspace_id": "rerank", "query": TASKS["sort"], "top_k": 2,
                                                      "enable_llm_rerank": True}).json()["metadata"]
    assert not fallback["reranked"] and "vector order kept" in fallback["notes"][0]


def test_dump_and_load_move_a_workspace(service: Service, scripted, tmp_path: Path):
    summarise_all(service, scripted, "src")
    client = service.client()
    dumped = client.dump("src", tmp_path)
    lines = (tmp_path / "src.jsonl").read_text().splitlines()
    assert dumped == {"size": 8, "path": str(tmp_path / "src.jsonl")} and len(lines) == 8
    assert set(json.loads(lines[0])) >= {"workspace_id", "memory_id", "memory_type", "when_to_use", "content",
                                         "score", "time_created", "time_modified", "author", "metadata"}
    (tmp_path / "dst.jsonl").write_text("\n".join(lines) + "\n")
    assert client.load("dst", tmp_path)["size"] == 8
    assert client.load("dst", tmp_path)["size"] == 8  # upsert by memory id: loading twice changes nothing
    src = {m.memory_id: (m.when_to_use, m.content) for m in client.list_memories("src")}
    dst = {m.memory_id: (m.when_to_use, m.content) for m in client.list_memories("dst")}
    assert src == dst
    client.close()


def test_jsonl_export_and_import_over_http(service: Service, scripted, tmp_path: Path):
    summarise_all(service, scripted, "exp")
    client = service.client()
    assert client.export_jsonl("exp", tmp_path / "exp.jsonl") == 8
    assert client.import_jsonl("imported", tmp_path / "exp.jsonl") == 8
    top = client.retrieve("imported", "Book me a flight", top_k=1).metadata.memory_list[0]
    assert top.metadata["task_id"] == "flight" and top.workspace_id == "imported"

    library = tmp_path / "library.jsonl"
    library.write_text('{"content": "Read the error message before retrying a failed tool call."}\n{"when_to_use": "x"}\n')
    with pytest.raises(MemoryClientError) as err:
        client.import_jsonl("library", library)
    assert err.value.status == 400 and err.value.field == "body"
    assert "line 2" in str(err.value) and "'content'" in str(err.value)
    assert client.list_memories("library") == []  # all of the file or nothing
    library.write_text('{"content": "Read the error message before retrying a failed tool call."}\n')
    assert client.import_jsonl("library", library) == 1
    only = client.list_memories("library")[0]
    assert only.when_to_use == only.content and only.author == "import"
    client.close()


async def test_async_client_summarises_and_retrieves(service: Service, scripted):
    scripted.respond_with(summariser)
    client = service.client()
    try:
        result = await client.asummary("async", [episode("email", 1.0), episode("email", 0.0)])
        assert result.metadata.stats.stored == 2  # success + comparison; the BADIDEA failure lesson rejected
        found = await client.aretrieve("async", "send a file by email", top_k=1)
        assert found.metadata.memory_list[0].metadata["task_id"] == "email"
    finally:
        await client.aclose()


# ---------------------------------------------------------------------------------------------------------
# An OpenAI-compatible embeddings endpoint instead of the local model
# ---------------------------------------------------------------------------------------------------------


def _bag_of_words(text: str, dim: int = 64) -> list[float]:
    vector = np.zeros(dim)
    for word in re.findall(r"[a-z]+", text.lower()):
        vector[sum(map(ord, word)) % dim] += 1.0
    return vector.tolist()


@contextlib.contextmanager
def embeddings_server() -> Iterator[str]:
    """A small OpenAI-compatible /v1/embeddings (bag-of-words vectors): the edge double for a remote embedder."""
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(body: dict[str, Any]) -> dict[str, Any]:
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        return {"object": "list", "model": body["model"], "usage": {"prompt_tokens": 0, "total_tokens": 0},
                "data": [{"object": "embedding", "index": i, "embedding": _bag_of_words(t)} for i, t in enumerate(texts)]}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_service_with_an_openai_compatible_embeddings_endpoint_and_no_llm(tmp_path: Path):
    with embeddings_server() as base_url, memory_service(
            tmp_path / "data", tmp_path / "service.log", "--embedding-backend", "openai",
            "--embedding-base-url", base_url, "--embedding-model", "bow-64") as running:
        client = running.client()
        no_llm = running.post("/summary_task_memory", {"workspace_id": "w", "trajectories": [episode("sort", 1.0)]})
        assert no_llm.status_code == 503 and no_llm.json()["error"]["code"] == "llm_not_configured"
        assert "--llm-base-url" in no_llm.json()["error"]["message"]
        info = httpx.get(f"{running.url}/info").json()["metadata"]
        assert (info["embedder"], info["dim"]) == ("openai:bow-64:64", 64)
        library = tmp_path / "lib.jsonl"
        library.write_text("".join(json.dumps({"when_to_use": w, "content": c}) + "\n" for w, c in EXPERIENCE.values()))
        assert client.import_jsonl("remote", library) == len(EXPERIENCE)
        top = client.retrieve("remote", "booking airline tickets between cities", top_k=1).metadata.memory_list[0]
        assert top.when_to_use == "Booking airline tickets between two cities"
        client.close()
    # the folder remembers its embedder: the local model may not open it
    with pytest.raises(StoreMismatch, match="openai:bow-64:64"):
        open_store(StoreSettings(), tmp_path / "data", "sentence_transformers:all-MiniLM-L6-v2:384", 384)


# ---------------------------------------------------------------------------------------------------------
# Units: store, prompt parsing, settings
# ---------------------------------------------------------------------------------------------------------


def _unit(rng: np.random.Generator, n: int, dim: int = 16) -> np.ndarray:
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_faiss_store_matches_brute_force_and_survives_reopen(tmp_path: Path):
    rng = np.random.default_rng(0)
    vectors = _unit(rng, 300)
    memories = [TaskMemory(when_to_use=f"w{i}", content=f"c{i}") for i in range(300)]
    store = open_store(StoreSettings(), tmp_path, "unit", 16)
    store.upsert("a", memories[:200], vectors[:200])
    _ = store.search("a", vectors[0], 1)  # index now cached: later writes must keep it in step
    store.upsert("a", memories[200:], vectors[200:])
    replaced = memories[5].model_copy(update={"content": "replaced"})
    store.upsert("a", [replaced], vectors[7:8])
    store.delete_ids("a", [memories[9].memory_id])
    store.close()

    store = open_store(StoreSettings(), tmp_path, "unit", 16)
    expected = vectors.copy()
    expected[5] = vectors[7]
    alive = [i for i in range(300) if i != 9]
    for q in _unit(rng, 20):
        scores = expected[alive] @ q
        want = [alive[i] for i in np.argsort(-scores)[:5]]
        got = store.search("a", q, 5)
        assert [h.memory.content for h in got] == [("replaced" if i == 5 else f"c{i}") for i in want]
        assert [h.similarity for h in got] == pytest.approx(sorted(scores, reverse=True)[:5], abs=1e-5)
    assert store.count("a") == 299 and store.search("nothing-here", vectors[0], 3) == []
    store.close()
    with pytest.raises(StoreMismatch, match="configured with 'other'"):
        open_store(StoreSettings(), tmp_path, "other", 16)


def test_find_json_reads_what_small_models_write():
    assert prompts.find_json('```json\n[{"a": 1}]\n```') == [{"a": 1}]
    assert prompts.find_json('<think>maybe [1]</think> Sure: {"score": 0.7} thanks') == {"score": 0.7}
    assert prompts.find_json("no json [here") is None
    assert prompts.parse_validation('{"score": 7, "reason": "x"}') == (1.0, "x")
    assert prompts.parse_validation('{"score": "high"}') is None
    assert prompts.parse_ranking("[2, 2, 9, 1, true]", 3) == [1, 0]
    found = prompts.parse_experiences('{"experiences": [{"condition": "c", "advice": "a"}, {"when_to_use": "w"}]}', 3)
    assert found == [prompts.Candidate("c", "a")]


def test_render_trajectory_keeps_the_task_and_the_ending():
    from agentevolver.schema.message import ChatMessage

    messages = [ChatMessage(role="system", content="S" * 5000), ChatMessage(role="user", content="THE TASK")]
    messages += [ChatMessage(role="assistant", content=f"step {i} " + "x" * 300) for i in range(50)]
    messages.append(ChatMessage(role="assistant", content="FINAL ANSWER 42"))
    text = prompts.render_trajectory(messages, max_chars=3000, max_message_chars=1000)
    assert len(text) <= 3000 and "THE TASK" in text and "FINAL ANSWER 42" in text
    assert "messages omitted" in text and "characters cut" in text


def test_settings_errors_name_the_key(tmp_path: Path):
    config = tmp_path / "memory.yaml"
    config.write_text("summary:\n  validation_treshold: 0.4\n")
    with pytest.raises(ConfigError, match=r"summary\.validation_treshold: unknown key"):
        load_settings(config)
    with pytest.raises(ConfigError, match=r"embedding\.base_url is required"):
        load_settings(None, {"embedding.backend": "openai", "embedding.model": "m"})
    with pytest.raises(ConfigError, match=r"retrieve\.enable_llm_rerank"):
        load_settings(None, {"retrieve.enable_llm_rerank": True})
    config.write_text("llm:\n  endpoints:\n    e: {base_url: 'http://h:1/v1', model: m}\n  roles: {judge: e}\n")
    with pytest.raises(ConfigError, match=r"summarizer_role = 'exp_summarizer' is not in llm\.roles"):
        load_settings(config)
    settings = load_settings(config, llm_endpoint={"base_url": "http://h:2/v1", "model": "x"})
    assert settings.llm is not None and settings.llm.endpoint_for("exp_summarizer")[1].model == "x"
    assert EmbeddingSettings().model == "all-MiniLM-L6-v2"
    assert os.fspath(load_settings(None, {"data_dir": "~/m"}).data_dir).startswith(os.path.expanduser("~"))
