"""An agent written with LangGraph: its prebuilt ReAct graph over ``langchain-openai``'s ``ChatOpenAI``.

AgentEvolver trains it unchanged (docs/agent_gateway.md): each episode calls ``run(task)`` with an endpoint of
its own (``task.base_url``), the policy answers there through Chat Completions, and every call's tokens are
recorded. It returns the graph's last message, which the task's environment scores
(``agent_program.reward: env``). A run past the graph's recursion limit (the model kept calling tools) is a
wrong answer, not a crash.
"""

import sys
from pathlib import Path

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calc_agent import calculator as evaluate  # the same local calculator as the OpenAI-SDK agent


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '12 * (3 + 4)'."""
    return evaluate(expression)


def run(task) -> str:
    model = ChatOpenAI(model=task.model, base_url=task.base_url, api_key=task.api_key, max_retries=0)
    graph = create_react_agent(model, [calculator])
    try:
        # the environment's opening as it is: instructions, demonstrations (with their tool calls), the question
        state = graph.invoke({"messages": list(task.messages)}, {"recursion_limit": 8})
    except GraphRecursionError:
        return ""
    return str(state["messages"][-1].content or "")
