"""``codebox``: the agent writes a Python function; hidden tests, run in the sandbox, score it.

Episode: ``reset()`` gives the protocol (system) and the task (user). Each assistant message is one
action -- run code (a fenced ```python block, or the ``run_python`` tool) or submit (the ``submit`` tool,
or ``FINAL ANSWER:`` + a fenced block). Tool calls are ``tool_calls`` or hermes ``<tool_call>`` blocks in
the text (:func:`env_service.actions.read_tool_calls`). Submitting grades the code against the hidden tests and ends
the episode with reward = the score.

Errors, and why: mistakes an agent makes while acting (no action in the message, ``FINAL ANSWER:``
without code, an unknown tool, bad tool arguments) become *non-terminal observations* telling it what
to do -- the model should learn from them and an episode should not die of a typo. :class:`BadAction`
is kept for messages the client should never send: a role other than ``assistant``, or any step after
the episode ended.

Split ``explore`` lists one exploration seed per tool (:mod:`.seeds`): not tasks; a submission there is not
graded and scores 0.

Instances hold no processes or files between calls (every run is its own sandbox), so ``inline``
isolation is enough: the sandbox already isolates the untrusted code from the service.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from agentevolver.schema import ChatMessage, ToolCall
from env_service.actions import read_tool_calls
from env_service.base import BaseEnv, Isolation, StepOutcome
from env_service.environments.codebox import prompts
from env_service.environments.codebox.actions import parse_text
from env_service.environments.codebox.grading import Grade, grade
from env_service.environments.codebox.seeds import NOT_GRADED, SeedTask, seed_task, seed_task_ids
from env_service.environments.codebox.tasks import SPLITS, CodeTask, get_task, task_ids
from env_service.environments.exploration_seeds import EXPLORE_SPLIT
from env_service.errors import BadAction
from env_service.registry import register_env
from env_service.sandbox import SandboxLimits, run_python

logger = logging.getLogger(__name__)

#: Limits of one agent code run (hidden-test runs have their own, see ``grading.py``).
RUN_LIMITS = SandboxLimits(cpu_seconds=5.0, wall_seconds=10.0, max_output_bytes=16 * 1024)


@register_env("codebox")
class CodeBoxEnv(BaseEnv):
    """One episode on one codebox task. Params: ``sparse_reward`` (bool, default False): the reward of the
    submitting step is 1.0/0.0 (all tests pass or not) instead of the fraction of tests passed."""

    isolation: ClassVar[Isolation] = "inline"

    # ------------------------------------------------------------------ class-level
    @classmethod
    def splits(cls) -> list[str]:
        return list(SPLITS)  # task splits; the seed split ``explore`` holds no task (check_split accepts it)

    @classmethod
    def check_split(cls, split: str) -> None:
        if split != EXPLORE_SPLIT:
            super().check_split(split)

    @classmethod
    def task_ids(cls, split: str) -> list[str]:
        cls.check_split(split)
        return seed_task_ids() if split == EXPLORE_SPLIT else task_ids(split)

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        return [dict(schema) for schema in prompts.TOOL_SCHEMAS]

    # ------------------------------------------------------------------ instance-level
    def __init__(self, task_id: str, instance_id: str, params: dict[str, Any]) -> None:
        super().__init__(task_id, instance_id, params)
        self.task: CodeTask | SeedTask = seed_task(task_id) or get_task(task_id)
        self.sparse_reward = bool(params.get("sparse_reward", False))
        self._grade: Grade | None = None
        self._ended = False
        self._code_runs = 0

    def reset(self) -> list[ChatMessage]:
        self._grade, self._ended, self._code_runs = None, False, 0
        return [
            ChatMessage(role="system", content=prompts.system_prompt(RUN_LIMITS.cpu_seconds, RUN_LIMITS.memory_bytes)),
            ChatMessage(role="user", content=self.task.statement()),
        ]

    def step(self, action: ChatMessage) -> StepOutcome:
        if action.role != "assistant":
            raise BadAction(f"an action must be an assistant message, got role {action.role!r}", field="messages")
        if self._ended:
            raise BadAction("the episode has ended (a solution was submitted); release the instance",
                            field="messages")
        calls = read_tool_calls(action)
        if calls.calls:
            return self._tool_calls(calls.calls)
        return self._text(action.content, calls.problems)

    def evaluate(self, sparse: bool) -> float:
        if self._grade is None:
            return 0.0
        if sparse:
            return 1.0 if self._grade.passed == self._grade.total else 0.0
        return self._grade.score

    def info(self) -> dict[str, Any]:
        graded = self._grade
        return {
            **super().info(),
            "title": self.task.title,
            "difficulty": self.task.difficulty,
            "split": self.task.split,
            "entry_point": self.task.entry_point,
            "submitted": graded is not None,
            "terminated": self._ended,
            "code_runs": self._code_runs,
            **({"passed": graded.passed, "total": graded.total} if graded is not None else {}),
        }

    # ------------------------------------------------------------------ actions
    def _run(self, code: str) -> tuple[str, dict[str, Any]]:
        self._code_runs += 1
        result = run_python(code, limits=RUN_LIMITS)
        return prompts.format_run(result), {"exit_code": result.exit_code, "killed_reason": result.killed_reason}

    def _submit(self, code: str) -> tuple[str, float, dict[str, Any]]:
        if isinstance(self.task, SeedTask):
            self._ended = True
            return NOT_GRADED, 0.0, {"passed": 0, "total": 0, "score": 0.0}
        self._grade = grade(self.task, code)
        self._ended = True
        reward = self.evaluate(sparse=self.sparse_reward)
        logger.debug("codebox %s: submission passed %d/%d", self.task_id, self._grade.passed, self._grade.total)
        return (self._grade.summary(), reward,
                {"passed": self._grade.passed, "total": self._grade.total, "score": self._grade.score})

    def _text(self, content: str, call_problems: list[str]) -> StepOutcome:
        """A text action; ``call_problems`` are the ``<tool_call>`` blocks that could not be read, if any."""
        parsed = parse_text(content)
        if parsed.kind == "run" and parsed.code is not None:
            text, info = self._run(parsed.code)
            return StepOutcome(state=[ChatMessage(role="user", content=text)], info={"action": "run", **info})
        if parsed.kind == "submit" and parsed.code is not None:
            text, reward, info = self._submit(parsed.code)
            return StepOutcome(state=[ChatMessage(role="user", content=text)], reward=reward, is_terminated=True,
                               info={"action": "submit", **info})
        hint = prompts.BAD_FINAL_HINT if parsed.kind == "bad_final" else prompts.NO_ACTION_HINT
        if call_problems:
            hint = f"Your tool call could not be read: {call_problems[0]}.\n{hint}"
        return StepOutcome(state=[ChatMessage(role="user", content=hint)], info={"action": "none"})

    def _tool_calls(self, calls: list[ToolCall]) -> StepOutcome:
        """Answer every call with a tool message (the chat protocol wants one per call id), in order."""
        replies: list[ChatMessage] = []
        reward = 0.0
        info: dict[str, Any] = {"action": "tools", "calls": []}
        for call in calls:
            name = call.function.name
            if self._ended:
                text, outcome = prompts.ENDED_NOTE, "skipped"
            elif name not in ("run_python", "submit"):
                text, outcome = f"Unknown tool {name!r}. Available tools: run_python, submit.", "unknown_tool"
            else:
                code, problem = _code_argument(call)
                if problem is not None:
                    text, outcome = problem, "bad_arguments"
                elif name == "run_python":
                    text, run_info = self._run(code)
                    outcome = "run"
                    info.update(run_info)
                else:
                    text, reward, submit_info = self._submit(code)
                    outcome = "submit"
                    info.update(submit_info)
            info["calls"].append({"name": name, "outcome": outcome})
            replies.append(ChatMessage(role="tool", content=text, tool_call_id=call.id, name=name))
        return StepOutcome(state=replies, reward=reward, is_terminated=self._ended, info=info)


def _code_argument(call: ToolCall) -> tuple[str, str | None]:
    """The ``code`` argument of a run/submit call, or an explanation of what is wrong with the arguments."""
    try:
        arguments = call.function.arguments_dict()
    except ValueError as err:
        return "", f"Bad arguments: {err}. Expected a JSON object like {{\"code\": \"print(1)\"}}."
    code = arguments.get("code")
    if not isinstance(code, str) or not code.strip():
        return "", (f"Bad arguments for {call.function.name!r}: 'code' must be a non-empty string "
                    f"(got keys {sorted(arguments)}).")
    return code, None
