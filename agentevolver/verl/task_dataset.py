"""Tasks as a dataset verl's dataloader can batch: one row per task, the agent loop reads ``task``.

:func:`build_task_datasets` is how a training run gets its two datasets (seed 000, chapter 1: two task
managers): training rows from the *mixture* task manager (the environment's train split plus synthetic
tasks from ``task_manager.synthetic_tasks_path``, generated first when ``task_manager.n`` > 0, by
``task_manager.mixture``), validation rows from the *original-only* one, so evaluation never sees a
synthetic task.

verl's ``RLHFDataset`` holds chat prompts; an agent-environment run holds *tasks* whose prompt the
environment writes at ``/create``. A row here carries the task manager's
:class:`~agentevolver.schema.TaskObjective` itself under ``task`` (verl's collate keeps any non-tensor as one
object, and Ray pickles it to the agent-loop workers: no JSON round trip), the environment's ``/create``
parameters (``env_params``), ``agent_name`` (our agent loop), ``data_source`` (the env type: verl groups
validation metrics by it), ``raw_prompt`` (a one-message stand-in; verl copies it into the outputs) and verl's
``dummy_tensor`` (a batch must hold at least one tensor). The order of rows is the order of the objectives;
verl's sampler shuffles, and its stateful dataloader checkpoints the position.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from agentevolver.config.schema import AgentEvolverSettings
from agentevolver.errors import AgentEvolverError, ConfigError
from agentevolver.module.task_manager.seeds import spread_over
from agentevolver.module.task_manager.store import original_objectives
from agentevolver.schema import TaskObjective
from agentevolver.verl.agent_loop import AGENT_LOOP_NAME

__all__ = ["TaskDataset", "build_task_datasets", "spread_over", "synthetic_pool", "tasks_from_env_service"]

logger = logging.getLogger(__name__)


class TaskDataset(Dataset):
    """Rows for verl's agent-loop rollout, one per task objective (see the module docstring)."""

    def __init__(self, objectives: Sequence[TaskObjective], create_params: Mapping[str, Any] | None = None, *,
                 name: str = "tasks") -> None:
        if not objectives:
            raise ConfigError(f"the {name} dataset is empty: the environment split has no tasks (check "
                              "env_service.env_type and the split names env_service.train_split / val_split)")
        for index, objective in enumerate(objectives):  # a wrong row fails at load, not mid-run
            if not isinstance(objective, TaskObjective):
                raise ConfigError(f"the {name} dataset's task {index} is a {type(objective).__name__}, not a "
                                  "TaskObjective (build rows with original_objectives() or the task manager)")
        self.objectives = list(objectives)
        self.create_params = dict(create_params or {})
        #: What building the dataset measured (``tasks/*``: the training mixture's size and synthetic share, the
        #: task generation's funnel); the trainer logs them with its first step.
        self.metrics: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self.objectives)

    def __getitem__(self, index: int) -> dict[str, Any]:
        objective = self.objectives[index]
        return {
            "task": objective,
            "env_params": dict(self.create_params),
            "agent_name": AGENT_LOOP_NAME,
            "data_source": objective.task.env_type,
            "raw_prompt": [{"role": "user", "content": f"task {objective.task.task_id}"}],
            "index": index,
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
        }


def tasks_from_env_service(
    env_client: Any, env_type: str, split: str, limit: int = -1, grader: str = "env"
) -> list[TaskObjective]:
    """The tasks of an environment split as original objectives scored by ``grader``.

    ``limit`` < 0 takes every task; otherwise ``limit`` tasks spread evenly over the split, not its first
    ones: environments list their tasks grouped by level or kind, and the first N would be one level only
    (calc's first 16 validation tasks are all one-operation questions).
    """
    try:
        task_ids = env_client.get_env_profile(env_type, split)
    except Exception as err:  # the client's error names the service problem; add what we were doing
        raise ConfigError(f"cannot list the {split!r} tasks of environment {env_type!r} at "
                          f"{env_client.settings.env_url}: {err}") from err
    return original_objectives(spread_over(task_ids, -1 if limit is None else limit), env_type, grader)


