"""Tool registry and per-episode ToolSet: schemas, selection, validation, timeouts, limits, lifecycle, rewards.

Each test that covers an edge listed in seed 001 (sections 13-16 and the section 20 table) says which one.
No test measures wall-clock time: slow tools sleep far longer (5 s) than the timeout they are given (0.2 s)
and are cancelled or released, so the suite stays fast.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from typing import Annotated, Any, ClassVar, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agentevolver.errors import ConfigError, DuplicateNameError, UnknownNameError
from agentevolver.module.tools import (
    ClassTool,
    ErrorType,
    FunctionTool,
    ToolRegistry,
    ToolResult,
    ToolsConfig,
    ToolSet,
    class_tool,
    default_registry,
    fold_tool_rewards,
    function_tool,
    summarize_tool_metrics,
    truncate_text,
    validate_tool_selection,
)
from agentevolver.module.tools import config as tools_config
from agentevolver.module.tools.docstrings import parse_google_docstring
from agentevolver.schema.message import ToolCall, ToolFunction


def call(name: str, call_id: str = "", /, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id or f"id_{name}", function=ToolFunction(name=name, arguments=arguments))


def raw_call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id="raw", function=ToolFunction(name=name, arguments=arguments))


# ------------------------------------------------------------------------------- schema from signature


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


def convert(value: float, to_unit: Unit, digits: int = 2, tags: list[str] | None = None) -> dict[str, Any]:
    """Convert a temperature to the requested unit.

    Useful for weather questions.

    Args:
        value: The input temperature. It is Celsius when converting to
            Fahrenheit, and Fahrenheit when converting to Celsius.
        to_unit (Unit): The desired output unit.
        digits: Digits after the decimal point.
        tags: Free labels.

    Returns:
        The converted value and its unit.
    """
    result = (
        value * 9 / 5 + 32 if to_unit is Unit.FAHRENHEIT or to_unit == "fahrenheit" else (value - 32) * 5 / 9
    )
    return {"value": round(result, digits), "unit": Unit(to_unit).value, "tags": tags or []}


def test_schema_from_signature_and_google_docstring() -> None:
    tool = FunctionTool.from_callable(convert)
    assert tool.schema() == {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert a temperature to the requested unit.\n\nUseful for weather questions.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {
                        "type": "number",
                        "description": "The input temperature. It is Celsius when converting to Fahrenheit, "
                        "and Fahrenheit when converting to Celsius.",
                    },
                    "to_unit": {
                        "enum": ["celsius", "fahrenheit"],
                        "type": "string",
                        "description": "The desired output unit.",
                    },
                    "digits": {
                        "type": "integer",
                        "description": "Digits after the decimal point.",
                        "default": 2,
                    },
                    "tags": {
                        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                        "description": "Free labels.",
                        "default": None,
                    },
                },
                "required": ["value", "to_unit"],
                "additionalProperties": False,
            },
        },
    }


def test_type_hints_map_to_json_schema() -> None:
    def many(
        a: str,
        b: bool,
        c: int | None,
        d: Literal["x", "y"],
        e: dict[str, float],
        f: tuple[int, str],
        g: tuple[int, ...],
        h: Annotated[int, "meta"],
        i: Any,
        j: set[int],
        k: Literal[1, "one"],
    ) -> None:
        """Many types."""

    props = FunctionTool.from_callable(many).parameters["properties"]
    assert props["a"] == {"type": "string"}
    assert props["b"] == {"type": "boolean"}
    assert props["c"] == {"type": ["integer", "null"]}
    assert props["d"] == {"enum": ["x", "y"], "type": "string"}
    assert props["e"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["f"] == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
        "maxItems": 2,
    }
    assert props["g"] == {"type": "array", "items": {"type": "integer"}}
    assert props["h"] == {"type": "integer"}
    assert props["i"] == {}
    assert props["j"] == {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    assert props["k"] == {"enum": [1, "one"]}


def missing_hint(x, y: int) -> int:  # type: ignore[no-untyped-def]
    """Args:
    x: no hint.
    y: fine.
    """
    return y


def star_args(*values: int) -> int:
    """Sum."""
    return sum(values)


def stray_doc(x: int) -> int:
    """Double.

    Args:
        x: The number.
        y: Not a parameter any more.
    """
    return 2 * x


def odd_type(x: complex) -> str:
    """Complex."""
    return str(x)


@pytest.mark.parametrize(
    ("fn", "fragment"),
    [
        (missing_hint, "parameter 'x': add a type hint"),
        (star_args, "*args, **kwargs"),
        (stray_doc, "documents ['y']"),
        (odd_type, "has no JSON schema"),
    ],
)
def test_schema_problems_fail_at_registration(fn: Any, fragment: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        FunctionTool.from_callable(fn)
    assert fragment in str(err.value)


def test_docstring_parser_forms() -> None:
    summary, args = parse_google_docstring(
        """Summary line.

        Second paragraph.

        Arguments:
            alpha (int): First,
                continued.
            beta: Second.
            **kwargs: Extra.

        Raises:
            ValueError: never documented as an argument.
        """
    )
    assert summary == "Summary line.\n\nSecond paragraph."
    assert args == {"alpha": "First, continued.", "beta": "Second.", "kwargs": "Extra."}
    assert parse_google_docstring(None) == ("", {})


def test_decorator_keeps_the_function_callable_and_allows_overrides() -> None:
    registry = ToolRegistry()

    @function_tool(registry=registry, name="add_numbers", description="Adds.")
    def add(a: int, b: int = 1) -> int:
        """Add two numbers.

        Args:
            a: First.
            b: Second.
        """
        return a + b

    assert isinstance(add, FunctionTool)
    assert add(2, b=3) == 5
    assert registry.names() == ["add_numbers"]
    # The schema's name is the registry name (seed 001 section 12.2: they could disagree).
    assert registry.get("add_numbers").schema()["function"]["name"] == "add_numbers"
    assert registry.get("add_numbers").schema()["function"]["description"] == "Adds."
    assert add.__doc__.startswith("Add two numbers.")


def test_bare_function_tool_decorator_uses_the_default_registry() -> None:
    @function_tool
    def _test_registry_default_echo(text: str) -> str:
        """Echo.

        Args:
            text: What to echo.
        """
        return text

    assert "_test_registry_default_echo" in default_registry()
    try:
        with pytest.raises(DuplicateNameError, match="tool '_test_registry_default_echo' is already registered"):
            function_tool(_test_registry_default_echo.fn)
    finally:
        default_registry().remove("_test_registry_default_echo")


# ------------------------------------------------------------------------------- tools used below


def make_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.function
    def calc(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: Python arithmetic, e.g. "18*7".
        """
        return str(eval(expression, {"__builtins__": {}}))

    @registry.function
    async def search(query: str, limit: int = 3) -> list[str]:
        """Search the corpus.

        Args:
            query: Words to look for.
            limit: At most this many hits.
        """
        return [f"{query} #{i}" for i in range(limit)]

    @registry.function
    def mean(values: list[float]) -> float:
        """Mean of numbers.

        Args:
            values: The numbers.
        """
        return sum(values) / len(values)

    return registry


