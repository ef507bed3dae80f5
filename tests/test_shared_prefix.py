"""Shared-prompt forward (agentevolver.verl.shared_prefix) equals the unshared forward, values and gradients.

Tolerances (fp32, CPU): log-probs and entropy within 2e-5 absolute; every parameter gradient within 1e-4 of
the largest gradient entry of the unshared run (the grouped rows sum the prompt's gradient contributions in
another order than the per-sample rows). Measured on tiny-test: 1e-6 and 7e-7 (SmolLM2-135M, 30 layers:
1.7e-5 on log-probs, as verl's own packed layout differs from its padded one by 2.3e-5).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from env_service_fixture import env_service
from omegaconf import DictConfig
from training_fixture import run_training, shared_prompt_check, training_command, training_timeout

from agentevolver.models import resolve_model_path
from agentevolver.verl.shared_prefix import (
    SharedPrefixPlan,
    check_attention,
    plan_groups,
    response_logprobs,
    sequences_from_padded,
)

LOGPROB_ATOL = 2e-5
GRAD_RTOL = 1e-4


@pytest.fixture(scope="module")
def model_path():
    return str(resolve_model_path("tiny-test"))


def load(path: str, attention: str = "sdpa") -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attention)
    model.train()
    return model


def padded_batch(rows: list[tuple[list[int], list[int]]], prompt_width: int, response_width: int):
    """verl's layout: prompts left-padded to ``prompt_width``, responses right-padded, pad id 0."""
    count = len(rows)
    ids = torch.zeros(count, prompt_width + response_width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, (prompt, response) in enumerate(rows):
        ids[b, prompt_width - len(prompt): prompt_width] = torch.tensor(prompt)
        mask[b, prompt_width - len(prompt): prompt_width] = 1
        ids[b, prompt_width: prompt_width + len(response)] = torch.tensor(response)
        mask[b, prompt_width: prompt_width + len(response)] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def random_tokens(generator: torch.Generator, count: int) -> list[int]:
    return torch.randint(10, 4000, (count,), generator=generator).tolist()


@pytest.fixture(scope="module")
def batch():
    """Two GRPO groups (3 and 2 samples, prompts of 23 and 17 tokens), a multi-sample-episode row whose uid is
    group a's but whose prompt is longer, and a group of one; responses of 1 to 19 tokens, loss masks with
    observation holes (multi-turn)."""
    g = torch.Generator().manual_seed(1)
    prompt_a, prompt_b = random_tokens(g, 23), random_tokens(g, 17)
    later_turn = prompt_a + random_tokens(g, 6)  # same episode, next sample: the prompt grew
    rows = [
        (prompt_a, random_tokens(g, 12)),
        (prompt_b, random_tokens(g, 19)),
        (prompt_a, random_tokens(g, 1)),
        (later_turn, random_tokens(g, 9)),
        (prompt_b, random_tokens(g, 7)),
        (prompt_a, random_tokens(g, 15)),
        (random_tokens(g, 11), random_tokens(g, 5)),
    ]
    uids = ["a", "b", "a", "a", "b", "a", "c"]
    ids, mask, positions = padded_batch(rows, prompt_width=32, response_width=20)
    response_mask = mask[:, 32:].clone()
    response_mask[0, 3:6] = 0  # an observation inside sample 0's response
    response_mask[1, 10:14] = 0
    response_mask[5, 0:2] = 0
    advantages = torch.tensor([1.0, -0.5, 0.3, -1.0, 0.7, -0.2, 0.9])
    return {"ids": ids, "mask": mask, "positions": positions, "uids": uids, "response_mask": response_mask,
            "advantages": advantages, "prompt_width": 32}


def run(model, batch, shared: bool, entropy: bool = True):
    log_probs, ent = response_logprobs(
        model, batch["ids"], batch["mask"], batch["prompt_width"], position_ids=batch["positions"],
        group_ids=batch["uids"], shared=shared, calculate_entropy=entropy,
    )
    return log_probs, ent


def policy_loss(log_probs: torch.Tensor, entropy: torch.Tensor, batch) -> torch.Tensor:
    width = log_probs.shape[1]
    mask = batch["response_mask"][:, :width].float()
    per_token = -log_probs * batch["advantages"].unsqueeze(1) - 0.01 * entropy
    return (per_token * mask).sum() / mask.sum()


def gradients(model, batch, shared: bool) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    log_probs, entropy = run(model, batch, shared)
    policy_loss(log_probs, entropy, batch).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_plan_groups_rows_by_uid_and_identical_prompt(batch):
    sequences, prompt_lens, positions = sequences_from_padded(batch["ids"], batch["mask"], batch["prompt_width"],
                                                              batch["positions"])
    plan = plan_groups(sequences, prompt_lens, positions, batch["uids"])
    assert plan.groups == ((0, 2, 5), (1, 4), (3,), (6,))
    unshared = sum(len(s) for s in sequences)
    # Group a computes its 22-token prefix once instead of three times, group b its 16-token prefix once.
    assert plan.tokens == unshared - 2 * 22 - 16
    # Same prompt, different group ids: not merged (the caller's groups are respected).
    split = plan_groups(sequences, prompt_lens, positions, [str(i) for i in range(len(sequences))])
    assert len(split.groups) == len(sequences)
    # No group ids: identical prompts are enough.
    assert plan_groups(sequences, prompt_lens, positions).groups == plan.groups


def test_attention_mask_blocks_other_segments():
    seq = [torch.tensor([5, 6, 7, 8]), torch.tensor([5, 6, 9])]
    plan = plan_groups(seq, [2, 2])  # prefix [5], segments [6, 7, 8] and [6, 9]
    assert plan.input_ids.tolist() == [[5, 6, 7, 8, 6, 9]]
    assert plan.position_ids.tolist() == [[0, 1, 2, 3, 1, 2]]
    mask = plan.attention_mask("sdpa")[0, 0].int().tolist()
    assert mask == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 0, 0, 0, 1, 0],
        [1, 0, 0, 0, 1, 1],
    ]
    additive = plan.attention_mask("eager")
    assert additive.dtype == torch.float32 and (additive[0, 0] == 0).int().tolist() == mask


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_logprobs_and_entropy_equal_unshared(model_path, batch, attention):
    model = load(model_path, attention)
    with torch.no_grad():
        shared_lp, shared_ent = run(model, batch, shared=True)
        ref_lp, ref_ent = run(model, batch, shared=False)
    assert shared_lp.shape == ref_lp.shape == (7, 19)
    torch.testing.assert_close(shared_lp, ref_lp, atol=LOGPROB_ATOL, rtol=0)
    torch.testing.assert_close(shared_ent, ref_ent, atol=LOGPROB_ATOL, rtol=0)
    # Zero past every response, as no_padding_2_padding lays out the engine's output.
    lengths = batch["mask"][:, batch["prompt_width"]:].sum(1)
    for b, n in enumerate(lengths.tolist()):
        assert (shared_lp[b, n:] == 0).all() and (shared_lp[b, :n] < 0).all()


