"""ADCA-GRPO maths: hand-computed batches for each scheme, the GRPO invariant against verl's own GRPO, the
vectorised code against the per-sample oracle, and the DataProto entry point.

The hand examples write every intermediate the docstring of ``adca_grpo`` names (raw process reward, its
group z-score, the outcome z-score, the fused reward, the suffix sum) so a failure points at the step.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from agentevolver.module.adv_processor import AdcaHyper, compute_prm_grpo_advantages, cosine_alpha
from agentevolver.module.adv_processor.adca_grpo import (
    num_steps,
    pack_step_flags,
    prm_grpo_advantages,
    ragged_to_padded,
    step_ids_tensor,
)
from tools.adv_oracle import naive_prm_grpo_advantages

GOOD, BAD = True, False
R2, R3 = math.sqrt(2.0), math.sqrt(3.0)


def run(step_ids: list[list[int]], outcomes: list[float], groups: list[int], flags: list[Any],
        fallback: torch.Tensor | None = None, **hyper: Any) -> Any:
    ids = torch.tensor(step_ids)
    packed, labelled = pack_step_flags(flags, num_steps(ids))
    return prm_grpo_advantages(ids, (ids >= 0).long(), torch.tensor(outcomes), torch.tensor(groups), packed, labelled,
                               fallback, AdcaHyper(**hyper))


def close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    assert torch.allclose(actual.to(torch.float64), torch.tensor(expected, dtype=torch.float64), atol=2e-5), \
        (actual, expected)


# ----------------------------------------------------------------------------------------- hand examples
def test_decouple_hand_example_grpo_groups_last_step() -> None:
    # one GRPO group; A succeeded with [GOOD, BAD], B failed with [BAD, BAD]
    result = run([[0, 0, 1, -1], [0, 1, 1, -1]], [1.0, 0.0], [0, 0], [[GOOD, BAD], [BAD, BAD]], alpha=0.5)
    # raw: A [.2, -.2], B [-.2, -.2]; trajectory means 0 and -.2 -> mu = -.1;
    # var = mean(((.3^2 + .1^2)/2, (.1^2 + .1^2)/2)) = mean(.05, .01) = .03 -> sd = sqrt(.03)
    # z: A [sqrt3, -1/sqrt3], B [-1/sqrt3, -1/sqrt3]; outcome z = (1 - .5)/std([1, 0]) = +-1/sqrt2
    z_a, z_b = [R3, -1 / R3], [-1 / R3, -1 / R3]
    fused_a = [0.5 * z_a[0], 0.5 * z_a[1] + 1 / R2]
    fused_b = [0.5 * z_b[0], 0.5 * z_b[1] - 1 / R2]
    close(result.step_rewards, [fused_a, fused_b])
    adv_a = [fused_a[0] + fused_a[1], fused_a[1]]
    adv_b = [fused_b[0] + fused_b[1], fused_b[1]]
    close(result.step_advantages, [adv_a, adv_b])
    close(result.advantages, [[adv_a[0], adv_a[0], adv_a[1], 0.0], [adv_b[0], adv_b[1], adv_b[1], 0.0]])
    close(result.orm_scores[None], [[1 / R2, -1 / R2]])


def test_allocation_hand_example() -> None:
    # A succeeded [GOOD, BAD]: weights [1, .5] -> raw +[2/3, 1/3]; B failed [GOOD, BAD]: weights [.5, 1]
    # -> raw -[1/3, 2/3]. Means .5 and -.5 -> mu 0; var = (4/9 + 1/9)/2 = 5/18 for both.
    result = run([[0, 1], [0, 1]], [1.0, 0.0], [7, 7], [[GOOD, BAD], [GOOD, BAD]], prm_scheme="allocation",
                 allocation_inconsistent_weight=0.5, alpha=1.0)
    sd = math.sqrt(5 / 18)
    fused_a = [(2 / 3) / sd, (1 / 3) / sd + 1 / R2]
    fused_b = [-(1 / 3) / sd, -(2 / 3) / sd - 1 / R2]
    close(result.step_rewards, [fused_a, fused_b])
    close(result.advantages, [[sum(fused_a), fused_a[1]], [sum(fused_b), fused_b[1]]])


def test_pooled_all_steps_with_length_normalisation_hand_example() -> None:
    # two GRPO groups, but pooled: one group over the batch, every step weighing the same.
    # raw A [.2], B [.2, -.2, -.2]: mean 0, var .04, sd .2 -> z A [1], B [1, -1, -1]; outcome z over the
    # batch: +-1/sqrt2. all_steps adds it to every step; length normalisation divides by sqrt(K).
    result = run([[0, -1, -1, -1], [0, 1, -1, 2]], [1.0, 0.0], [0, 1], [[GOOD], [GOOD, BAD, BAD]],
                 equal_trajectory_weight=False, orm_distribution="all_steps", enable_length_normalization=True,
                 alpha=0.5)
    fused_a = [0.5 + 1 / R2]
    fused_b = [(0.5 - 1 / R2) / R3, (-0.5 - 1 / R2) / R3, (-0.5 - 1 / R2) / R3]
    close(result.step_rewards, [[*fused_a, 0.0, 0.0], fused_b])
    suffix_b = [sum(fused_b), fused_b[1] + fused_b[2], fused_b[2]]
    close(result.advantages, [[fused_a[0], 0.0, 0.0, 0.0], [suffix_b[0], suffix_b[1], 0.0, suffix_b[2]]])


def test_equal_labels_in_a_group_carry_no_process_signal_and_fix_base_cancels() -> None:
    # every step GOOD: the group has no spread, z = 0 exactly, so only the outcome remains
    result = run([[0, 1], [0, 1]], [1.0, 0.0], [0, 0], [[GOOD, GOOD], [GOOD, GOOD]], alpha=5.0)
    close(result.advantages, [[1 / R2, 1 / R2], [-1 / R2, -1 / R2]])
    # the z-score is scale-free: fix_base does not change the advantages
    args = ([[0, 1, 1], [0, 0, 1]], [1.0, 0.0], [0, 0], [[GOOD, BAD], [BAD, BAD]])
    assert torch.allclose(run(*args, fix_base=0.2).advantages, run(*args, fix_base=3.0).advantages, atol=1e-6)


def test_tokens_of_no_step_and_unmasked_tokens_get_zero_and_unlabelled_samples_keep_grpo() -> None:
    fallback = torch.tensor([[9.0, 9.0, 9.0], [4.0, 4.0, 0.0]])
    result = run([[-1, 0, -1], [0, 0, -1]], [1.0, 0.0], [0, 0], [[BAD], None], fallback=fallback, alpha=1.0)
    assert result.advantages[0, 0] == 0.0 and result.advantages[0, 2] == 0.0 and result.advantages[0, 1] != 0.0
    assert result.advantages[1].tolist() == [4.0, 4.0, 0.0]  # no labels: the GRPO advantage, untouched
    assert result.labelled.tolist() == [True, False]


def test_health_metrics_hand_example() -> None:
    # the decouple example above: a_abs = .5 * sum|z|; the outcome is |1/sqrt2| on the last step
    result = run([[0, 0, 1, -1], [0, 1, 1, -1]], [1.0, 0.0], [0, 0], [[GOOD, BAD], [BAD, BAD]], alpha=0.5)
    attr = [0.5 * (R3 + 1 / R3), 0.5 * (2 / R3)]
    share = [(1 / R2) / (1 / R2 + a) for a in attr]
    metrics = result.metrics
    assert metrics["adca/outcome_share_last_mean"] == pytest.approx(sum(share) / 2, abs=1e-5)
    assert metrics["adca/alpha_effective"] == pytest.approx(sum(attr) / (2 / R2), abs=1e-5)
    assert metrics["adca/sum_step_reward_sign_agree"] == 1.0  # A sums > 0 and succeeded, B < 0 and failed
    assert metrics["adca/good_step_rate"] == 0.25 and metrics["adca/labelled_samples"] == 2.0
    assert metrics["adca/pos_traj_good_majority_rate"] == 0.0  # A has 1 GOOD, 1 BAD
    assert metrics["adca/neg_traj_bad_majority_rate"] == 1.0


def test_pack_step_flags_rejects_a_wrong_label_count() -> None:
    with pytest.raises(ValueError, match=r"step_flags\[1\] has 1 labels but sample 1 has 2 step"):
        pack_step_flags([[GOOD], [GOOD]], torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="2 step-flag lists for a batch of 1"):
        pack_step_flags([None, None], torch.tensor([1]))


def test_cosine_alpha_schedule() -> None:
    assert cosine_alpha(0.2, 0.0, 1, 10) == pytest.approx(0.2)
    assert cosine_alpha(0.2, 0.0, 6, 10) == pytest.approx(0.1)
    assert cosine_alpha(0.2, 0.05, 11, 10) == pytest.approx(0.05)
    assert cosine_alpha(0.2, 0.05, 500, 10) == pytest.approx(0.05)
    values = [cosine_alpha(0.3, 0.1, step, 7) for step in range(1, 10)]
    assert values == sorted(values, reverse=True)


def test_ragged_step_ids_are_padded_like_responses() -> None:
    assert ragged_to_padded([[0, 0, 1], [], [-1, 0]], 4).tolist() == [[0, 0, 1, -1], [-1] * 4, [-1, 0, -1, -1]]
    assert ragged_to_padded([[0, 1, 2, 3, 4]], 3).tolist() == [[0, 1, 2]]
    arrays = [np.array([0, 1], dtype=np.int32), np.array([-1, 0, 0, 1, 1], dtype=np.int32)]
    assert ragged_to_padded(arrays, 4).tolist() == [[0, 1, -1, -1], [-1, 0, 0, 1]]
    assert ragged_to_padded([arrays[0], [0, 0]], 3).tolist() == [[0, 1, -1], [0, 0, -1]]


# ----------------------------------------------------------------------------------------- properties
@st.composite
def batches(draw: Any) -> dict[str, Any]:
    """Random GRPO batches: groups of samples with 0-4 steps, gaps of non-policy tokens, padding."""
    rows, outcomes, groups, flags = [], [], [], []
    for group in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(1, 4))):
            count = draw(st.integers(0, 4))
            ids: list[int] = []
            for step in range(count):
                ids += [-1] * draw(st.integers(0, 2))
                ids += [step] * draw(st.integers(1 if step == count - 1 else 0, 3))
            rows.append(ids + [-1] * draw(st.integers(0, 2)))
            outcomes.append(draw(st.sampled_from([0.0, 1.0, 0.5, -1.0, 0.25])))
            groups.append(group)
            flags.append(draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=count, max_size=count))))
    length = max(len(r) for r in rows) + draw(st.integers(0, 2))
    step_ids = ragged_to_padded(rows, max(length, 1))
    return {"step_ids": step_ids, "mask": (step_ids >= 0).long(), "outcomes": outcomes, "groups": groups,
            "flags": flags}


hypers = st.builds(
    AdcaHyper,
    prm_scheme=st.sampled_from(["decouple", "allocation"]),
    equal_trajectory_weight=st.booleans(),
    fix_base=st.sampled_from([0.2, 1.0]),
    alpha=st.sampled_from([0.0, 0.1, 0.7]),
    orm_distribution=st.sampled_from(["last_step", "all_steps"]),
    enable_length_normalization=st.booleans(),
    allocation_inconsistent_weight=st.sampled_from([0.2, 1.0]),
    norm_adv_by_std=st.booleans(),
)


def grpo(data: dict[str, Any], norm: bool = True) -> torch.Tensor:
    """verl's own GRPO advantages (what the trainer computed before ADCA)."""
    rewards = torch.zeros(data["step_ids"].shape)
    rewards[:, -1] = torch.tensor(data["outcomes"])
    advantages, _ = compute_grpo_outcome_advantage(rewards, data["mask"].float(), np.array(data["groups"]),
                                                   norm_adv_by_std_in_grpo=norm)
    return advantages


