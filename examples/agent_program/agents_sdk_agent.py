"""An agent written with the OpenAI Agents SDK, with its defaults: the Responses API and the SDK's default client.

Run as a command program (``agent_program.command``; docs/agent_gateway.md): the gateway gives each episode's
process ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``, which the SDK's default client reads, so nothing here points
at the gateway. The task arrives as JSON in ``AGENTEVOLVER_TASK``; the answer goes out as the last line
(``{"answer": ...}``), which the task's environment scores (``agent_program.reward: env``).

Two choices a user of a small policy makes, not the SDK's defaults: tracing is off (it would export every run
to OpenAI's servers), and a reply the model did not finish (``status: incomplete`` when it hit its token
limit) or a run past ``max_turns`` is a wrong answer, not a crash: the SDK raises ``ModelBehaviorError`` /
``MaxTurnsExceeded`` there, and this program answers "" so the episode is scored 0 and trained on.
"""

import json
import os
import sys
from pathlib import Path

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calc_agent import calculator as evaluate  # the same local calculator as the OpenAI-SDK agent


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '12 * (3 + 4)'."""
    return evaluate(expression)


def as_input_items(messages: list[dict]) -> list[dict]:
    """The environment's opening (chat messages: demonstrations with tool calls) as Responses input items."""
    items: list[dict] = []
    for message in messages:
        if message["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": message.get("content") or ""})
            continue
        if message.get("content"):
            items.append({"role": message["role"], "content": message["content"]})
        for call in message.get("tool_calls") or ():
            items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                          "arguments": call["function"]["arguments"]})
    return items


def main() -> None:
    task = json.loads(os.environ["AGENTEVOLVER_TASK"])
    set_tracing_disabled(True)
    opening = task["messages"]
    instructions = "\n".join(m["content"] for m in opening if m["role"] == "system")
    agent = Agent(name="calc", instructions=instructions, tools=[calculator], model=task["model"])
    try:
        result = Runner.run_sync(agent, as_input_items([m for m in opening if m["role"] != "system"]), max_turns=4)
        answer = str(result.final_output or "")
    except (ModelBehaviorError, MaxTurnsExceeded):
        answer = ""
    print(json.dumps({"answer": answer}))


if __name__ == "__main__":
    main()
