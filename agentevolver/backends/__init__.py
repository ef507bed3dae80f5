"""Generation backends: what differs between a CPU-only machine and a GPU machine.

The agent loop only calls ``generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput``, verl's
rollout-server signature. Which object answers that call is the one thing that depends on the machine:

* GPU: verl's own server manager in front of vLLM, used unchanged (nothing here);
* CPU: :class:`agentevolver.backends.cpu.HFGenerator`, a batched transformers decoder with the same call,
  so the same agent loop, masks and log-probs run on a laptop or a CI runner without vLLM.
"""
