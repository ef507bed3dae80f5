"""Training on verl: the task runner, the trainer with this project's stages, datasets of tasks, metrics.

``python -m agentevolver.main_ppo`` is the entry; see docs/training.md.
"""