def test_shared_gradients_equal_unshared(model_path, batch):
    model = load(model_path)
    shared = gradients(model, batch, shared=True)
    reference = gradients(model, batch, shared=False)
    assert shared.keys() == reference.keys() and len(shared) > 0
    for name, grad in reference.items():
        scale = grad.abs().max().item()
        assert scale > 0, name
        diff = (shared[name] - grad).abs().max().item()
        assert diff <= GRAD_RTOL * scale, f"{name}: |diff| {diff:.2e} > {GRAD_RTOL} * {scale:.2e}"


def test_temperature_matches(model_path, batch):
    model = load(model_path)
    with torch.no_grad():
        shared, _ = response_logprobs(model, batch["ids"], batch["mask"], batch["prompt_width"],
                                      group_ids=batch["uids"], temperature=0.7)
        reference, _ = response_logprobs(model, batch["ids"], batch["mask"], batch["prompt_width"],
                                         group_ids=batch["uids"], temperature=0.7, shared=False)
    torch.testing.assert_close(shared, reference, atol=LOGPROB_ATOL, rtol=0)


def test_prompt_of_one_token_and_empty_response(model_path):
    """A 1-token prompt has an empty prefix; a 0-token response yields no log-probs."""
    model = load(model_path)
    seq = [torch.tensor([17]), torch.tensor([17, 40, 41]), torch.tensor([17, 42])]
    sequences_plan = plan_groups(seq, [1, 1, 1])
    assert isinstance(sequences_plan, SharedPrefixPlan) and sequences_plan.groups == ((0, 1, 2),)
    ids, mask, _ = padded_batch([([17], []), ([17], [40, 41]), ([17], [42])], prompt_width=1, response_width=2)
    with torch.no_grad():
        shared, _ = response_logprobs(model, ids, mask, 1)
        reference, _ = response_logprobs(model, ids, mask, 1, shared=False)
    torch.testing.assert_close(shared, reference, atol=LOGPROB_ATOL, rtol=0)
    assert (shared[0] == 0).all()


