"""``mcp``: any MCP server (a stdio command or a streamable-HTTP URL) as an environment.

The config file (``AGENTEVOLVER_MCP_CONFIG``, :mod:`.config`) names the servers; their tools, as
``list_tools`` gives them, are the episode's tools, and calls go through the official ``mcp`` SDK. Tasks come
from a user's JSONL file or, without one, are exploration seeds for Self-Questioning (:mod:`.tasks`); split
``explore`` lists the seeds either way (:mod:`env_service.environments.exploration_seeds`).
docs/env_mcp.md walks from a server command to a training run.

Episode protocol:

* ``reset()`` -> system prompt, the task's query.
* ``step(assistant message)``:

  - tool calls -> one ``tool`` message per call, not terminal: the result's text (and structured content),
    or an ``Error: ...`` observation for a tool error, an unknown tool, arguments that violate the tool's
    input schema (checked before the call, naming the field), or a call past the server's time limit (the
    server, maybe wedged, is then restarted). A result over ``max_result_chars`` is cut, with a note;
  - a message without tool calls is the final answer (the text after ``final_answer_marker`` when present)
    and ends the episode; after ``max_steps`` agent turns it ends regardless;
  - a server that dies during the episode fails the instance (HTTP 502 ``instance_failed`` naming the server,
    with its stderr tail); a shared server is started again for the next episode, the service stays up.

  The terminating step's reward is the episode's score (``info["score"]``).
* ``evaluate`` -> 1.0 when the task's checker passes (or its reference answer is in the final answer), else
  0.0; a task with neither (an exploration seed) scores 0.0 and is graded by Self-Questioning's grader.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from agentevolver.schema import ChatMessage
from env_service.actions import read_tool_calls
from env_service.base import BaseEnv, StepOutcome
from env_service.environments.exploration_seeds import EXPLORE_SPLIT
from env_service.environments.mcp.config import McpConfig, ServerConfig, load_config
from env_service.environments.mcp.connection import CallTimeout, Connection, ServerError
from env_service.environments.mcp.demonstrations import (
    Demonstration,
    DemonstrationConfig,
    default_question,
    demonstration_messages,
    derive_arguments,
    fill_answer,
    final_answer_text,
)
from env_service.environments.mcp.results import ERROR_PREFIX, cut, render_result, schema_problem
from env_service.environments.mcp.sdk import sdk_problem
from env_service.environments.mcp.servers import POOL, CatalogTool, catalog
from env_service.environments.mcp.tasks import (
    McpTask,
    check_answer,
    exploration_seeds,
    final_answer,
    task_file,
)
from env_service.errors import BadAction, EnvServiceError, EnvUnavailable, InstanceFailed, UnknownTask
from env_service.registry import register_env

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You solve the user's task with the tools you are given. Call a tool whenever you need information or need "
    "to act; you will see its result. When you are done, reply without any tool call and write your answer after "
    "'{marker}:'."
)


class UnknownServer(EnvServiceError):
    """A task or ``params.servers`` names a server the config does not define."""

    status = 404
    code = "unknown_server"


class _Setup:
    """Everything class-level, built once per process from the config: servers, tool catalogue, tasks."""

    def __init__(self, config: McpConfig, folder: Path) -> None:
        problem = sdk_problem()
        if problem:
            raise EnvUnavailable(f"mcp: {problem}", field="env_type")
        self.config = config
        self.servers = {server.name: server for server in config.servers}
        try:
            self.catalog = catalog(config)
        except ServerError as err:
            raise EnvUnavailable(f"mcp: {err.message}", field="env_type") from err
        if config.tasks is not None:
            path = Path(config.tasks).expanduser()
            self.tasks = task_file(path if path.is_absolute() else folder / path)
        else:
            self.tasks = exploration_seeds([(t.exposed, t.server, t.tool.description) for t in self.catalog])
        #: split ``explore``: one exploration seed per tool, with or without a task file (not tasks)
        self.seeds = {seed.id: seed.model_copy(update={"split": EXPLORE_SPLIT})
                      for seed in exploration_seeds([(t.exposed, t.server, t.tool.description) for t in self.catalog])
                      if seed.split == "train"}
        for task in self.tasks:
            unknown = sorted(set(task.servers or []) - set(self.servers))
            if unknown:
                raise EnvUnavailable(f"mcp: task {task.id!r} names server(s) {unknown} that the config does not "
                                     f"define; servers: {', '.join(self.servers)}", field="env_type")
        self.by_id = {task.id: task for task in self.tasks}
        #: The demonstrations every opening shows (made once per process, by real calls).
        self.demonstrations = demonstration_messages([self._demonstration(i, demo)
                                                      for i, demo in enumerate(config.demonstrations)])

    def _demonstration(self, index: int, demo: DemonstrationConfig) -> Demonstration:
        """One demonstration, made by calling its tool for real (docs/env_mcp.md, "Demonstrations")."""
        where = f"demonstrations[{index}]"
        tools = {tool.exposed: tool for tool in self.catalog}
        tool = tools.get(demo.tool)
        if tool is None:
            raise EnvUnavailable(f"mcp: {where}.tool: no tool {demo.tool!r}; tools: {', '.join(tools)}",
                                 field="env_type")
        arguments = demo.arguments
        if arguments is None:
            arguments, missing = derive_arguments(tool.tool.input_schema)
            if missing:
                raise EnvUnavailable(f"mcp: {where}: the input schema of {demo.tool!r} gives no value for "
                                     f"{', '.join(missing)}; set {where}.arguments", field="env_type")
        problem = schema_problem(tool.tool.input_schema, arguments)
        if problem is not None:
            raise EnvUnavailable(f"mcp: {where}.arguments: {problem} (input schema of {demo.tool!r})",
                                 field="env_type")
        server = self.servers[tool.server]
        conn = POOL.get(server) if server.scope == "shared" else Connection.open(server)
        try:
            observation = render_result(conn.call(tool.tool.name, arguments), server.max_result_chars)
        except (CallTimeout, ServerError) as err:
            raise EnvUnavailable(f"mcp: {where}: calling {demo.tool!r} failed: {err}", field="env_type") from err
        finally:
            if server.scope != "shared":
                conn.close()
        if observation.is_error:
            raise EnvUnavailable(f"mcp: {where}: {demo.tool!r} answered an error, so it cannot be shown as an "
                                 f"example: {observation.text[:300]}; set {where}.arguments", field="env_type")
        marker = self.config.final_answer_marker
        answer = demo.answer
        if answer is not None:
            try:
                answer = fill_answer(answer, observation.text)
            except ValueError as err:
                raise EnvUnavailable(f"mcp: {where}.answer: {err}", field="env_type") from err
            if not answer.startswith(marker):
                answer = f"{marker}: {answer}"
        return Demonstration(tool=demo.tool, arguments=arguments, result=observation.text,
                             question=demo.question or default_question(demo.tool, tool.tool.description, arguments),
                             answer=answer or final_answer_text(observation.text, marker))

    def tools_of(self, servers: list[str]) -> list[CatalogTool]:
        return [tool for tool in self.catalog if tool.server in servers]


_SETUP_LOCK = threading.Lock()
_SETUPS: dict[int, _Setup] = {}


def setup() -> _Setup:
    """The process's setup, built once per config (the config itself is cached per path)."""
    config, folder = load_config()
    with _SETUP_LOCK:
        if id(config) not in _SETUPS:
            _SETUPS[id(config)] = _Setup(config, folder)
        return _SETUPS[id(config)]