# -------------------------------------------------------------------------------------- duplicates


def test_duplicate_tool_names_are_rejected_at_registration() -> None:
    """Seed 001 section 4: duplicate names inside one catalogue were silently overwritten."""
    registry = make_registry()

    def calc(expression: str) -> str:
        """Another calc."""
        return expression

    with pytest.raises(DuplicateNameError) as err:
        registry.add(calc)
    message = str(err.value)
    assert "tool 'calc' is already registered by " in message and "make_registry.<locals>.calc" in message
    assert "test_duplicate_tool_names_are_rejected_at_registration.<locals>.calc" in message
    entry = registry.get("calc")
    assert registry.add(entry) is entry  # the same entry again is a no-op
    with pytest.raises(UnknownNameError, match=r"^unknown tool 'calk'; registered: calc, mean, search$"):
        registry.get("calk")

    class Calc(ClassTool):
        name = "calc"

        async def execute(self, episode_id: str, arguments: dict[str, Any]) -> str:
            return ""

    with pytest.raises(DuplicateNameError, match="tool 'calc' is already registered"):
        registry.add(Calc)
    with pytest.raises(ConfigError, match="duplicate tool name"):
        ToolSet([registry.get("calc"), registry.get("calc")], episode_id="e")


def test_class_tool_definition_errors() -> None:
    class Nameless(ClassTool):
        async def execute(self, episode_id: str, arguments: dict[str, Any]) -> str:
            return ""

    class BadSchema(ClassTool):
        name = "bad_schema"
        parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {"x": {"type": "nonsense"}}}

        async def execute(self, episode_id: str, arguments: dict[str, Any]) -> str:
            return ""

    class NotObject(BadSchema):
        name = "not_object"
        parameters: ClassVar[dict[str, Any]] = {"type": "array"}

    registry = ToolRegistry()
    with pytest.raises(ConfigError, match="name must be a non-empty string"):
        registry.add(Nameless)
    with pytest.raises(ConfigError, match="not a valid JSON schema"):
        registry.add(BadSchema)
    with pytest.raises(ConfigError, match='"type": "object"'):
        registry.add(NotObject)
    with pytest.raises(ConfigError, match="must subclass ClassTool"):
        registry.add(int)