def test_flash_attention_refused():
    with pytest.raises(ValueError, match="attn_implementation=sdpa"):
        check_attention("flash_attention_2")


# ---------------------------------------------------------------- the engine (verl's forward_step, no Ray)
def bare_engine(model: torch.nn.Module):
    """A ``SharedPromptFSDPEngine`` around a plain (unsharded) model, with the attributes verl's ``forward_step``
    and ``prepare_model_*`` read; enough to run them in this process without a process group."""
    import verl.utils.torch_functional as verl_F
    from verl.workers.config import FSDPEngineConfig

    from agentevolver.verl.shared_prefix.engine import engine_class

    engine = object.__new__(engine_class())
    engine.module = model
    engine.engine_config = FSDPEngineConfig(strategy="fsdp2", use_torch_compile=False)
    engine.compute_entropy_from_logits = verl_F.entropy_from_logits
    engine._autocast_dtype = torch.float32
    engine.use_ulysses_sp = False
    engine.ulysses_sequence_parallel_size = 1
    engine.pad_to_length = False
    engine.pad_to_length_bucket = 1024
    engine.get_data_parallel_group = lambda: None
    return engine


def micro_batch(batch, *, share: bool, remove_padding: bool):
    """The batch as verl's trainer hands it to the engine: a DataProto (with the agent loop's per-sample
    ``uid`` and empty ``multi_modal_inputs``, the switch in ``meta_info``) -> TensorDict -> no padding."""
    import numpy as np
    from verl.protocol import DataProto
    from verl.workers.utils.padding import left_right_2_no_padding

    width = batch["prompt_width"]
    count = batch["ids"].shape[0]
    data = DataProto.from_dict(
        tensors={"input_ids": batch["ids"], "attention_mask": batch["mask"], "position_ids": batch["positions"],
                 "prompts": batch["ids"][:, :width], "responses": batch["ids"][:, width:],
                 "response_mask": batch["response_mask"], "advantages": batch["advantages"]},
        non_tensors={"uid": np.array(batch["uids"], dtype=object),
                     "multi_modal_inputs": np.array([{} for _ in range(count)], dtype=object)},
        meta_info={"temperature": 1.0, "calculate_entropy": True, "use_remove_padding": remove_padding,
                   "pad_token_id": 0, "use_prefix_grouper": share})
    return left_right_2_no_padding(data.to_tensordict())


def engine_loss(model_output, data, dp_group=None):
    """A policy-gradient loss read the way verl's ppo_loss reads the engine's output."""
    from verl.workers.utils.padding import no_padding_2_padding

    log_probs = no_padding_2_padding(model_output["log_probs"], data)
    entropy = no_padding_2_padding(model_output["entropy"], data)
    mask = data["response_mask"].float()
    per_token = -log_probs * data["advantages"].unsqueeze(1) - 0.01 * entropy
    return (per_token * mask).sum() / mask.sum(), {}


