"""The TaskRunner, which wires one training run: workers, datasets of tasks, our trainer; then ``fit()``.

It follows verl's legacy ``TaskRunner`` (same worker roles, resource pools and config validation) and
changes what differs for agent-environment training: the datasets are the environment's task splits
(:mod:`.task_dataset`) and the trainer is :class:`AgentEvolverTrainer`.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from omegaconf import DictConfig, OmegaConf
from verl.trainer.main_ppo_v0 import BaseTaskRunner

from agentevolver.config import AgentEvolverSettings, validate_config

__all__ = ["TaskRunner", "TaskRunnerActor", "build_datasets"]

logger = logging.getLogger(__name__)


def build_datasets(config: DictConfig, settings: AgentEvolverSettings) -> tuple[Any, Any]:
    """Train (the mixture task manager: env train split + synthetic tasks) and validation (original tasks
    only) :class:`TaskDataset` of the run (:func:`~.task_dataset.build_task_datasets`)."""
    from agentevolver.verl.task_dataset import build_task_datasets

    return build_task_datasets(config, settings)


class TaskRunner(BaseTaskRunner):
    """Runs one training job (see the module docstring): in the driver's process
    (:class:`~agentevolver.verl.driver_runner.InDriver`) or as the Ray actor :data:`TaskRunnerActor`."""

    def add_actor_rollout_worker(self, config: DictConfig) -> tuple[type, type]:
        """verl's worker roles; with ``trainer.rollout_server=worker``, the actor/rollout role's
        class is :class:`~agentevolver.verl.cpu.hosting_worker.HFHostingWorker`, which also hosts the ``hf``
        rollout server (:mod:`agentevolver.verl.cpu.hosting`)."""
        from agentevolver.verl.cpu.hosting import hosts_rollout_server

        worker_cls, group_cls = super().add_actor_rollout_worker(config)
        if not hosts_rollout_server(config):
            return worker_cls, group_cls
        from agentevolver.verl.cpu.hosting_worker import HFHostingWorker

        for role, remote_cls in list(self.role_worker_mapping.items()):
            if getattr(remote_cls, "__ray_actor_class__", None) is worker_cls:
                self.role_worker_mapping[role] = ray.remote(HFHostingWorker)
        return HFHostingWorker, group_cls

    def run(self, config: DictConfig) -> None:
        from verl.trainer.ppo.utils import create_rl_sampler, need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.config import validate_config as verl_validate_config
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        import agentevolver.verl.plugin  # noqa: F401 - registrations in this process too
        from agentevolver.verl.cluster import check_cluster
        from agentevolver.verl.custom_reward import check_custom_reward
        from agentevolver.verl.step.trainer import AgentEvolverTrainer

        OmegaConf.resolve(config)
        _, worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        verl_validate_config(config=config, use_reference_policy=need_reference_policy(config),
                             use_critic=need_critic(config))
        settings = validate_config(config)  # our sections, once per run; passed down as typed settings
        check_custom_reward(config)
        check_cluster(config)  # every node in use reaches the services and reads the model / run folder
        model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        train_dataset, val_dataset = build_datasets(config, settings)
        trainer = AgentEvolverTrainer(
            config=config,
            tokenizer=model_config.tokenizer,
            processor=model_config.processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=worker_group_cls,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_dataset),
            settings=settings,
        )
        trainer.init_workers()
        trainer.fit()


#: The TaskRunner as a Ray actor (``trainer.task_runner=actor``; verl's own way). Ray names the actor by the
#: class, so its lines read ``(TaskRunner pid=...)`` as verl's do.
TaskRunnerActor = ray.remote(TaskRunner)