def synthetic_pool(settings: Any, env_client: Any, llm: Any = None) -> tuple[list[Any], dict[str, float]]:
    """The synthetic tasks the training mixture draws from (:class:`TaskObjective` list), and the generation's
    ``tasks/*`` metrics when this run generated (:meth:`GenerationReport.metrics`; empty otherwise).

    Empty when the mixture takes none (``synthetic_data_ratio`` 0). Otherwise the tasks are generated
    first when ``task_manager.n`` > 0 (resuming from the checkpoint; a finished generation sends no LLM
    request) and then read from ``task_manager.synthetic_tasks_path``. Tasks of another environment in the
    file are an error (the file was written for another run).
    """
    from agentevolver.client.llm_client import LLMClients
    from agentevolver.module.task_manager import TaskManager, read_objectives, seed_tasks

    section = settings.task_manager
    if section.mixture.synthetic_data_ratio == 0:
        if section.n > 0:
            logger.warning("task_manager.n=%d but task_manager.mixture.synthetic_data_ratio is 0: the training "
                           "mixture takes no synthetic task, so none are generated", section.n)
        return [], {}
    metrics: dict[str, float] = {}
    if section.n > 0:
        owned = llm is None
        llm = llm if llm is not None else LLMClients(settings.llm)
        try:
            manager = TaskManager.from_settings(settings, env=env_client, llm=llm)
            report = manager.generate_task(seed_tasks(env_client, settings))
        finally:
            if owned:
                llm.close()
        logger.info("task generation: %s; rates %s", dict(report.counts), report.rates())
        metrics = report.metrics()
        if report.failures:
            raise AgentEvolverError(
                f"task generation: {len(report.failures)} exploration(s)/judgement(s) failed (first: "
                f"{report.failures[0]}); check the LLM endpoints and the environment service, then rerun: "
                f"finished explorations are kept in {section.checkpoint_path}")
    pool = read_objectives(section.synthetic_tasks_path)
    env_type = settings.env_service.env_type
    foreign = sorted({o.task.env_type for o in pool if o.task.env_type != env_type})
    if foreign:
        raise ConfigError(f"task_manager.synthetic_tasks_path ({section.synthetic_tasks_path}) holds tasks of "
                          f"{foreign}, not of env_service.env_type={env_type!r}; point it at this environment's file")
    return pool, metrics


def build_task_datasets(config: Any, settings: AgentEvolverSettings, *, env_client: Any = None,
                        llm: Any = None) -> tuple[TaskDataset, TaskDataset]:
    """Train (mixture task manager) and validation (original-only task manager) datasets of a run.

    ``config`` is the composed config (Hydra node); ``data.train_max_samples`` / ``val_max_samples`` cap
    the original tasks of each split (spread over the split). ``env_client`` / ``llm`` default to clients
    built from the config (and closed here); ``settings`` are the run's validated sections (the entry point,
    the task runner, validates them once).
    """
    from agentevolver.client.env_client import EnvClient
    from agentevolver.module.task_manager import TaskManager

    section = settings.env_service
    grader = settings.task_manager.grader.original_grader
    train_manager = TaskManager.from_settings(settings, env=env_client, llm=llm)
    val_manager = TaskManager.from_settings(settings, env=env_client, llm=llm, mixture="original_only")
    env = env_client if env_client is not None else EnvClient.from_config(section)
    try:
        limits = {"train": int(config.data.get("train_max_samples", -1)),
                  "val": int(config.data.get("val_max_samples", -1))}
        val_only = bool(config.trainer.get("val_only", False))
        splits = (("val", section.val_split),) if val_only else (("train", section.train_split),
                                                                 ("val", section.val_split))
        original = {name: tasks_from_env_service(env, section.env_type, split, limits[name], grader)
                    for name, split in splits}
        # A validation-only run (the untrained base of an ablation) trains on nothing, but verl builds a
        # training loader all the same: it gets the validation tasks, and no synthetic task is generated or read.
        synthetic, generation = ([], {}) if val_only else synthetic_pool(settings, env, llm)
    finally:
        if env_client is None:
            env.close()
    val = val_manager.mix(original["val"], [])
    train = list(val) if val_only else train_manager.mix(original["train"], synthetic)
    if not train:
        raise ConfigError("the training mixture is empty: task_manager.mixture.use_original_tasks is false and "
                          f"{settings.task_manager.synthetic_tasks_path} holds no synthetic task; generate tasks or "
                          "keep the original ones")
    params = section.create_params
    synthetic_in_train = sum(o.source == "synthetic" for o in train)
    logger.info("training tasks: %d (%d synthetic); validation tasks: %d (original only)", len(train),
                synthetic_in_train, len(val))
    train_set = TaskDataset(train, params, name="train")
    train_set.metrics = {**generation, "tasks/train": float(len(train)),
                         "tasks/train_synthetic": float(synthetic_in_train)}
    return train_set, TaskDataset(val, params, name="validation")