@register_env("mcp")
class McpEnv(BaseEnv):
    """One episode on the configured MCP servers (see the module docstring)."""

    # The third-party code runs in the servers' own processes; ``--isolation mcp=process`` also puts each
    # instance (and the servers it starts) in a process of its own.
    isolation = "inline"

    @classmethod
    def splits(cls) -> list[str]:
        return sorted({task.split for task in setup().tasks})  # ``explore`` holds seeds, not tasks

    @classmethod
    def check_split(cls, split: str) -> None:
        if split != EXPLORE_SPLIT:
            super().check_split(split)

    @classmethod
    def task_ids(cls, split: str) -> list[str]:
        cls.check_split(split)
        if split == EXPLORE_SPLIT:
            return list(setup().seeds)
        return [task.id for task in setup().tasks if task.split == split]

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        return [tool.schema() for tool in setup().catalog]

    def __init__(self, task_id: str, instance_id: str, params: dict[str, Any]) -> None:
        super().__init__(task_id, instance_id, params)
        self.setup = setup()
        task = self.setup.by_id.get(task_id) or self.setup.seeds.get(task_id)
        if task is None:
            raise UnknownTask(f"mcp has no task {task_id!r}; see POST /get_env_profile for the task ids",
                              field="task_id")
        self.task: McpTask = task
        self.server_names = self._server_names(params.get("servers"), task)
        self.tools = {tool.exposed: tool for tool in self.setup.tools_of(self.server_names)}
        self.conns: dict[str, Connection] = {}
        self.steps = 0
        self.terminated = False
        self.answer: str | None = None
        self.restarted: list[str] = []
        for name in self.server_names:  # start (or check) the servers now: a bad one fails /create, not a step
            self._connection(self.setup.servers[name], check=True)

    def _server_names(self, requested: Any, task: McpTask) -> list[str]:
        allowed = task.servers or list(self.setup.servers)
        if requested is None:
            return allowed
        if not isinstance(requested, list) or not all(isinstance(n, str) for n in requested) or not requested:
            raise EnvServiceError(f"params.servers must be a non-empty list of server names; got {requested!r}",
                                  field="params.servers")
        unknown = [name for name in requested if name not in self.setup.servers]
        if unknown:
            raise UnknownServer(f"no MCP server {unknown[0]!r} in the config; servers: "
                                f"{', '.join(self.setup.servers)}", field="params.servers")
        outside = [name for name in requested if name not in allowed]
        if outside:
            raise EnvServiceError(f"task {task.id!r} may use servers {allowed}, not {outside}",
                                  field="params.servers")
        return list(requested)

    def _connection(self, server: ServerConfig, check: bool = False) -> Connection:
        try:
            if server.scope == "shared":
                return POOL.get(server, check)
            conn = self.conns.get(server.name)
            if conn is None or not conn.alive:
                if conn is not None:
                    conn.close()
                conn = self.conns[server.name] = Connection.open(server)
            return conn
        except ServerError as err:
            raise InstanceFailed(err.message) from err

    # ------------------------------------------------------------------ episode
    def reset(self) -> list[ChatMessage]:
        config = self.setup.config
        system = config.system_prompt or DEFAULT_SYSTEM_PROMPT.format(marker=config.final_answer_marker)
        return [ChatMessage(role="system", content=system), *self.setup.demonstrations,
                ChatMessage(role="user", content=self.task.query)]

    def step(self, action: ChatMessage) -> StepOutcome:
        if action.role != "assistant":
            raise BadAction(f"mcp expects an assistant message, got role {action.role!r}", field="messages")
        if self.terminated:
            raise BadAction("the episode is over; create a new instance to play again", field="messages")
        self.steps += 1
        info: dict[str, Any] = {"step": self.steps}
        calls = read_tool_calls(action, self.steps)
        if calls.calls:
            state = [self._run_call(call.id, call.function.name, call.function.arguments, info)
                     for call in calls.calls]
            info["tool_calls"] = len(calls.calls)
        elif calls.problems:
            state = [ChatMessage(role="user", content=f"Your tool call could not be read: {calls.problems[0]}. "
                                 'Write it as <tool_call>\n{"name": "<tool>", "arguments": {...}}\n</tool_call>')]
            info["unreadable_tool_calls"] = len(calls.problems)
        else:
            self.answer = final_answer(action.content or "", self.setup.config.final_answer_marker)
            self.terminated = True
            info.update(reason="final_answer", final_answer=self.answer)
            state = []
        if not self.terminated and self.steps >= self.setup.config.max_steps:
            self.terminated = True
            info["reason"] = "max_steps"
        reward = 0.0
        if self.terminated:
            reward = info["score"] = self.evaluate(sparse=True)
        return StepOutcome(state=state, reward=reward, is_terminated=self.terminated, info=info)

    def _run_call(self, call_id: str, name: str, raw_arguments: str, info: dict[str, Any]) -> ChatMessage:
        def answer(text: str, error: bool = False) -> ChatMessage:
            if error:
                info["tool_errors"] = info.get("tool_errors", 0) + 1
            return ChatMessage(role="tool", content=text, name=name, tool_call_id=call_id)

        tool = self.tools.get(name)
        if tool is None:
            return answer(f"{ERROR_PREFIX} no tool {name!r}; tools: {', '.join(self.tools)}", True)
        try:
            arguments = json.loads(raw_arguments or "{}")
        except json.JSONDecodeError as err:
            return answer(f"{ERROR_PREFIX} the arguments of {name!r} are not JSON ({err})", True)
        problem = schema_problem(tool.tool.input_schema, arguments)
        if problem is not None:
            info["schema_errors"] = info.get("schema_errors", 0) + 1
            return answer(f"{ERROR_PREFIX} {problem} (input schema of tool {name!r}); nothing was called", True)
        server = self.setup.servers[tool.server]
        conn = self._connection(server)
        try:
            result = conn.call(tool.tool.name, arguments)
        except CallTimeout as err:
            info["timeouts"] = info.get("timeouts", 0) + 1
            self._restart(server, conn)
            return answer(f"{ERROR_PREFIX} {err}; the call was abandoned and the server restarted", True)
        except ServerError as err:
            self._restart(server, conn)
            raise InstanceFailed(err.message) from err
        observation = render_result(result, server.max_result_chars)
        if observation.truncated:
            info["truncated_chars"] = info.get("truncated_chars", 0) + observation.truncated
        return answer(observation.text, observation.is_error)

    def _restart(self, server: ServerConfig, conn: Connection) -> None:
        """Stop a server that timed out or died; the next call (or episode) starts it again."""
        self.restarted.append(server.name)
        if server.scope == "shared":
            POOL.drop(server, conn)
        else:
            self.conns.pop(server.name, None)
            threading.Thread(target=conn.close, daemon=True).start()

    # ------------------------------------------------------------------ scoring and info
    def evaluate(self, sparse: bool) -> float:
        checker = self.task.checker
        if checker is not None and checker.type == "tool":
            return 1.0 if self._tool_check() else 0.0
        if checker is None and self.task.answer is None:
            return 0.0
        return 1.0 if check_answer(self.task, self.answer) else 0.0

    def _tool_check(self) -> bool:
        checker = self.task.checker
        assert checker is not None and checker.tool is not None
        tool = self.tools.get(checker.tool)
        if tool is None:
            raise EnvServiceError(f"task {self.task.id!r}: checker tool {checker.tool!r} is not a tool of its "
                                  f"servers ({', '.join(self.tools)})", field="task_id")
        server = self.setup.servers[tool.server]
        conn = self._connection(server)
        try:
            text = render_result(conn.call(tool.tool.name, checker.arguments), server.max_result_chars).text
        except (CallTimeout, ServerError) as err:
            logger.warning("mcp %s: checker call failed: %s", self.instance_id, err)
            return False
        return " ".join((checker.expect or "").lower().split()) in " ".join(text.lower().split())

    def info(self) -> dict[str, Any]:
        return {"env_type": self.name, "task_id": self.task_id, "instance_id": self.instance_id,
                "tools": [tool.schema() for tool in self.tools.values()], "servers": self.server_names,
                "query": self.task.query, "max_steps": self.setup.config.max_steps, "steps": self.steps,
                "terminated": self.terminated, "final_answer": self.answer, "restarted": self.restarted}

    def close(self) -> None:
        conns, self.conns = list(self.conns.values()), {}
        for conn in conns:
            conn.close()


__all__ = ["McpEnv", "UnknownServer", "cut", "setup"]
