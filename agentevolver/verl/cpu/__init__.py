"""The CPU and vLLM-CPU adapters verl loads: what lets verl's trainer run on a machine without an accelerator.

* :mod:`.platform`: verl platform ``cpu`` (``PlatformRegistry``), chosen by ``VERL_PLATFORM=cpu`` or when torch
  is a CPU-only build;
* :mod:`.engine`: verl's FSDP engines registered for device ``cpu`` (``EngineRegistry``), the LM-head one as the
  shared-prompt engine of :mod:`agentevolver.verl.shared_prefix.engine`;
* :mod:`.rollout`: verl rollout ``hf``, the CPU generator (:class:`agentevolver.backends.cpu.HFGenerator`)
  behind verl's rollout-server interface (``RolloutReplicaRegistry`` and patch 3 of
  :mod:`agentevolver.verl.patches`);
* :mod:`.hosting` and :mod:`.hosting_worker`: ``trainer.rollout_server``, the ``hf`` server built inside the
  training worker's process (:mod:`.rollout_server` holds the server and the handles that reach it there);
* :mod:`.vllm`: the engine-worker extension of the ``vllm_cpu`` preset (patch 4), for verl's own vLLM rollout
  on a CPU;
* :mod:`.lora`: actor LoRA: the ``hf`` server's merge of the adapters verl syncs, and the start-up checks of a
  LoRA config.

They live here, not in :mod:`agentevolver.backends` (torch and transformers only), because each imports verl:
every verl touch is in :mod:`agentevolver.verl`. :mod:`agentevolver.verl.plugin` registers them, and imports
this package's modules inside ``import verl``, so this ``__init__`` imports nothing.
"""
