"""Self-Navigating: experience from past episodes in the prompt, stripped again for training where configured.

* :mod:`.allocation` - the seeded keep/discard and with/without-experience draws;
* :mod:`.manager` - the trainer's side: plan per batch, initial and periodic summaries, metrics;
* :mod:`.rollout` - applies the plan to every batch verl rolls out;
* :mod:`.retriever` - the episode's side: fetch and format experience after ``/create``;
* :mod:`.summarizer` - background summary requests to the memory service;
* :mod:`.loss` - the on/off-policy policy loss (``exp_on_off`` in verl's registry).

The memory service itself is :mod:`agentevolver.memory_service`; docs/self_navigating.md is the guide.
"""

from agentevolver.module.exp_manager.allocation import (
    ExperiencePlan,
    allocate_add_experience,
    allocate_train_modes,
    plan_rows,
    seeded_rng,
)

__all__ = ["ExperiencePlan", "allocate_add_experience", "allocate_train_modes", "plan_rows", "seeded_rng"]