# ------------------------------------------------------------------------------------ tool_selection


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (None, ["calc", "search", "mean"]),
        ([], []),
        (["search"], ["search"]),
        (["mean", "calc", "mean"], ["mean", "calc"]),
        (("calc",), ["calc"]),
    ],
)
def test_tool_selection_matrix(selection: Any, expected: list[str]) -> None:
    """Seed 001 section 15.2: [] now means no tools (it meant all), order and repeats are defined."""
    registry = make_registry()
    assert registry.validate_selection(selection) == expected
    toolset = registry.toolset("ep", tool_selection=selection)
    assert toolset.names == expected
    assert [schema["function"]["name"] for schema in toolset.schemas()] == expected


@pytest.mark.parametrize(
    ("selection", "fragment"),
    [
        ("calc", "must be a list of tool names or null (all tools); got str 'calc'. Use [] for no tools."),
        ({"calc": True}, "got dict"),
        ({"calc"}, "got set"),
        (3, "got int"),
        (["calc", 7], "must contain tool names (strings); got [7]"),
        (["calc", "nope", "srch"], "unknown tools 'nope', 'srch'; registered tools: calc, search, mean"),
    ],
)
def test_bad_tool_selection_is_an_error_naming_the_problem(selection: Any, fragment: str) -> None:
    """Seed 001 section 15.2: unknown names were dropped silently, a string iterated by character."""
    with pytest.raises(ConfigError) as err:
        make_registry().validate_selection(selection)
    assert fragment in str(err.value)


def test_tool_selection_accepts_one_dimensional_arrays() -> None:
    np = pytest.importorskip("numpy")
    assert validate_tool_selection(np.array(["b", "a"], dtype=object), ["a", "b"]) == ["b", "a"]
    assert validate_tool_selection(np.array([], dtype=object), ["a"]) == []


async def test_unselected_tool_is_not_executed_and_empty_selection_has_no_tools() -> None:
    """Seed 001 section 20, 'correct name but unknown function': the answer lists what is available."""
    registry = make_registry()
    async with registry.toolset("ep", tool_selection=["search"]) as toolset:
        [result] = await toolset.execute([call("calc", expression="1+1")])
    assert result.text == "Error: unknown tool 'calc'. Available tools: search."
    assert result.metrics["error_type"] == ErrorType.UNKNOWN_TOOL and not result.ok
    async with registry.toolset("ep", tool_selection=[]) as toolset:
        assert toolset.schemas() == []
        [result] = await toolset.execute([call("calc", expression="1+1")])
    assert result.text == "Error: unknown tool 'calc': no tools are available in this episode."


# -------------------------------------------------------------------------------- argument validation


@pytest.mark.parametrize(
    ("the_call", "message"),
    [
        (call("calc", expression=5), "argument 'expression': 5 is not of type 'string'"),
        (call("calc"), "missing required argument 'expression'"),
        (call("calc", expression="1", precision=2), "unexpected argument 'precision' (accepted: expression)"),
        (call("mean", values=[1, "x", 3]), "argument 'values[1]': 'x' is not of type 'number'"),
        (call("search", query="q", limit=True), "argument 'limit': True is not of type 'integer'"),
        (raw_call("calc", "[1, 2]"), "arguments must be a JSON object"),
        (raw_call("calc", "{not json"), "arguments must be a JSON object"),
    ],
)
async def test_arguments_are_validated_before_the_tool_runs(the_call: ToolCall, message: str) -> None:
    """Seed 001 section 8.4 / 20: arguments were only json.loads-ed; the schema was not enforced."""
    ran: list[Any] = []
    registry = make_registry()
    registry.remove("calc")

    @registry.function
    def calc(expression: str) -> str:
        """Calc.

        Args:
            expression: Arithmetic.
        """
        ran.append(expression)
        return "ran"

    async with registry.toolset("ep") as toolset:
        [result] = await toolset.execute([the_call])
    assert message in result.text
    assert result.text.startswith(f"Error: invalid arguments for tool '{the_call.function.name}': ")
    assert result.text.endswith("The tool was not run.")
    assert result.metrics["error_type"] == ErrorType.INVALID_ARGUMENTS
    assert result.metrics["executed"] is False
    assert ran == []