@settings(max_examples=150, deadline=None)
@given(data=batches(), scheme=st.sampled_from(["decouple", "allocation"]), norm=st.booleans(),
       labelled=st.booleans())
def test_alpha_zero_last_step_equals_verl_grpo(data: dict[str, Any], scheme: str, norm: bool, labelled: bool) -> None:
    flags = [[GOOD] * c for c in num_steps(data["step_ids"]).tolist()] if labelled else data["flags"]
    hyper = AdcaHyper(prm_scheme=scheme, alpha=0.0, norm_adv_by_std=norm)  # type: ignore[arg-type]
    packed, mask_labelled = pack_step_flags(flags, num_steps(data["step_ids"]))
    expected = grpo(data, norm)
    for fallback in (expected, None):
        result = prm_grpo_advantages(data["step_ids"], data["mask"], torch.tensor(data["outcomes"]),
                                     torch.tensor(data["groups"]), packed, mask_labelled, fallback, hyper)
        assert torch.allclose(result.advantages, expected, atol=1e-5), (result.advantages, expected)


@settings(max_examples=200, deadline=None)
@given(data=batches(), hyper=hypers)
def test_vectorised_equals_the_per_sample_oracle(data: dict[str, Any], hyper: AdcaHyper) -> None:
    fallback = grpo(data, hyper.norm_adv_by_std)
    packed, labelled = pack_step_flags(data["flags"], num_steps(data["step_ids"]))
    result = prm_grpo_advantages(data["step_ids"], data["mask"], torch.tensor(data["outcomes"]),
                                 torch.tensor(data["groups"]), packed, labelled, fallback, hyper)
    expected = naive_prm_grpo_advantages(data["step_ids"], data["mask"], data["outcomes"], data["groups"],
                                         data["flags"], fallback, hyper)
    assert torch.allclose(result.advantages, expected, atol=1e-4, rtol=1e-4)
    # tokens of no step are never credited
    assert bool((result.advantages[data["step_ids"] < 0] == 0).all())
    assert all(math.isfinite(v) for v in result.metrics.values())


