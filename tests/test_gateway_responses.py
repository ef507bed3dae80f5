"""The agent gateway's Responses API (``POST /episodes/<id>/v1/responses``), with the real ``openai`` SDK's
``client.responses`` in the programs, the gateway served by uvicorn, and the calc environment service started
by its real command. The policy is the edge (the scripted policy of tests/test_agent_gateway.py), so each test
chooses what the model says; the recording of calls as tokens is the product's, shared with chat completions.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from test_agent_gateway import (  # the gateway tests' fixtures and scripted policy
    CALL,
    SAMPLING,
    ScriptedPolicy,
    check_invariants,
    env,  # noqa: F401  (fixture)
    episodes,
    service,  # noqa: F401  (fixture)
    spec,
    tokenizer,
)

from agentevolver.client.env_client import EnvClient

THIS = __name__
TOOLS = [{"type": "function", "name": "calculator", "description": "evaluate arithmetic",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}]
SEEN: dict[str, Any] = {}


def _calc_answer(call: Any) -> str:
    return "42" if json.loads(call.arguments)["expression"] == "6 * 7" else "?"


# ----------------------------------------------------------------------------------------- programs
def chained_by_previous_response_id(task: Any) -> float:
    """A function call, then its output sent with previous_response_id: the SDK's stored-state style."""
    from openai import OpenAI

    client = OpenAI(base_url=task.base_url, api_key=task.api_key)
    first = client.responses.create(model="gpt-5-mini", instructions="use the calculator", input=task.query,
                                    tools=TOOLS)
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(model="gpt-5-mini", instructions="use the calculator", tools=TOOLS,
                                     previous_response_id=first.id,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": _calc_answer(call)}])
    SEEN[task.episode_id] = [first, second]
    return 1.0 if "42" in second.output_text else 0.0


def chained_by_echoing_the_output(task: Any) -> float:
    """The same two calls with no stored state: the program sends the whole input again, the first reply's
    output items included (what the Agents SDK does when it manages the conversation itself)."""
    from openai import OpenAI

    client = OpenAI(base_url=task.base_url, api_key=task.api_key)
    items: list[Any] = [{"role": "user", "content": [{"type": "input_text", "text": task.query}]}]
    first = client.responses.create(model="m", input=items, tools=TOOLS, store=False)
    call = next(item for item in first.output if item.type == "function_call")
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": _calc_answer(call)})
    second = client.responses.create(model="m", input=items, tools=TOOLS, store=False)
    return 1.0 if "42" in second.output_text else 0.0


def streamed(task: Any) -> float:
    """A streamed call, read with the SDK's event types."""
    from openai import OpenAI

    client = OpenAI(base_url=task.base_url, api_key=task.api_key)
    events = list(client.responses.create(model="m", input=task.query, tools=TOOLS, stream=True))
    SEEN[task.episode_id] = events
    return 1.0


# ----------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("program", ["chained_by_previous_response_id", "chained_by_echoing_the_output"])
async def test_a_responses_call_that_continues_the_last_one_is_the_same_sample_token_for_token(
        env: EnvClient, program: str) -> None:  # noqa: F811
    policy = ScriptedPolicy([CALL % "6 * 7", "FINAL ANSWER: 42"])
    result = await episodes(env, policy, callable=f"{THIS}:{program}").run(spec(), SAMPLING)
    assert (result.termination, result.failure, result.reward.outcome) == ("finished", None, 1.0), result.error
    assert len(result.samples) == 1 and result.num_turns == 2
    check_invariants(result)
    first, second = policy.calls
    sample = result.final_sample
    # the second prompt is the first + the ids generated for it + the tool output's turn: nothing re-tokenised
    assert sample.prompt_ids == first["prompt_ids"]
    assert sample.prompt_ids + sample.response_ids[: len(second["prompt_ids"]) - len(sample.prompt_ids)] == (
        second["prompt_ids"])
    tool_turn = tokenizer().decode(second["prompt_ids"][len(first["prompt_ids"]):])
    assert "42" in tool_turn
    if program == "chained_by_previous_response_id":
        replies = next(v for v in SEEN.values() if isinstance(v, list) and len(v) == 2 and hasattr(v[0], "output"))
        assert replies[0].output[0].type == "function_call" and replies[0].output[0].name == "calculator"
        assert replies[1].previous_response_id == replies[0].id and replies[1].model == "gpt-5-mini"
        assert replies[1].status == "completed" and replies[1].usage.output_tokens > 0
        assert "use the calculator" in tokenizer().decode(first["prompt_ids"])  # instructions: the system turn


async def test_streamed_responses_are_the_sdks_events_in_order(env: EnvClient) -> None:  # noqa: F811
    policy = ScriptedPolicy([CALL % "1 + 1"])
    result = await episodes(env, policy, callable=f"{THIS}:streamed").run(spec(), SAMPLING)
    assert result.failure is None, result.error
    events = next(v for v in SEEN.values() if isinstance(v, list) and v and hasattr(v[0], "sequence_number"))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "response.function_call_arguments.done" in kinds
    done = next(event for event in events if event.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"expression": "1 + 1"}
    assert events[-1].response.output[0].type == "function_call"


async def test_responses_refusals_name_the_field_in_openais_error_shape(env: EnvClient) -> None:  # noqa: F811
    source = episodes(env, ScriptedPolicy(["a", "b", "c"]), callable=f"{THIS}:chained_by_echoing_the_output")
    url = await source.ensure_started()
    source.gateway.open("ep1", request_id="r", sampling_params=SAMPLING)
    base = f"{url}/episodes/ep1/v1/responses"
    good = {"model": "m", "input": "hi"}
    cases = [
        ({**good, "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, 400, "text.format"),
        ({**good, "background": True}, 400, "background"),
        ({**good, "conversation": "conv_1"}, 400, "conversation"),
        ({**good, "max_output_token": 5}, 400, "max_output_token"),
        ({**good, "tools": [{"type": "web_search"}]}, 400, "tools.0"),
        ({"model": "m", "input": [{"type": "reasoning", "summary": []}]}, 400, "input[0].type"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
         "input[0].content[0].type"),
        ({**good, "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
    ]
    async with httpx.AsyncClient() as client:
        for body, status, param in cases:
            answer = await client.post(base, json=body)
            assert answer.status_code == status, (param, answer.text)
            error = answer.json()["error"]
            assert error["param"] == param and error["message"], (param, error)
        # accepted: the run samples (temperature ignored), include/metadata/reasoning change nothing here
        ok = await client.post(base, json={**good, "temperature": 0, "include": ["reasoning.encrypted_content"],
                                           "metadata": {"k": "v"}, "reasoning": {"effort": "low"}})
        assert ok.status_code == 200 and ok.json()["output"][0]["content"][0]["text"] == "a"
        # a stored response continues; one sent with store false does not
        first = ok.json()["id"]
        chained = await client.post(base, json={"model": "m", "input": "and?", "previous_response_id": first})
        assert chained.status_code == 200 and chained.json()["previous_response_id"] == first
        unstored = await client.post(base, json={**good, "store": False})
        missing = await client.post(base, json={"model": "m", "input": "x",
                                                "previous_response_id": unstored.json()["id"]})
        assert missing.status_code == 404
        # a reply cut by max_output_tokens is incomplete, as OpenAI reports it
        source.gateway.open("ep2", request_id="r2", sampling_params=SAMPLING)
        cut = await client.post(f"{url}/episodes/ep2/v1/responses", json={**good, "max_output_tokens": 1})
        assert cut.json()["status"] == "incomplete"
        assert cut.json()["incomplete_details"] == {"reason": "max_output_tokens"}
        await source.gateway.close("ep1")
        finished = await client.post(base, json=good)
        assert finished.status_code == 409 and finished.json()["error"]["code"] == "episode_finished"
    await source.server.stop()