@pytest.mark.parametrize("remove_padding", [False, True])
def test_engine_forward_step_shared_equals_verls(model_path, batch, remove_padding):
    """verl's forward_step with the switch on equals verl's own path (padded or packed): the loss, the
    response log-probs and entropy it reports, and every parameter gradient."""
    from verl.workers.utils.padding import no_padding_2_padding

    model = load(model_path)
    engine = bare_engine(model)
    results = {}
    for share in (True, False):
        model.zero_grad(set_to_none=True)
        data = micro_batch(batch, share=share, remove_padding=remove_padding)
        loss, output = engine.forward_step(data, loss_function=engine_loss, forward_only=False)
        loss.backward()
        out = output["model_output"]
        results[share] = (loss.item(), no_padding_2_padding(out["log_probs"], data),
                          no_padding_2_padding(out["entropy"], data),
                          {n: p.grad.clone() for n, p in model.named_parameters()})
    (loss_s, lp_s, ent_s, grad_s), (loss_u, lp_u, ent_u, grad_u) = results[True], results[False]
    assert abs(loss_s - loss_u) <= LOGPROB_ATOL
    valid = batch["mask"][:, batch["prompt_width"]:].bool()
    torch.testing.assert_close(lp_s[valid], lp_u[valid], atol=LOGPROB_ATOL, rtol=0)
    torch.testing.assert_close(ent_s[valid], ent_u[valid], atol=LOGPROB_ATOL, rtol=0)
    for name, grad in grad_u.items():
        assert (grad_s[name] - grad).abs().max() <= GRAD_RTOL * grad.abs().max(), name


def test_engine_keeps_verls_path_without_switch_or_shared_prompts(model_path, batch):
    from agentevolver.verl.shared_prefix.engine import sharing_plan

    engine = bare_engine(load(model_path))
    off = micro_batch(batch, share=False, remove_padding=False)
    assert "shared_prompt_plan" not in engine.prepare_model_inputs(off)[1]
    on = micro_batch(batch, share=True, remove_padding=False)
    assert "shared_prompt_plan" in engine.prepare_model_inputs(on)[1]
    # Every prompt different: nothing to share, verl's path.
    rows = [0, 1, 3, 6]
    single = {**batch, "ids": batch["ids"][rows], "mask": batch["mask"][rows], "positions": batch["positions"][rows],
              "response_mask": batch["response_mask"][rows], "advantages": batch["advantages"][rows],
              "uids": [batch["uids"][r] for r in rows]}
    assert sharing_plan(micro_batch(single, share=True, remove_padding=False)) is None


