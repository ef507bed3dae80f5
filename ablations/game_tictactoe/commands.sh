#!/usr/bin/env bash
# Ablation 'game_tictactoe': the exact command of every run, in the order they ran.
#   python -m agentevolver.experiments ablation --conf examples/ablation/game_tictactoe.yaml -- env_service.env_url=http://127.0.0.1:18731
# Each command is a normal launch (docs/launcher.md): run alone, it starts the services it names and
# stops them at its end. The ablation started them once instead (the services launch below) and every
# run reused them, as a launch reuses a service that already answers.
set -euo pipefail
cd /work/main

# shared services, held for the whole ablation (blocks until stopped):
# /work/main/.venv/bin/python -m agentevolver.launcher --conf /work/main/examples/game_tictactoe.yaml --with-env --target agentevolver.experiments.hold -- trainer.total_training_steps=6 trainer.test_freq=6 trainer.val_before_train=true trainer.save_freq=6 trainer.max_actor_ckpt_to_keep=1 'actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]' 'trainer.logger=[table,jsonl]' env_service.env_url=http://127.0.0.1:18731 trainer.experiment_name=game_tictactoe-services launcher.record_dir=/work/main/ablations/game_tictactoe/records

# vs_random, seed 0 -> /work/main/ablations/game_tictactoe/runs/vs_random/seed0
/work/main/.venv/bin/python -m agentevolver.launcher --conf /work/main/examples/game_tictactoe.yaml --with-env -- trainer.total_training_steps=6 trainer.test_freq=6 trainer.val_before_train=true trainer.save_freq=6 trainer.max_actor_ckpt_to_keep=1 'actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]' 'trainer.logger=[table,jsonl]' data.seed=0 actor_rollout_ref.rollout.seed=0 actor_rollout_ref.actor.data_loader_seed=0 game.seed=0 env_service.env_url=http://127.0.0.1:18731 trainer.experiment_name=game_tictactoe-vs_random-seed0 trainer.default_local_dir=/work/main/ablations/game_tictactoe/runs/vs_random/seed0 launcher.record_dir=/work/main/ablations/game_tictactoe/records trainer.resume_mode=auto

# vs_random, seed 1 -> /work/main/ablations/game_tictactoe/runs/vs_random/seed1
/work/main/.venv/bin/python -m agentevolver.launcher --conf /work/main/examples/game_tictactoe.yaml --with-env -- trainer.total_training_steps=6 trainer.test_freq=6 trainer.val_before_train=true trainer.save_freq=6 trainer.max_actor_ckpt_to_keep=1 'actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]' 'trainer.logger=[table,jsonl]' data.seed=1 actor_rollout_ref.rollout.seed=1 actor_rollout_ref.actor.data_loader_seed=1 game.seed=1 env_service.env_url=http://127.0.0.1:18731 trainer.experiment_name=game_tictactoe-vs_random-seed1 trainer.default_local_dir=/work/main/ablations/game_tictactoe/runs/vs_random/seed1 launcher.record_dir=/work/main/ablations/game_tictactoe/records trainer.resume_mode=auto

# vs_random, seed 2 -> /work/main/ablations/game_tictactoe/runs/vs_random/seed2
/work/main/.venv/bin/python -m agentevolver.launcher --conf /work/main/examples/game_tictactoe.yaml --with-env -- trainer.total_training_steps=6 trainer.test_freq=6 trainer.val_before_train=true trainer.save_freq=6 trainer.max_actor_ckpt_to_keep=1 'actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]' 'trainer.logger=[table,jsonl]' data.seed=2 actor_rollout_ref.rollout.seed=2 actor_rollout_ref.actor.data_loader_seed=2 game.seed=2 env_service.env_url=http://127.0.0.1:18731 trainer.experiment_name=game_tictactoe-vs_random-seed2 trainer.default_local_dir=/work/main/ablations/game_tictactoe/runs/vs_random/seed2 launcher.record_dir=/work/main/ablations/game_tictactoe/records trainer.resume_mode=auto
