"""The ``appworld`` environment: an adapter over ``appworld.AppWorld``, run in a worker process per episode.

reset opens ``AppWorld(task_id=..., experiment_name=...)`` in a fresh worker and returns the protocol and
the task (instruction + supervisor); step runs the assistant's fenced Python via ``world.execute``; the
episode ends when the agent calls ``apis.supervisor.complete_task`` (``world.task_completed()``) or
AppWorld's interaction limit is reached; evaluate is ``world.evaluate()``; close is ``world.close()``
and ends the worker. Split ``explore`` lists one exploration seed per app (:mod:`.seeds`): not tasks, played in
a fixed train world and scored 0. Why a worker and how to deploy: ``docs/env_appworld.md``.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from typing import Any, ClassVar

from agentevolver.schema import ChatMessage
from env_service.base import BaseEnv, Isolation, StepOutcome
from env_service.environments.appworld import prompts
from env_service.environments.appworld.appworld_api import AppWorldNotInstalled, setup
from env_service.environments.appworld.client import WorkerClient, WorkerError
from env_service.environments.appworld.seeds import NOT_A_TASK, seed_query, seed_task_ids
from env_service.environments.exploration_seeds import EXPLORE_SPLIT, is_seed
from env_service.errors import BadAction, InstanceFailed, UnknownTask
from env_service.registry import register_env

log = logging.getLogger(__name__)

#: Our split name -> AppWorld dataset name.
SPLIT_TO_DATASET = {"train": "train", "val": "dev", "test": "test_normal", "test_challenge": "test_challenge"}

#: AppWorld constructor options a client may set through ``params`` (others stay AppWorld's defaults).
CLIENT_OPTIONS = ("max_interactions", "max_api_calls_per_interaction", "timeout_seconds", "random_seed")

OPEN_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 600.0


@functools.cache
def _dataset_task_ids(python: str, dataset: str) -> tuple[str, ...]:
    """``appworld.load_task_ids(dataset)`` via a short-lived worker (cached per process)."""
    try:
        with WorkerClient.start(python) as worker:
            return tuple(worker.request("task_ids", dataset=dataset, timeout_s=OPEN_TIMEOUT_S))
    except WorkerError as err:
        raise AppWorldNotInstalled(f"appworld could not list the {dataset!r} tasks: {err}") from err


@register_env("appworld")
class AppWorldEnv(BaseEnv):
    """One AppWorld task. Actions are assistant messages with fenced Python; observations are its output."""

    # The instance holds only a pipe: AppWorld itself runs in this instance's own worker process, which
    # already isolates its process-wide state (frozen clock, per-task in-memory databases, IPython shell).
    isolation: ClassVar[Isolation] = "inline"

    @classmethod
    def splits(cls) -> list[str]:
        """train / val (AppWorld's dev) / test (test_normal) / test_challenge; needs no AppWorld. The seed split
        ``explore`` holds no task (check_split accepts it)."""
        return list(SPLIT_TO_DATASET)

    @classmethod
    def check_split(cls, split: str) -> None:
        if split != EXPLORE_SPLIT:
            super().check_split(split)

    @classmethod
    def task_ids(cls, split: str) -> list[str]:
        """AppWorld's own ids of the split's dataset (:class:`AppWorldNotInstalled` without AppWorld/data), or the
        exploration seeds (no AppWorld needed)."""
        cls.check_split(split)
        if split == EXPLORE_SPLIT:
            return seed_task_ids()
        return list(_dataset_task_ids(setup().python, SPLIT_TO_DATASET[split]))

    def __init__(self, task_id: str, instance_id: str, params: dict[str, Any]) -> None:
        """Check the task exists in the downloaded data; AppWorld itself starts in :meth:`reset`.

        An exploration seed plays in the world of the first ``train`` task, its question in place of the instruction.
        """
        super().__init__(task_id, instance_id, params)
        self._worker: WorkerClient | None = None
        #: The seed's question, or None for an AppWorld task.
        self._seed_query: str | None = seed_query(task_id) if is_seed(task_id) else None
        self._setup = setup()
        #: The AppWorld task whose world this episode opens (a seed's is the first train task's).
        self._world_id = task_id if self._seed_query is None else self._seed_world()
        if not self._setup.has_task(self._world_id):
            raise UnknownTask(f"appworld has no task {self._world_id!r} in {self._setup.data / 'tasks'}",
                              field="task_id")
        unknown = sorted(set(params) - {"split", "experiment_name", "keep_outputs", *CLIENT_OPTIONS})
        if unknown:
            log.info("appworld %s: ignoring params %s", instance_id, ", ".join(unknown))
        self._options = {key: params[key] for key in CLIENT_OPTIONS if key in params}
        self._keep_outputs = bool(params.get("keep_outputs", False))
        base = re.sub(r"[^A-Za-z0-9_-]", "_", str(params.get("experiment_name", "agentevolver")))[:64]
        # Unique per instance: AppWorld keys its output folder (which evaluate reads) on experiment + task.
        self._experiment_name = f"{base}_{uuid.uuid4().hex[:12]}"
        self._task: dict[str, Any] = {}
        self._done = False
        self._steps = 0
        self._interactions = 0

    def reset(self) -> list[ChatMessage]:
        """Start a worker, open the AppWorld task; the protocol (system) and the task (user)."""
        self._stop_worker()
        self._worker = WorkerClient.start(self._setup.python)
        self._task = self._call("open", OPEN_TIMEOUT_S, task_id=self._world_id, experiment_name=self._experiment_name,
                                kwargs=self._options)
        if self._seed_query is not None:
            self._task["instruction"] = self._seed_query
        self._done = False
        self._steps = 0
        self._interactions = 0
        return [ChatMessage(role="system", content=prompts.SYSTEM_PROMPT),
                ChatMessage(role="user", content=prompts.task_message(self._task))]

    def step(self, action: ChatMessage) -> StepOutcome:
        """Run the message's fenced Python in AppWorld; the output comes back as a user message."""
        if self._worker is None:
            raise BadAction("reset must be called before step", field="messages")
        if self._done:
            raise BadAction("the episode has ended; evaluate or release the instance", field="messages")
        if action.role != "assistant":
            raise BadAction(f"the action must be an assistant message, got role {action.role!r}", field="messages")
        self._steps += 1
        code = prompts.extract_code(action.content)
        if code is None:
            return StepOutcome(state=[ChatMessage(role="user", content=prompts.NO_CODE_MESSAGE)],
                               info={"executed": False})
        result = self._call("execute", CALL_TIMEOUT_S, code=code)
        self._interactions = int(result.get("num_interactions") or self._interactions + 1)
        limit = self._task.get("max_interactions")
        completed = bool(result.get("task_completed"))
        self._done = completed or (isinstance(limit, int) and self._interactions >= limit)
        state = [ChatMessage(role="user", content=prompts.output_message(str(result.get("output", ""))))]
        info: dict[str, Any] = {"executed": True, "task_completed": completed}
        reward = 0.0
        if self._done:
            reward = self.evaluate(sparse=True)
            info["success"] = reward == 1.0
            if self._seed_query is not None:
                info["note"] = NOT_A_TASK
        return StepOutcome(state=state, reward=reward, is_terminated=self._done, info=info)

    def evaluate(self, sparse: bool) -> float:
        """``world.evaluate()``: sparse = 1.0 iff every test passes; dense = passed / total tests. An exploration
        seed scores 0 (its world's tests are another task's)."""
        if self._worker is None:
            raise BadAction("reset must be called before evaluate", field="instance_id")
        if self._seed_query is not None:
            return 0.0
        report = self._call("evaluate", CALL_TIMEOUT_S)
        if sparse:
            return 1.0 if report["success"] else 0.0
        total = int(report["num_tests"])
        return int(report["pass_count"]) / total if total else 0.0

    def info(self) -> dict[str, Any]:
        """The task (instruction, supervisor, apps) and progress; AppWorld has no tool schemas (code actions)."""
        return {"env_type": self.name, "task_id": self.task_id, "instance_id": self.instance_id,
                "instruction": self._task.get("instruction"), "supervisor": self._task.get("supervisor"),
                "apps": sorted(self._task.get("app_descriptions") or {}), "datetime": self._task.get("datetime"),
                "steps": self._steps, "interactions": self._interactions,
                "max_interactions": self._task.get("max_interactions"), "done": self._done,
                "experiment_name": self._experiment_name,
                **({"world_task_id": self._world_id, "note": NOT_A_TASK} if self._seed_query is not None else {})}

    def close(self) -> None:
        """``world.close()`` (and its output folder removed unless ``keep_outputs``), then end the worker."""
        worker = getattr(self, "_worker", None)
        if worker is None:
            return
        try:
            worker.request("close", timeout_s=60, delete_outputs=not self._keep_outputs)
        except WorkerError as err:
            log.warning("appworld %s: close failed: %s", self.instance_id, err)
        self._stop_worker()

    # ------------------------------------------------------------------ internals
    def _seed_world(self) -> str:
        """The world exploration seeds play in: the first task of AppWorld's ``train`` dataset."""
        train = self.task_ids("train")
        if not train:
            raise AppWorldNotInstalled(f"appworld lists no train task in {self._setup.data}, so an exploration seed "
                                       "has no world to play in; run `appworld download data` again")
        return train[0]

    def _call(self, op: str, timeout_s: float, **fields: Any) -> Any:
        assert self._worker is not None
        try:
            return self._worker.request(op, timeout_s=timeout_s, **fields)
        except WorkerError as err:
            if err.kind in {"timeout", "not_installed"} or self._worker.process.poll() is not None:
                raise InstanceFailed(f"appworld worker failed during {op}: {err}") from err
            raise RuntimeError(f"appworld {op} failed: {err}") from err

    def _stop_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()