async def test_valid_calls_run_sync_and_async_tools_in_call_order() -> None:
    async with make_registry().toolset("ep") as toolset:
        results = await toolset.execute(
            [
                call("search", "c1", query="cats", limit=2),
                call("calc", "c2", expression="18*7"),
                call("mean", "c3", values=[1, 2]),
            ],
            max_parallel_calls=None,
        )
    assert [r.text for r in results] == ['["cats #0", "cats #1"]', "126", "1.5"]
    assert [(r.call_id, r.name) for r in results] == [("c1", "search"), ("c2", "calc"), ("c3", "mean")]
    assert all(r.ok and r.metrics["error_type"] is None and r.metrics["duration_s"] >= 0 for r in results)
    message = results[1].to_message()
    assert (message.role, message.content, message.tool_call_id, message.name) == (
        "tool",
        "126",
        "c2",
        "calc",
    )


# --------------------------------------------------------------------------------------------- timeout


async def test_timeout_answers_the_call_and_the_other_calls_still_run() -> None:
    """Seed 001 section 13.3: no tool timeout, one hanging call blocked the whole trajectory."""
    registry = make_registry()

    @registry.function
    async def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        await asyncio.sleep(seconds)
        return "woke up"

    async with registry.toolset("ep") as toolset:
        results = await toolset.execute(
            [call("slow", seconds=5.0), call("calc", expression="2+2")], timeout_s=0.2, max_parallel_calls=2
        )
    assert results[0].text == "Error: tool 'slow' timed out after 0.2 s."
    assert results[0].metrics["error_type"] == ErrorType.TIMEOUT and results[0].metrics["executed"]
    assert results[1].text == "4" and results[1].ok


async def test_timeout_of_a_sync_tool_running_in_a_thread() -> None:
    registry = ToolRegistry()
    release = threading.Event()

    @registry.function
    def blocking(note: str) -> str:
        """Block until released.

        Args:
            note: Ignored.
        """
        release.wait(5.0)
        return "released"

    try:
        async with registry.toolset("ep") as toolset:
            [result] = await toolset.execute([call("blocking", note="x")], timeout_s=0.2)
        assert result.metrics["error_type"] == ErrorType.TIMEOUT
    finally:
        release.set()  # let the worker thread finish (threads cannot be cancelled)


async def test_a_timeout_error_raised_by_the_tool_is_a_tool_error() -> None:
    registry = ToolRegistry()

    @registry.function
    async def flaky(url: str) -> str:
        """Fetch.

        Args:
            url: Where.
        """
        raise TimeoutError("upstream did not answer")

    async with registry.toolset("ep") as toolset:
        [result] = await toolset.execute([call("flaky", url="x")], timeout_s=5)
    assert result.metrics["error_type"] == ErrorType.TOOL_ERROR
    assert result.text == "Error: tool 'flaky' failed: TimeoutError: upstream did not answer"


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "5", True])
async def test_bad_timeout_is_a_config_error(bad: Any) -> None:
    async with make_registry().toolset("ep") as toolset:
        with pytest.raises(ConfigError, match="timeout_s must be a positive number"):
            await toolset.execute([call("calc", expression="1")], timeout_s=bad)


# ---------------------------------------------------------------------------------- max_parallel_calls


