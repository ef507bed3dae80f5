"""An agent written with nothing but the OpenAI SDK: a tool-use loop over local Python functions.

AgentEvolver trains it unchanged (examples/agent_program.yaml, docs/agent_gateway.md): each episode calls
``run(task)`` with an endpoint of its own, the policy answers there, and every call's tokens are recorded.
It returns its final answer; the task's environment (calc) scores it (``agent_program.reward: env``).
"""

import ast
import json
import operator

from openai import OpenAI

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.USub: operator.neg}
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression such as '12 * (3 + 4)'.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


def calculator(expression: str) -> str:
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp | ast.UnaryOp) and type(node.op) in OPERATORS:
            args = [value(node.left), value(node.right)] if isinstance(node, ast.BinOp) else [value(node.operand)]
            return OPERATORS[type(node.op)](*args)
        raise ValueError("only numbers and + - * / are allowed")
    try:
        return str(round(value(ast.parse(expression, mode="eval").body), 6))
    except (SyntaxError, ValueError, ZeroDivisionError) as err:
        return f"error: {err}"


def run(task) -> str:
    client = OpenAI(base_url=task.base_url, api_key=task.api_key)
    messages = list(task.messages)  # the environment's opening: instructions, demonstrations, the question
    for _ in range(4):
        reply = client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return reply.content or ""
        for call in reply.tool_calls:
            arguments = json.loads(call.function.arguments or "{}")
            result = calculator(str(arguments.get("expression", ""))) if isinstance(arguments, dict) else "error"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""