def test_two_updates_with_switch_on_match_switch_off(model_path, batch):
    """Two optimiser steps through the engine's forward_step on the same batch: the losses (and the weights
    after them) with shared prompts equal those without."""
    runs = {}
    for share in (True, False):
        model = load(model_path)
        engine = bare_engine(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _step in range(2):
            optimizer.zero_grad(set_to_none=True)
            data = micro_batch(batch, share=share, remove_padding=False)
            loss, _output = engine.forward_step(data, loss_function=engine_loss, forward_only=False)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        runs[share] = (losses, {n: p.detach().clone() for n, p in model.named_parameters()})
    (losses_on, weights_on), (losses_off, weights_off) = runs[True], runs[False]
    assert losses_on[0] != losses_on[1]  # the first step moved the weights
    for on, off in zip(losses_on, losses_off, strict=True):
        assert abs(on - off) <= 1e-5, (losses_on, losses_off)
    # Adam divides by the gradient's running magnitude, so on near-zero gradient entries summation-order noise
    # becomes a visible fraction of a step: bound the weights by 5% of the two steps' size (lr each).
    for name, weight in weights_off.items():
        assert (weights_on[name] - weight).abs().max() <= 0.05 * 2 * 1e-3, name


# ---------------------------------------------------------------- the switch, checked on the driver
def _switch_config(**values: object) -> DictConfig:
    from agentevolver.config import load_config

    cfg, _ = load_config([f"{key}={value}" for key, value in values.items()])
    return cfg


def test_the_trainer_and_the_engine_use_one_switch_name() -> None:
    from agentevolver.verl.shared_prefix.engine import SWITCH
    from agentevolver.verl.step.sample_rows import SHARED_PROMPTS

    assert SHARED_PROMPTS == SWITCH == "use_prefix_grouper"


def test_the_cpu_backend_shares_prompts_and_its_sizes_keep_groups_whole() -> None:
    from agentevolver.verl.shared_prefix.checks import check_shared_prompts

    cfg = _switch_config()
    assert cfg.actor_rollout_ref.actor.use_prefix_grouper is True
    assert check_shared_prompts(cfg) == []
    quickstart = _switch_config(**{
        "actor_rollout_ref.rollout.n": 4, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 8})
    assert check_shared_prompts(quickstart) == []


@pytest.mark.parametrize(("values", "fragment"), [
    ({"actor_rollout_ref.model.override_config.attn_implementation": "flash_attention_2"},
     "actor_rollout_ref.model.override_config.attn_implementation is 'flash_attention_2'"),
    ({"actor_rollout_ref.model.use_fused_kernels": "true"}, "use_fused_kernels=true"),
])
def test_settings_the_shared_forward_cannot_serve_are_refused_before_training(values: dict, fragment: str) -> None:
    from agentevolver.errors import ConfigError
    from agentevolver.verl.shared_prefix.checks import check_shared_prompts

    with pytest.raises(ConfigError, match="use_prefix_grouper=true") as info:
        check_shared_prompts(_switch_config(**values))
    assert fragment in str(info.value)
    off = {**values, "actor_rollout_ref.actor.use_prefix_grouper": "false"}
    assert check_shared_prompts(_switch_config(**off)) == []


def test_settings_that_split_groups_are_warnings() -> None:
    from agentevolver.verl.shared_prefix.checks import check_shared_prompts

    warnings = check_shared_prompts(_switch_config(**{
        "actor_rollout_ref.rollout.n": 4, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 8, "actor_rollout_ref.actor.shuffle": "true"}))
    assert len(warnings) == 2
    assert "ppo_micro_batch_size_per_gpu=2 is not a multiple of actor_rollout_ref.rollout.n=4" in warnings[0]
    assert "shuffle=true" in warnings[1]
    single = check_shared_prompts(_switch_config(**{"actor_rollout_ref.rollout.n": 1}))
    assert len(single) == 1 and "no two samples share a prompt" in single[0]


# ---------------------------------------------------------------- end to end (python -m agentevolver.main_ppo)
@training_timeout
def test_two_step_run_with_the_switch_on(tmp_path: Path) -> None:
    """2 steps of GRPO (tiny-test, groups of 4, micro-batches of one group, KL loss so the reference pass runs)
    through the shared-prompt forward.

    Two runs cannot be compared loss for loss: the CPU rollout server samples concurrent episodes from one
    stream, so their rollouts differ. What must hold is what the update is built on: the old log-probs the
    trainer recomputes through the shared forward equal the rollout server's own (fp32 both) -- verl's
    ``rollout_corr/log_ppl_diff_max`` -- and the run trains. The same with the switch off (verl's own forward)
    is ``test_verls_own_forward_recomputes_the_rollouts_log_probs`` in tests/test_main_ppo.py.
    """
    with env_service("lottery", tmp_path=tmp_path) as running:
        command = training_command(running.url, tmp_path, *shared_prompt_check(shared=True))
        result: subprocess.CompletedProcess[str] = run_training(command, tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    for metrics in steps:
        ratio = [value for key, value in metrics.items() if key.endswith("shared_prompt_token_ratio")]
        assert len(ratio) == 1, sorted(metrics)
        assert ratio[0] < 0.9, ratio  # a group of 4 forwards its prompt once
        assert abs(metrics["rollout_corr/log_ppl_diff_max"]) <= 1e-4, metrics["rollout_corr/log_ppl_diff_max"]
        assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    # a step whose two groups each drew four equal scores has no advantage, and step 1's KL to the reference
    # is 0: its gradient is then 0 (seen in CI: step 1 drew 1,1,1,1 and 0,0,0,0); one step must train
    assert any(metrics["actor/grad_norm"] > 0 for metrics in steps), [m["actor/grad_norm"] for m in steps]