async def test_calls_beyond_max_parallel_calls_are_answered_not_dropped() -> None:
    """Seed 001 section 9: calls past the limit were silently ignored."""
    ran: list[str] = []
    registry = ToolRegistry()

    @registry.function
    def note(text: str) -> str:
        """Note.

        Args:
            text: What.
        """
        ran.append(text)
        return f"noted {text}"

    calls = [call("note", f"c{i}", text=str(i)) for i in range(4)]
    async with registry.toolset("ep") as toolset:
        results = await toolset.execute(calls, max_parallel_calls=2)
    assert sorted(ran) == ["0", "1"]
    assert [r.text for r in results[:2]] == ["noted 0", "noted 1"]
    assert [r.call_id for r in results] == ["c0", "c1", "c2", "c3"]
    for position, result in enumerate(results[2:], start=3):
        assert result.text == (
            f"Error: tool call {position} of 4 ('note') was not run: at most 2 tool calls run per turn "
            "(max_parallel_calls). Repeat it in a later turn if it is still needed."
        )
        assert result.metrics["error_type"] == ErrorType.NOT_EXECUTED and not result.metrics["executed"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
async def test_bad_max_parallel_calls_is_a_config_error(bad: Any) -> None:
    """Seed 001 section 2.2: 0 ran nothing and -1 ran all but the last (Python slicing)."""
    async with make_registry().toolset("ep") as toolset:
        with pytest.raises(ConfigError, match="max_parallel_calls must be a positive integer or null"):
            await toolset.execute([call("calc", expression="1")], max_parallel_calls=bad)


# ------------------------------------------------------------------------------ errors inside a tool


async def test_tool_exception_becomes_an_observation_without_traceback() -> None:
    registry = ToolRegistry()

    @registry.function
    def explode(why: str) -> str:
        """Fail.

        Args:
            why: Message.
        """
        raise ValueError(why)

    async with registry.toolset("ep") as toolset:
        [result] = await toolset.execute([call("explode", why="boom")])
        [again] = await toolset.execute([call("explode", why="")])
    assert result.text == "Error: tool 'explode' failed: ValueError: boom"
    assert "Traceback" not in result.text and "File " not in result.text
    assert (
        result.metrics["error_type"] == ErrorType.TOOL_ERROR and result.metrics["exception"] == "ValueError"
    )
    assert result.reward == 0.0
    assert again.text == "Error: tool 'explode' failed: ValueError"


async def test_return_values_are_normalised() -> None:
    registry = ToolRegistry()

    @registry.function
    def shape(kind: str) -> Any:
        """Return various things.

        Args:
            kind: Which.
        """
        return {
            "dict": {"b": 1, "é": [None]},
            "none": None,
            "result": ToolResult(text="hi", reward=0.5, metrics={"hits": 3, "ok": "overridden"}),
            "nan": ToolResult(text="x", reward=float("nan")),
            "object": complex(1, 2),
        }[kind]

    async with registry.toolset("ep") as toolset:
        results = await toolset.execute(
            [call("shape", kind=k) for k in ("dict", "none", "result", "nan", "object")],
            max_parallel_calls=None,
        )
    assert results[0].text == '{"b": 1, "é": [null]}'
    assert results[1].text == ""
    assert (results[2].text, results[2].reward, results[2].metrics["hits"], results[2].ok) == (
        "hi",
        0.5,
        3,
        True,
    )
    assert results[3].metrics["error_type"] == ErrorType.TOOL_ERROR and "finite" in results[3].text
    assert results[4].text == "(1+2j)"


# ------------------------------------------------------------------------------------------ truncation


@pytest.mark.parametrize(
    ("side", "expected"),
    [
        ("right", "abcdefg...(53 chars truncated)"),
        ("left", "(53 chars truncated)...1234567"),
        ("middle", "ab...(56 chars truncated)...67"),
    ],
)
async def test_truncation_sides(side: Any, expected: str) -> None:
    registry = ToolRegistry()

    @registry.function
    def alphabet(n: int) -> str:
        """Letters.

        Args:
            n: Ignored.
        """
        return "abcdefghijklmnopqrstuvwxyz" * 2 + "01234567"

    async with registry.toolset("ep", max_chars=30, truncate_side=side) as toolset:
        [result] = await toolset.execute([call("alphabet", n=1)])
    assert result.text == expected and len(result.text) == 30
    assert result.metrics["truncated"] is True and result.metrics["response_chars"] == 60


async def test_error_observations_are_capped_too() -> None:
    """Seed 001 section 14: error observations bypassed the length cap."""
    async with make_registry().toolset("ep", max_chars=30) as toolset:
        [result] = await toolset.execute([call("nope" * 50)])
    assert len(result.text) <= 30 and result.metrics["truncated"]


@pytest.mark.parametrize("bad", ["mid", "", None, "MIDDLE"])
def test_bad_truncate_side_is_a_config_error(bad: Any) -> None:
    """Seed 001 section 2.2: any other value silently meant 'middle'."""
    with pytest.raises(ConfigError, match="truncate_side must be one of left, right, middle"):
        make_registry().toolset("ep", truncate_side=bad)
    with pytest.raises(ConfigError, match="truncate_side"):
        truncate_text("abc", 2, bad)


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_bad_max_chars_is_a_config_error(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_tool_response_chars must be a positive integer"):
        ToolSet([], episode_id="ep", max_chars=bad)


@given(
    text=st.text(max_size=300),
    cap=st.integers(min_value=1, max_value=120),
    side=st.sampled_from(["left", "right", "middle"]),
)
def test_truncation_is_a_hard_cap(text: str, cap: int, side: Any) -> None:
    """Seed 001 section 14: the marker was added after cutting, so the cap was not a hard limit."""
    out, cut = truncate_text(text, cap, side)
    assert len(out) <= cap
    assert cut == (len(text) > cap)
    if not cut:
        assert out == text
    elif cap >= 40:  # room for the marker: the kept side is a real slice of the text
        kept = out.split("truncated)")[-1].removeprefix("...") if side == "left" else out.split("...(")[0]
        assert text.endswith(kept) if side == "left" else text.startswith(kept)


def test_truncation_without_cap() -> None:
    assert truncate_text("x" * 10_000, None, "left") == ("x" * 10_000, False)


# -------------------------------------------------------------------------------- class-tool lifecycle


class Counter(ClassTool):
    """Per-episode counter; ``events`` (a test probe passed at registration) records the lifecycle."""

    name = "counter"
    description = "Count calls in this episode."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"step": {"type": "integer"}, "fail": {"type": "boolean"}},
        "required": ["step"],
        "additionalProperties": False,
    }

    def __init__(self, events: list[tuple[str, str, int]]) -> None:
        self.events = events
        self.count = 0
        self.in_flight = 0
        self.max_in_flight = 0

    async def create(self, episode_id: str) -> None:
        self.events.append(("create", episode_id, id(self)))

    async def execute(self, episode_id: str, arguments: dict[str, Any]) -> ToolResult:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        if arguments.get("fail"):
            raise RuntimeError("asked to fail")
        self.count += arguments["step"]
        self.events.append(("execute", episode_id, id(self)))
        return ToolResult(
            text=f"count={self.count}",
            reward=float(arguments["step"]),
            metrics={"max_in_flight": self.max_in_flight},
        )

    async def release(self, episode_id: str) -> None:
        self.events.append(("release", episode_id, id(self)))


