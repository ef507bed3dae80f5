"""Every place where AgentEvolver touches verl, in one package; ``agentevolver/module`` and
``agentevolver/backends`` have no verl import. By job:

* wiring: :mod:`.plugin` (loaded by verl itself, ``verl.plugins`` entry point, in every process: registers the
  ``cpu`` platform, the ``hf`` rollout, the ``agentevolver`` agent loop and the ``exp_on_off`` policy loss),
  :mod:`.patches` (the monkeypatches verl offers no seam for and the private seams the code relies on, each
  with a guard run on the driver before any worker starts), :mod:`.task_runner` (the Ray actor that wires a
  run), :mod:`.task_dataset` (tasks as verl dataset rows);
* the CPU adapters verl loads: :mod:`.cpu` (the ``cpu`` platform, its FSDP engines, the ``hf`` rollout, the
  vLLM-CPU worker extension);
* the rollout: :mod:`.agent_loop` (the agent flow as a verl agent loop), :mod:`.custom_reward` (verl's
  ``reward.custom_reward_function`` on episodes);
* the step and its stages: :mod:`.step` (:mod:`.step.trainer` is the loop and the step, read top to bottom);
  :mod:`.shared_prefix` (each GRPO group's prompt computed once in the engines' passes);
* cluster checks: :mod:`.cluster` (every node reaches the services and reads the model and the run folder);
* tracking: :mod:`.tracking` (the ``table`` and ``jsonl`` logger backends).

Nothing here is imported by ``import agentevolver.verl`` itself: the plugin runs inside ``import verl`` and
must stay cheap.
"""