# ----------------------------------------------------------------------------------------- DataProto entry
def data_proto(step_ids: list[list[int]], outcomes: list[float], uids: list[str], *, as_tensor: bool) -> DataProto:
    length = max(len(r) for r in step_ids)
    padded = ragged_to_padded(step_ids, length)
    mask = (padded >= 0).long()
    rewards = torch.zeros(len(step_ids), length)
    rewards[:, -1] = torch.tensor(outcomes)
    advantages, _ = compute_grpo_outcome_advantage(rewards, mask.float(), np.array(uids, dtype=object))
    tensors = {"response_mask": mask, "responses": torch.ones_like(padded), "token_level_rewards": rewards,
               "advantages": advantages}
    non_tensors: dict[str, np.ndarray] = {"uid": np.array(uids, dtype=object)}
    if as_tensor:
        tensors["step_ids"] = padded
    else:
        rows = np.empty(len(step_ids), dtype=object)
        rows[:] = [list(r) for r in step_ids]
        non_tensors["step_ids"] = rows
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def test_compute_on_a_data_proto_reads_list_or_tensor_step_ids() -> None:
    ids = [[0, 0, 1, 1, 2], [0, -1, 1], [0, 0]]
    flags = [[GOOD, BAD, GOOD], [BAD, GOOD], [GOOD]]
    hyper = AdcaHyper(alpha=0.3)
    from_lists = compute_prm_grpo_advantages(data_proto(ids, [1.0, 0.0, 1.0], ["a", "a", "b"], as_tensor=False),
                                             flags, hyper)
    from_tensor = compute_prm_grpo_advantages(data_proto(ids, [1.0, 0.0, 1.0], ["a", "a", "b"], as_tensor=True),
                                              flags, hyper)
    assert torch.equal(from_lists.advantages, from_tensor.advantages)
    assert from_lists.advantages.shape == (3, 5)


def test_data_proto_without_what_adca_needs_says_what_is_missing() -> None:
    batch = data_proto([[0]], [1.0], ["a"], as_tensor=True)
    del batch.non_tensor_batch["uid"]
    with pytest.raises(KeyError, match="uid"):
        compute_prm_grpo_advantages(batch, [[GOOD]], AdcaHyper())
    bare = DataProto.from_dict(tensors={"response_mask": torch.ones(1, 2)}, non_tensors={"uid": np.array(["a"])})
    with pytest.raises(KeyError, match="step ids"):
        step_ids_tensor(bare)