def counter_registry(events: list[tuple[str, str, int]]) -> ToolRegistry:
    registry = make_registry()
    class_tool(Counter, registry=registry, init_kwargs={"events": events})
    return registry


async def test_class_tool_is_created_lazily_once_and_released_at_close() -> None:
    events: list[tuple[str, str, int]] = []
    registry = counter_registry(events)
    toolset = registry.toolset("ep-1")
    await toolset.execute([call("calc", expression="1")])
    assert events == []  # not created at construction, nor by another tool's call
    first = await toolset.execute([call("counter", step=1), call("counter", step=2)], max_parallel_calls=2)
    second = await toolset.execute([call("counter", step=10)])
    kinds = [kind for kind, _, _ in events]
    assert kinds == ["create", "execute", "execute", "execute"]
    assert {episode for _, episode, _ in events} == {"ep-1"}
    assert len({instance for _, _, instance in events}) == 1
    assert sorted(r.text for r in first) == ["count=1", "count=3"] and second[0].text == "count=13"
    # Calls to one instance are serialised by default (episode state is rarely safe in parallel).
    assert max(r.metrics["max_in_flight"] for r in first) == 1
    assert await toolset.close() == []
    assert [kind for kind, _, _ in events][-1] == "release"
    assert await toolset.close() == []  # idempotent: released once
    assert [kind for kind, _, _ in events].count("release") == 1
    with pytest.raises(RuntimeError, match="closed"):
        await toolset.execute([call("counter", step=1)])


