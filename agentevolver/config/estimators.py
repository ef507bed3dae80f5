"""The advantage estimators (``algorithm.adv_estimator``) by family: one table, read wherever a family matters.

Three readers need to know what an estimator's advantages look like, and each used to keep its own set:
ADCA fuses its step credit into *GRPO* advantages only (its outcome part and fallback), the multi-sample
rows broadcast an episode's advantage to its earlier samples only when it is *one number per episode*, and the
old ADCA switch is rewritten only for *plain GRPO*. Estimators missing from the table (GAE, REINFORCE++, ...)
give per-token advantages and belong to no family.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["ADCA_ESTIMATOR", "ESTIMATOR_FAMILIES", "Family", "in_family", "members"]

#: ADCA-GRPO's name in verl's estimator registry (registered by :mod:`agentevolver.verl.step.advantage`); the one
#: switch of Self-Attributing.
ADCA_ESTIMATOR = "adca_grpo"

#: ``plain_grpo``: verl's GRPO; ``grpo``: advantages that are GRPO's (plain GRPO, and ADCA-GRPO whose outcome
#: part it is); ``outcome``: one advantage per episode on every policy token (GRPO and its kin).
Family = Literal["plain_grpo", "grpo", "outcome"]

#: estimator -> the families it belongs to (each family includes the narrower ones).
ESTIMATOR_FAMILIES: dict[str, frozenset[Family]] = {
    "grpo": frozenset({"plain_grpo", "grpo", "outcome"}),
    "grpo_vectorized": frozenset({"plain_grpo", "grpo", "outcome"}),
    ADCA_ESTIMATOR: frozenset({"grpo", "outcome"}),
    "rloo": frozenset({"outcome"}),
    "rloo_vectorized": frozenset({"outcome"}),
    "opo": frozenset({"outcome"}),
    "grpo_passk": frozenset({"outcome"}),
    "gpg": frozenset({"outcome"}),
}


def in_family(estimator: object, family: Family) -> bool:
    """Whether ``algorithm.adv_estimator`` ``estimator`` belongs to ``family``."""
    return family in ESTIMATOR_FAMILIES.get(str(estimator), frozenset())


def members(family: Family) -> frozenset[str]:
    """Every estimator of ``family`` (for error messages that list the choices)."""
    return frozenset(name for name, families in ESTIMATOR_FAMILIES.items() if family in families)
