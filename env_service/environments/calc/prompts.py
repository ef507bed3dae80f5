"""The fixed text of a ``calc`` episode: system prompt, in-context demonstrations, and the nudge.

SmolLM2-135M does not call tools zero-shot (0/16 samples with the format only in the system prompt), but
copies the format from worked examples placed in the conversation, and more examples help: with the tool
schemas listed, 1/32 first calls were correct with two examples and 24/32 with four. So every episode
opens with demonstrations as real prior turns - user question, assistant tool call, tool result,
assistant ``FINAL ANSWER`` - which is also exactly the behaviour being rewarded. Their problems are fixed
and are not tasks of any split.
"""

from __future__ import annotations

import json
from typing import Any

from agentevolver.schema import ChatMessage, ToolCall, ToolFunction

SYSTEM_PROMPT = (
    "You are a math assistant. Solve every question with a tool: call calculator with the arithmetic "
    "expression, or convert_units for a unit conversion, like this:\n"
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 31"}}\n</tool_call>\n'
    "After you see the result, reply with FINAL ANSWER: <number>."
)

NUDGE = (
    "Use the calculator tool to compute the answer, or, if you already have the result, reply with "
    "FINAL ANSWER: <number>."
)

#: The reply to a final answer on an exploration seed with ``params.explore_past_answers``: a seed has no
#: answer, so the agent is sent back to the tools (new inputs: a new call is a new task to write).
EXPLORE_ON = (
    "Noted. There is no single answer to find here: keep exploring. Call a tool again with different "
    "numbers or units than before."
)

# (question, tool name, arguments, tool result, final reply), in conversation order;
# ``demonstrations(count)`` keeps the first ``count``. Chosen by measurement (docs/env_calc.md): every demo
# uses the calculator, including the unit conversion, because a convert_units demo close to the question
# made the model mix the two argument formats (correct first calls on one-operation questions fell from
# 6-8/12 to 0-1/12); word problems are interleaved with bare expressions; the bare division last keeps
# one-operation questions high. The convert_units tool stays listed (and works) for conversions without a
# well-known factor.
_DEMOS: tuple[tuple[str, str, dict[str, Any], str, str], ...] = (
    ("What is 12 * 31?", "calculator", {"expression": "12 * 31"}, "372", "FINAL ANSWER: 372"),
    ("A box holds 15 eggs. How many eggs are in 6 boxes?", "calculator", {"expression": "15 * 6"}, "90",
     "FINAL ANSWER: 90"),
    ("Compute 84 - 47.", "calculator", {"expression": "84 - 47"}, "37", "FINAL ANSWER: 37"),
    ("Sara had 52 pencils and gave 17 of them away. How many pencils does she have left?", "calculator",
     {"expression": "52 - 17"}, "35", "FINAL ANSWER: 35"),
    ("Add 14 and 9, then multiply the result by 3.", "calculator", {"expression": "(14 + 9) * 3"}, "69",
     "FINAL ANSWER: 69"),
    ("A cyclist rides 24 kilometers every day. How many kilometers does she ride in 12 days?", "calculator",
     {"expression": "24 * 12"}, "288", "FINAL ANSWER: 288"),
    ("How many minutes are in 3 hours?", "calculator", {"expression": "3 * 60"}, "180", "FINAL ANSWER: 180"),
    ("What is 144 / 8?", "calculator", {"expression": "144 / 8"}, "18", "FINAL ANSWER: 18"),
)
MAX_DEMOS = len(_DEMOS)
DEFAULT_DEMOS = MAX_DEMOS


def demonstrations(count: int = DEFAULT_DEMOS) -> list[ChatMessage]:
    """The first ``count`` worked examples as conversation turns (4 messages each)."""
    messages: list[ChatMessage] = []
    for index, (question, tool, arguments, result, final) in enumerate(_DEMOS[:count]):
        call_id = f"demo_{index + 1}"
        call = ToolCall(id=call_id, function=ToolFunction(name=tool, arguments=json.dumps(arguments)))
        messages += [
            ChatMessage(role="user", content=question),
            ChatMessage(role="assistant", content="", tool_calls=[call]),
            ChatMessage(role="tool", content=result, tool_call_id=call_id, name=tool),
            ChatMessage(role="assistant", content=final),
        ]
    return messages
