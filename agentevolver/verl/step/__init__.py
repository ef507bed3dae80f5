"""The training step and its stages (docs/training.md). :mod:`.trainer` runs them in order, one method read
top to bottom; the other modules are one stage (or one part of it) each: :mod:`.rollout_inputs` (tasks ->
rollout rows, the initial rollouts of the memory), :mod:`.faults`, :mod:`.sample_rows`, :mod:`.advantage`
(and ADCA-GRPO as verl estimator ``adca_grpo``), :mod:`.episode_metrics`, :mod:`.exp_loss` (the
``exp_on_off`` loss the update runs).

Nothing is imported here: the verl plugin imports :mod:`.exp_loss` inside ``import verl``.
"""
