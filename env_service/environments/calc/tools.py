"""The tools of the ``calc`` environment: schemas, execution, and reading tool calls written as text.

Tool errors never raise: a bad expression, an unknown tool or wrong argument names come back as a tool
result that says what to fix, because the model can only learn from what it sees in its context, and an
exception would end the episode (and the training signal) instead.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from env_service.actions import read_text_tool_calls
from env_service.environments.calc.calculator import CalcError, evaluate_expression, format_number
from env_service.environments.calc.units import UnitError, convert

CALCULATOR = "calculator"
CONVERT_UNITS = "convert_units"

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": CALCULATOR,
            "description": "Evaluate an arithmetic expression with numbers, + - * / ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "The expression, e.g. \"12 * (3 + 4)\"."},
                },
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": CONVERT_UNITS,
            "description": "Convert a value between units of length, mass, time, volume or temperature.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number", "description": "The amount to convert."},
                    "from_unit": {"type": "string", "description": "The unit of the value, e.g. \"km\"."},
                    "to_unit": {"type": "string", "description": "The unit wanted, e.g. \"m\"."},
                },
                "required": ["value", "from_unit", "to_unit"],
            },
        },
    },
]

_ARGUMENTS: dict[str, tuple[str, ...]] = {CALCULATOR: ("expression",), CONVERT_UNITS: ("value", "from_unit", "to_unit")}
_USAGE: dict[str, str] = {
    CALCULATOR: 'calculator takes one argument, "expression", a string such as "12 * 31"',
    CONVERT_UNITS: 'convert_units takes "value" (a number), "from_unit" and "to_unit" (unit names such as '
                   '"km" and "m")',
}


def tool_schemas() -> list[dict[str, Any]]:
    """A copy of the tool schemas (OpenAI function format), safe for callers to mutate."""
    return copy.deepcopy(TOOL_SCHEMAS)


@dataclass(frozen=True)
class ToolResult:
    """What a call produced: the text the model sees, and the number if the call succeeded."""

    text: str
    value: float | None = None

    @property
    def ok(self) -> bool:
        """Whether the call produced a number (errors have none)."""
        return self.value is not None


def _error(message: str) -> ToolResult:
    return ToolResult(f"Error: {message}")


def _check_argument_names(name: str, arguments: dict[str, Any]) -> str | None:
    expected = _ARGUMENTS[name]
    missing = [key for key in expected if key not in arguments]
    unknown = [key for key in arguments if key not in expected]
    if not missing and not unknown:
        return None
    got = ", ".join(f'"{key}"' for key in arguments) or "no arguments"
    return f"{_USAGE[name]}; got {got}."


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.replace(",", "").strip())
        except ValueError:
            return None
    return None


def run_tool(name: str, arguments: dict[str, Any] | str) -> ToolResult:
    """Execute one tool call; ``arguments`` is a dict or the raw JSON string of one. Never raises."""
    if name not in _ARGUMENTS:
        return _error(f"unknown tool {name!r}; the tools are {CALCULATOR} and {CONVERT_UNITS}.")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return _error(f"the arguments are not valid JSON; {_USAGE[name]}.")
    if not isinstance(arguments, dict):
        return _error(f"the arguments must be a JSON object; {_USAGE[name]}.")
    problem = _check_argument_names(name, arguments)
    if problem is not None:
        return _error(problem)
    try:
        if name == CALCULATOR:
            expression = arguments["expression"]
            if isinstance(expression, int | float) and not isinstance(expression, bool):
                expression = str(expression)
            value = evaluate_expression(expression)
        else:
            amount = _as_number(arguments["value"])
            if amount is None:
                return _error(f'"value" must be a number, got {arguments["value"]!r}.')
            value = round(convert(amount, arguments["from_unit"], arguments["to_unit"]), 6)
    except (CalcError, UnitError) as err:
        return _error(f"{err}.")
    return ToolResult(format_number(value), float(value))


# ------------------------------------------------------------------------------ text-form tool calls
@dataclass(frozen=True)
class TextToolCall:
    """A tool call read from message text: name and arguments (a dict, or the raw value if not one)."""

    name: str
    arguments: Any


def parse_text_tool_calls(content: str) -> tuple[list[TextToolCall], list[str]]:
    """Read ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks from text.

    The reading is the environments' shared one (:func:`env_service.actions.read_text_tool_calls`: lenient
    about a missing closing tag and text after the JSON); this only presents its calls as name + arguments.
    Returns the calls read and one problem description per block that could not be read.
    """
    read = read_text_tool_calls(content)
    calls = []
    for call in read.calls:
        try:
            arguments: Any = call.function.arguments_dict()
        except ValueError:
            arguments = call.function.arguments
        calls.append(TextToolCall(call.function.name, arguments))
    return calls, read.problems
