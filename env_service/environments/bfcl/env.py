"""The ``bfcl`` environment: BFCL multi-turn function-calling entries, executed and scored by bfcl-eval.

Episode = one BFCL entry. :meth:`BfclEnv.reset` returns a system message and the first user turn; each
assistant message with tool calls is one BFCL "step" whose calls run on the entry's live tool instances
(BFCL's own executor, initialised from the entry's ``initial_config``) and come back as ``tool``
messages; an assistant message without tool calls ends the user turn, and the next turn's user message
comes back (or the episode ends after the last turn). Scoring is BFCL's multi-turn checker (see
``scoring.py``). Split ``explore`` lists one exploration seed per tool class (:mod:`.seeds`): not tasks, scored 0.
Details and the reasons for each choice: ``docs/env_bfcl.md``.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from agentevolver.schema import ChatMessage, ToolCall
from env_service.actions import read_tool_calls
from env_service.base import BaseEnv, Isolation, StepOutcome
from env_service.environments.bfcl import scoring, tools
from env_service.environments.bfcl.bfcl_api import bfcl
from env_service.environments.bfcl.data import SPLIT_RULES, TOOL_CLASSES, BfclTask, split_task_ids
from env_service.environments.bfcl.seeds import NOT_A_TASK, bfcl_task, is_seed_task, seed_task_ids
from env_service.environments.exploration_seeds import EXPLORE_SPLIT
from env_service.errors import BadAction
from env_service.registry import register_env

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You help the user by calling the functions (tools) you are given; they act on a simulated system "
    "whose state persists for the whole conversation. Every user message starts a turn. Within a turn, "
    "call functions as needed, over as many messages as you need, and read their results. When the "
    "request is fulfilled, or cannot be fulfilled with the available functions or the information given, "
    "reply with plain text and no function call: that ends the turn, and the next user message follows. "
    "If a request lacks a required value, or no function fits, say so in plain text instead of guessing. "
    "A turn may have at most {max_steps} messages with function calls; one more ends the conversation as failed."
)


@register_env("bfcl")
class BfclEnv(BaseEnv):
    """One BFCL multi-turn entry (``multi_turn_base``, ``multi_turn_miss_func``, ``multi_turn_miss_param``)."""

    # Safe in-process: each instance keys BFCL's module-level instance cache with its own unique model
    # name and frees those keys on close; the tool classes deep-copy their defaults (see the docs).
    isolation: ClassVar[Isolation] = "inline"

    # ------------------------------------------------------------------ class-level
    @classmethod
    def splits(cls) -> list[str]:
        """train / val / test (multi_turn_base) and the miss_func / miss_param variants of the test indices; the
        seed split ``explore`` holds no task (check_split accepts it)."""
        return list(SPLIT_RULES)

    @classmethod
    def check_split(cls, split: str) -> None:
        if split != EXPLORE_SPLIT:
            super().check_split(split)

    @classmethod
    def task_ids(cls, split: str) -> list[str]:
        """BFCL's own entry ids of ``split`` (deterministic; see ``data.py``), or the exploration seeds."""
        cls.check_split(split)
        return seed_task_ids() if split == EXPLORE_SPLIT else split_task_ids(split)

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]] | None:
        """The catalogue: every tool of the eight multi-turn tool classes (names are unique across them).

        A task exposes only its own classes' tools; use the instance's ``info()["tools"]``.
        """
        return [tools.openai_tool(doc) for doc in tools.class_docs(TOOL_CLASSES)]

    # ------------------------------------------------------------------ instance-level
    def __init__(self, task_id: str, instance_id: str, params: dict[str, Any]) -> None:
        """Validate the task id (``UnknownTask``); nothing is executed before :meth:`reset`."""
        super().__init__(task_id, instance_id, params)
        self._model_name = ""  # set by reset; empty means "no cached BFCL instances to free"
        self.task: BfclTask = bfcl_task(task_id)
        self._api = bfcl()
        self._tool_docs: list[dict[str, Any]] = tools.initial_tool_docs(self.task)
        self._turn_index = 0
        self._finished_turns: scoring.TurnRecord = []
        self._current_turn: list[list[str]] = []
        self._steps_in_turn = 0
        self._done = False
        self._force_quit = False

    def reset(self) -> list[ChatMessage]:
        """Fresh tool instances from ``initial_config``; the system message and the first user turn."""
        self._free_instances()
        self._model_name = scoring.unique_model_name("episode")
        self._tool_docs = tools.initial_tool_docs(self.task)
        self._turn_index = 0
        self._finished_turns = []
        self._current_turn = []
        self._steps_in_turn = 0
        self._done = False
        self._force_quit = False
        self._execute([])  # instantiate and load the scenario now, as BFCL's inference loop does
        system = ChatMessage(role="system",
                             content=SYSTEM_PROMPT.format(max_steps=self._api.max_steps_per_turn))
        return [system, *self._turn_messages(0)]

    def step(self, action: ChatMessage) -> StepOutcome:
        """Run the action's tool calls (one BFCL step), or end the user turn if it has none.

        Calls are ``tool_calls`` or, without them, hermes ``<tool_call>`` blocks in the text (how the
        reference agent acts). A message whose blocks cannot be read has no calls and ends the turn, as an
        undecodable response does in BFCL's own inference loop.
        """
        if self._done:
            raise BadAction("the episode has ended; evaluate or release the instance", field="messages")
        if action.role != "assistant":
            raise BadAction(f"the action must be an assistant message, got role {action.role!r}",
                            field="messages")
        if not self._model_name:
            raise BadAction("reset must be called before step", field="messages")
        calls = read_tool_calls(action).calls
        if calls:
            return self._run_tool_calls(calls)
        return self._end_turn()

    def evaluate(self, sparse: bool) -> float:
        """BFCL's verdict on the finished turns (sparse), or the share of leading turns it accepts (dense); 0 for an
        exploration seed, which has no ground truth."""
        if is_seed_task(self.task):
            return 0.0
        if sparse:
            return scoring.sparse_score(self.task, self._finished_turns, self._force_quit)
        return scoring.dense_score(self.task, self._finished_turns)

    def info(self) -> dict[str, Any]:
        """This task's tools (OpenAI format; grows when a miss_func turn adds functions) and progress."""
        return {
            "env_type": self.name,
            "task_id": self.task_id,
            "instance_id": self.instance_id,
            "category": self.task.category,
            "involved_classes": list(self.task.involved_classes),
            "num_turns": self.task.num_turns,
            "turn_index": self._turn_index,
            "done": self._done,
            "force_quit": self._force_quit,
            "max_steps_per_turn": self._api.max_steps_per_turn,
            "tools": [tools.openai_tool(doc) for doc in self._tool_docs],
            **self._seed_note(),
        }

    def close(self) -> None:
        """Free this episode's cached BFCL tool instances."""
        self._free_instances()

    # ------------------------------------------------------------------ internals
    def _seed_note(self) -> dict[str, str]:
        """``{"note": ...}`` saying an exploration seed is not a task (for info and the last step); else empty."""
        return {"note": NOT_A_TASK} if is_seed_task(self.task) else {}

    def _free_instances(self) -> None:
        if getattr(self, "_model_name", ""):
            scoring.drop_cached_instances(self._model_name, self.task)
            self._model_name = ""

    def _execute(self, calls: list[str]) -> list[str]:
        """BFCL's executor on this episode's live instances (cached under this episode's model name)."""
        results, _ = self._api.execute(
            calls,
            self.task.initial_config,
            self.task.involved_classes,
            self._model_name,
            self.task.id,
            long_context=False,
            is_evaL_run=False,
        )
        return [str(result) for result in results]

    def _turn_messages(self, turn_index: int) -> list[ChatMessage]:
        """The user messages opening ``turn_index``; a miss_func hold-out turn reveals its functions."""
        added = tools.docs_added_at_turn(self.task, turn_index)
        if added:
            self._tool_docs.extend(added)
            content = f"{tools.docs_as_json(added)}\n{self._api.added_functions_prompt}"
            return [ChatMessage(role="user", content=content)]
        return [ChatMessage(role=m["role"], content=m.get("content") or "") for m in self.task.questions[turn_index]]

    def _run_tool_calls(self, calls: list[ToolCall]) -> StepOutcome:
        allowed = tools.callable_names(self.task)
        built: list[str | None] = []
        errors: dict[int, str] = {}
        for position, call in enumerate(calls):
            try:
                built.append(tools.call_string(call.function.name, call.function.arguments_dict(), allowed))
            except ValueError as err:
                built.append(None)
                errors[position] = f"Error during execution: {err}"
        valid = [text for text in built if text is not None]
        results = iter(self._execute(valid)) if valid else iter(())
        if valid:
            self._current_turn.append(valid)
        state = []
        for position, (call, text) in enumerate(zip(calls, built, strict=True)):
            content = next(results) if text is not None else errors[position]
            state.append(ChatMessage(role="tool", content=content, name=call.function.name, tool_call_id=call.id))
        self._steps_in_turn += 1
        if self._steps_in_turn > self._api.max_steps_per_turn:
            # BFCL force-quits the whole entry when a turn exceeds its step limit; the entry then fails.
            self._force_quit = True
            self._done = True
            log.info("bfcl %s: turn %d exceeded %d steps; episode force-quit", self.task_id, self._turn_index,
                     self._api.max_steps_per_turn)
            return StepOutcome(state=state, reward=0.0, is_terminated=True,
                               info={"force_quit": True, "turn_index": self._turn_index, **self._seed_note()})
        return StepOutcome(state=state, info={"turn_index": self._turn_index})

    def _end_turn(self) -> StepOutcome:
        self._finished_turns.append(self._current_turn)
        self._current_turn = []
        self._steps_in_turn = 0
        self._turn_index += 1
        if self._turn_index >= self.task.num_turns:
            self._done = True
            reward = self.evaluate(sparse=True)
            return StepOutcome(state=[], reward=reward, is_terminated=True,
                               info={"turn_index": self._turn_index, "success": reward == 1.0, **self._seed_note()})
        before = len(self._tool_docs)
        state = self._turn_messages(self._turn_index)
        info: dict[str, Any] = {"turn_index": self._turn_index}
        if len(self._tool_docs) != before:
            info["tools"] = [tools.openai_tool(doc) for doc in self._tool_docs]
        return StepOutcome(state=state, info=info)
