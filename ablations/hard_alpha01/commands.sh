#!/usr/bin/env bash
# Ablation 'hard': the exact command of every run, in the order they ran.
#   python -m agentevolver.experiments ablation --conf examples/ablation/hard.yaml --arms sa --seeds 1 --out ablations/hard_alpha01 --report-only -- attribution_driven_credit_assignment.adca_grpo.alpha=0.1
# Each command is a normal launch (docs/launcher.md): run alone, it starts the services it names and
# stops them at its end. The ablation started them once instead (the services launch below) and every
# run reused them, as a launch reuses a service that already answers.
set -euo pipefail
cd /work/main

# shared services, held for the whole ablation (blocks until stopped):
# /work/main/.venv/bin/python -m agentevolver.launcher --conf /work/main/examples/quickstart_hard.yaml --with-env --target agentevolver.experiments.hold -- trainer.total_training_steps=6 trainer.test_freq=2 trainer.val_before_train=true trainer.save_freq=-1 'trainer.logger=[table,jsonl]' actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16 actor_rollout_ref.rollout.dtype=bf16 attribution_driven_credit_assignment.adca_grpo.alpha=0.1 trainer.experiment_name=hard-services launcher.record_dir=/work/main/ablations/hard_alpha01/records

# sa, seed 0 -> /work/main/ablations/hard_alpha01/runs/sa/seed0
/work/main/.venv/bin/python -m agentevolver.launcher --conf /work/main/examples/quickstart_hard.yaml --with-env -- trainer.total_training_steps=6 trainer.test_freq=2 trainer.val_before_train=true trainer.save_freq=-1 'trainer.logger=[table,jsonl]' actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16 actor_rollout_ref.rollout.dtype=bf16 algorithm.adv_estimator=adca_grpo attribution_driven_credit_assignment.judge.source=env attribution_driven_credit_assignment.adca_grpo.alpha=0.3 data.seed=0 actor_rollout_ref.rollout.seed=0 actor_rollout_ref.actor.data_loader_seed=0 task_manager.mixture.seed=0 exp_manager.seed=0 task_manager.synthetic_tasks_path=/work/main/ablations/hard_alpha01/runs/sa/seed0/synthetic_tasks.jsonl task_manager.checkpoint_path=/work/main/ablations/hard_alpha01/runs/sa/seed0/synthetic_tasks.checkpoint.json attribution_driven_credit_assignment.adca_grpo.alpha=0.1 trainer.experiment_name=hard-sa-seed0 trainer.default_local_dir=/work/main/ablations/hard_alpha01/runs/sa/seed0 launcher.record_dir=/work/main/ablations/hard_alpha01/records trainer.resume_mode=auto