async def test_unused_class_tool_is_never_created_or_released() -> None:
    events: list[tuple[str, str, int]] = []
    async with counter_registry(events).toolset("ep") as toolset:
        await toolset.execute([call("calc", expression="1")])
    assert events == []


async def test_class_tool_is_released_even_when_the_episode_fails() -> None:
    """Seed 001 section 13.3: release could be skipped or mask the error; now it always runs at close."""
    events: list[tuple[str, str, int]] = []
    registry = counter_registry(events)
    with pytest.raises(KeyError):
        async with registry.toolset("ep-err") as toolset:
            [failed] = await toolset.execute([call("counter", step=1, fail=True)])
            assert failed.metrics["error_type"] == ErrorType.TOOL_ERROR
            assert failed.text == "Error: tool 'counter' failed: RuntimeError: asked to fail"
            raise KeyError("the agent flow crashed")
    assert [kind for kind, _, _ in events] == ["create", "release"]


async def test_two_episodes_never_share_an_instance_or_its_state() -> None:
    """Seed 001 section 13.4: worker-level tool objects leaked state between trajectories."""
    events: list[tuple[str, str, int]] = []
    registry = counter_registry(events)
    async with registry.toolset("A") as a, registry.toolset("B") as b:
        await a.execute([call("counter", step=5)])
        results = await asyncio.gather(
            a.execute([call("counter", step=5)]), b.execute([call("counter", step=1)])
        )
    assert results[0][0].text == "count=10" and results[1][0].text == "count=1"
    instances = {episode: {inst for _, ep, inst in events if ep == episode} for episode in ("A", "B")}
    assert len(instances["A"]) == len(instances["B"]) == 1 and instances["A"] != instances["B"]
    assert sorted((kind, ep) for kind, ep, _ in events if kind != "execute") == [
        ("create", "A"),
        ("create", "B"),
        ("release", "A"),
        ("release", "B"),
    ]


async def test_failed_or_timed_out_create_is_retried_and_still_released() -> None:
    log: list[str] = []

    class Sandbox(ClassTool):
        name = "sandbox"
        attempts = 0

        async def create(self, episode_id: str) -> None:
            Sandbox.attempts += 1
            log.append(f"create{Sandbox.attempts}")
            if Sandbox.attempts == 1:
                await asyncio.sleep(5)
            if Sandbox.attempts == 2:
                raise ConnectionError("no sandbox host")

        async def execute(self, episode_id: str, arguments: dict[str, Any]) -> str:
            return "ran"

        async def release(self, episode_id: str) -> None:
            log.append("release")
            raise OSError("already gone")

    registry = ToolRegistry([Sandbox])
    toolset = registry.toolset("ep")
    outcomes = [(await toolset.execute([call("sandbox")], timeout_s=0.2))[0] for _ in range(3)]
    assert [r.metrics["error_type"] for r in outcomes] == [ErrorType.TIMEOUT, ErrorType.TOOL_ERROR, None]
    assert outcomes[1].text == "Error: tool 'sandbox' failed: ConnectionError: no sandbox host"
    assert outcomes[2].text == "ran"
    problems = await toolset.close()  # a failing release is reported, not raised
    assert problems == ["sandbox: OSError: already gone"]
    assert log == ["create1", "create2", "create3", "release"]


async def test_concurrent_class_tools_may_overlap_and_sync_methods_work() -> None:
    class Barrier(ClassTool):
        name = "barrier"
        concurrent_calls = True

        def __init__(self) -> None:
            self.arrived = 0
            self.both = asyncio.Event()

        async def execute(self, episode_id: str, arguments: dict[str, Any]) -> str:
            self.arrived += 1
            if self.arrived == 2:
                self.both.set()
            await self.both.wait()  # only returns if the two calls run at the same time
            return "met"

    class SyncTool(ClassTool):
        name = "sync_tool"

        def create(self, episode_id: str) -> None:  # type: ignore[override]
            self.ready = True

        def execute(self, episode_id: str, arguments: dict[str, Any]) -> str:  # type: ignore[override]
            return f"sync ready={self.ready}"

    async with ToolRegistry([Barrier, SyncTool]).toolset("ep") as toolset:
        results = await toolset.execute(
            [call("barrier"), call("barrier"), call("sync_tool")], timeout_s=5, max_parallel_calls=3
        )
    assert [r.text for r in results] == ["met", "met", "sync ready=True"]


