"""Every place where AgentEvolver touches verl, in one package; ``agentevolver/module`` has no verl import.

* :mod:`.plugin` - loaded by verl itself (``verl.plugins`` entry point) in every process: registers the
  ``cpu`` platform, the ``hf`` rollout, the ``agentevolver`` agent loop and the ``exp_on_off`` policy loss.
* :mod:`.patches` - the monkeypatches verl offers no seam for, each with a guard; a tripped guard stops the
  run on the driver (:func:`.patches.check_all`) before any worker starts.
* :mod:`.cpu_platform`, :mod:`.cpu_engine`, :mod:`.cpu_rollout` - the CPU backend as verl sees it.
* :mod:`.task_runner` (the Ray actor that wires a run), :mod:`.task_dataset` (tasks as verl dataset rows),
  :mod:`.trainer` (verl's PPO trainer with the step's stages), :mod:`.stages` (those stages),
  :mod:`.sample_rows` (multi-sample episodes as training rows), :mod:`.tracking` (logger backends),
  :mod:`.episode_metrics`.
* :mod:`.agent_loop` - the agent flow as a verl agent loop; :mod:`.rollout_manager` - verl's rollout manager
  with Self-Navigating's plan; :mod:`.exp_loss` - the ``exp_on_off`` policy loss, given to the actor
  through verl's ``set_loss_fn``.

Nothing here is imported by ``import agentevolver.verl`` itself: the plugin runs inside ``import verl`` and
must stay cheap.
"""