# ---------------------------------------------------------------------------------- rewards, metrics


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("ignore", 1.0), ("sum", 1.0 + 0.5 + 0.25 - 1.0), ("last", 1.0 - 1.0)],
)
def test_fold_tool_rewards(mode: Any, expected: float) -> None:
    """Seed 001 section 16: tool rewards never reached the training reward; now the mode decides."""
    assert fold_tool_rewards(1.0, [0.5, 0.25, -1.0], mode) == pytest.approx(expected)
    assert fold_tool_rewards(2.0, [], mode) == 2.0


def test_bad_reward_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="tool_reward_mode must be one of ignore, sum, last; got 'mean'"):
        fold_tool_rewards(0.0, [1.0], "mean")  # type: ignore[arg-type]


async def test_tool_rewards_and_metrics_are_recorded() -> None:
    """Seed 001 section 16: execute()'s metrics were discarded; now every call keeps them."""
    events: list[tuple[str, str, int]] = []
    async with counter_registry(events).toolset("ep") as toolset:
        await toolset.execute([call("counter", step=2), call("nope")], max_parallel_calls=2)
        await toolset.execute([call("counter", step=3), call("counter", step=4)], max_parallel_calls=1)
        results = toolset.results
    assert toolset.rewards == [2.0, 3.0]  # only calls that reached a tool
    assert fold_tool_rewards(0.0, toolset.rewards, "sum") == 5.0
    summary = summarize_tool_metrics(results)
    assert summary["tool/calls"] == 4.0 and summary["tool/ok"] == 2.0 and summary["tool/executed"] == 2.0
    assert summary["tool/error/unknown_tool"] == 1.0 and summary["tool/error/not_executed"] == 1.0
    assert summary["tool/reward_sum"] == 5.0 and summary["tool/duration_s_total"] >= 0.0


# --------------------------------------------------------------------------------------------- config


def test_tools_config_defaults_and_helpers() -> None:
    config = ToolsConfig()
    assert config.tool_parser == "hermes" and config.truncate_side == "middle"
    assert tools_config.execute_kwargs(config) == {"timeout_s": 30.0, "max_parallel_calls": 1}
    assert tools_config.fold_rewards(config, 1.0, [0.5]) == 1.0
    composite = ToolsConfig(tool_parser=["hermes", "final_answer"], tool_reward_mode="sum")
    action = tools_config.make_parser(composite).parse(
        '<tool_call>{"name": "calc", "arguments": {}}</tool_call>FINAL ANSWER: 3'
    )
    assert action.final_answer == "3" and len(action.tool_calls) == 1
    assert tools_config.fold_rewards(composite, 1.0, [0.5]) == 1.5
    toolset = tools_config.toolset(config, make_registry(), "ep", ["calc"])
    assert toolset.names == ["calc"] and toolset.max_chars == 4096


def test_an_unknown_parser_is_named_by_its_key_at_start_up_and_where_it_is_built() -> None:
    """The config section is plain data; the parser registry checks the name (the entry points' check, and
    make_parser where a flow is built), naming the key and the registered parsers."""
    from agentevolver.module.agent_flow.plugins import plugin_name_errors

    bad = ToolsConfig(tool_parser="llama3_json")
    with pytest.raises(ConfigError, match=r"agent_flow\.tools\.tool_parser: unknown tool parser 'llama3_json'; registered: "):
        tools_config.make_parser(bad)
    (message,) = plugin_name_errors({"agent_flow": {"tools": {"tool_parser": ["hermes", "llama3_json"]}}})
    assert message.startswith("agent_flow.tools.tool_parser: unknown tool parser 'llama3_json'")
    assert plugin_name_errors({"agent_flow": {"tools": {"tool_parser": "hermes"}}}) == []


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"truncate_side": "midle"}, "truncate_side"),
        ({"tool_reward_mode": "avg"}, "tool_reward_mode"),
        ({"max_parallel_calls": 0}, "max_parallel_calls"),
        ({"tool_timeout_s": 0}, "tool_timeout_s"),
        ({"max_tool_response_chars": -1}, "max_tool_response_chars"),
        ({"tool_selection": ["calc"]}, "Extra inputs are not permitted"),
    ],
)
def test_tools_config_rejects_bad_values(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        ToolsConfig(**overrides)
    assert fragment in str(err.value)
