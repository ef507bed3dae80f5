"""Self-Navigating's on/off-policy loss ``exp_on_off`` (seed 002, section 5) and how it is wired into verl.

* the loss against the formula written out here in plain torch (every ``loss_agg_mode``, with and without
  rollout-IS weights, mixed ``exp_mask``, negative advantages, ratios far outside both clip ranges), plus
  one hand-computed example;
* with no exp token it is verl's ``vanilla`` loss bit for bit;
* ``import verl`` registers it (the plugin), so ``actor.policy_loss.loss_mode=exp_on_off`` finds it;
* the ``ppo_loss`` wrapper through verl's real ``ppo_loss`` on a ``TensorDict`` built the way verl's legacy
  trainer builds the actor's batch (``DataProto.to_tensordict`` -> ``left_right_2_no_padding`` -> the
  engine's micro-batching), with ``exp_off_cliprange_high`` in the batch's ``meta_info``;
* the actor gets the loss through verl's ``set_loss_fn`` (no patch): verl's ``ppo_loss`` stays its own.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("verl")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.engine.utils import prepare_micro_batches  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding, response_to_nested  # noqa: E402

from agentevolver.verl.step import exp_loss  # noqa: E402

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]
LOW, HIGH, OFF_HIGH, DUAL = 0.2, 0.28, 0.6, 3.0


def _config(loss_mode: str = "exp_on_off", loss_agg_mode: str = "token-mean") -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=2,
        ppo_micro_batch_size_per_gpu=2,
        ppo_mini_batch_size=4,
        clip_ratio_low=LOW,
        clip_ratio_high=HIGH,
        clip_ratio_c=DUAL,
        loss_agg_mode=loss_agg_mode,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
    )


def _reference(old, new, adv, mask, exp, mode, weights=None):
    """Seed 002 section 5, written out: per-token PPO loss with (low, high) or (low, off_high), dual clip."""
    ratio = torch.exp(torch.clamp(new - old, -20.0, 20.0))

    def token_losses(high):
        loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - LOW, 1 + high))
        return torch.where(adv < 0, torch.minimum(loss, -adv * DUAL), loss)

    losses = token_losses(OFF_HIGH) * exp + token_losses(HIGH) * (1 - exp)
    if weights is not None:
        losses = losses * weights
    m = mask.float()
    seq_sum = (losses * m).sum(-1)
    valid = m.sum(-1) > 0
    if mode == "token-mean":
        return (losses * m).sum() / m.sum()
    if mode == "token-sum":
        return (losses * m).sum()
    if mode == "seq-mean-token-sum":
        return seq_sum[valid].mean()
    if mode == "seq-mean-token-sum-norm":
        return seq_sum[valid].mean() / mask.shape[-1]
    return (seq_sum / m.sum(-1).clamp(min=1))[valid].mean()  # seq-mean-token-mean


def _batch(seed: int, bs: int = 6, length: int = 9):
    """Random log-probs with ratios in [e^-2.5, e^2.5] (outside every clip range), mixed-sign advantages,
    ragged response masks (one row empty) and an exp_mask over whole samples."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(bs, length, generator=g) * 3
    new = old + (torch.rand(bs, length, generator=g) * 5 - 2.5)
    adv = torch.randn(bs, length, generator=g)
    lengths = torch.randint(1, length + 1, (bs,), generator=g)
    lengths[1], lengths[0], lengths[2] = 0, length, length
    mask = torch.arange(length)[None, :] < lengths[:, None]
    exp = (torch.rand(bs, 1, generator=g) < 0.5).float().expand(bs, length) * mask
    exp[0] = mask[0].float()  # at least one exp sample and one on-policy sample
    exp[2] = 0.0
    # tokens every batch has: (row, position) -> (log-ratio, advantage)
    fixed = {
        (0, 0): (2.0, -1.0),  # exp, dual clip (ratio 7.4 > 3)
        (0, 1): (1.0, 1.0),  # exp, off upper clip (2.7 > 1.6)
        (0, 2): (math.log(1.4), 1.0),  # exp, inside the off range (1.4 < 1.6)
        (2, 0): (math.log(1.4), 1.0),  # on, upper clip (1.4 > 1.28)
        (2, 1): (math.log(0.5), -1.0),
    }  # on, lower clip (0.5 < 0.8, A < 0)
    for (row, position), (log_ratio, advantage) in fixed.items():
        new[row, position] = old[row, position] + log_ratio
        adv[row, position] = advantage
    weights = torch.rand(bs, length, generator=g) * 2
    return old, new, adv, mask, exp.contiguous(), weights


# --- 1. the formula ---------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(MODES), weighted=st.booleans())
def test_loss_matches_the_formula(seed: int, mode: str, weighted: bool) -> None:
    old, new, adv, mask, exp, weights = _batch(seed)
    weights = weights if weighted else None
    loss, metrics = exp_loss.compute_policy_loss_exp_on_off(
        old,
        new,
        adv,
        mask,
        loss_agg_mode=mode,
        config=_config(),
        rollout_is_weights=weights,
        exp_mask=exp,
        off_cliprange_high=OFF_HIGH,
    )
    torch.testing.assert_close(
        loss, _reference(old, new, adv, mask, exp, mode, weights), rtol=1e-6, atol=1e-6
    )

    # the extra metrics, from their definitions
    ratio = torch.exp(new - old)
    off_tokens, on_tokens = (exp > 0) & mask, (exp == 0) & mask
    token = _reference_token_losses(old, new, adv, exp, weights)
    assert metrics["actor/exp_token_frac"] == pytest.approx(off_tokens.sum().item() / mask.sum().item())
    assert metrics["actor/on_pg_loss"] == pytest.approx(token[on_tokens].mean().item(), rel=1e-5, abs=1e-6)
    assert metrics["actor/off_pg_loss"] == pytest.approx(token[off_tokens].mean().item(), rel=1e-5, abs=1e-6)
    off_clipped = torch.where(adv > 0, ratio > 1 + OFF_HIGH, ratio < 1 - LOW)
    assert metrics["actor/off_pg_clipfrac"] == pytest.approx(off_clipped[off_tokens].float().mean().item())
    # both clips and the dual clip really act in these batches
    assert 0 < metrics["actor/pg_clipfrac"] < 1 and 0 < metrics["actor/pg_clipfrac_lower"] < 1
    assert 0 < metrics["actor/off_pg_clipfrac"] < 1


def _reference_token_losses(old, new, adv, exp, weights):
    ratio = torch.exp(new - old)

    def branch(high):
        loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - LOW, 1 + high))
        return torch.where(adv < 0, torch.minimum(loss, -adv * DUAL), loss)

    losses = torch.where(exp > 0, branch(OFF_HIGH), branch(HIGH))
    return losses if weights is None else losses * weights


def test_hand_computed_tokens() -> None:
    """Four tokens, on- and off-policy, computed by hand (clip_ratio_high 0.28, off 0.6, dual clip 3)."""
    ratio = torch.tensor([[1.5, 1.5, 5.0, 0.5]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    exp = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    old = torch.zeros(1, 4)
    loss, metrics = exp_loss.compute_policy_loss_exp_on_off(
        old,
        ratio.log(),
        adv,
        mask,
        loss_agg_mode="token-sum",
        config=_config(),
        exp_mask=exp,
        off_cliprange_high=OFF_HIGH,
    )
    # on, A=1, r=1.5: -1.28 (upper clip); off, A=1, r=1.5: -1.5 (inside 1.6); off, A=-1, r=5: dual clip 3;
    # on, A=-1, r=0.5: max(0.5, 0.8) = 0.8 (lower clip)
    assert loss.item() == pytest.approx(-1.28 - 1.5 + 3.0 + 0.8, abs=1e-5)
    assert metrics["actor/exp_token_frac"] == 0.5
    assert metrics["actor/on_pg_loss"] == pytest.approx((-1.28 + 0.8) / 2, abs=1e-5)
    assert metrics["actor/off_pg_loss"] == pytest.approx((-1.5 + 3.0) / 2, abs=1e-5)
    assert (
        metrics["actor/off_pg_clipfrac"] == 0.0
    )  # 1.5 < 1.6 and 5 > 0.4: the off ratio clip never changed a loss
    assert metrics["actor/pg_clipfrac"] == 0.5  # tokens 1 and 4
    assert metrics["actor/pg_clipfrac_lower"] == 0.25  # token 3


# --- 2. no exp token == vanilla ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("how", ["zeros", "no_mask", "zeros_without_off_clip"])
def test_without_exp_tokens_it_is_vanilla_exactly(mode: str, weighted: bool, how: str) -> None:
    old, new, adv, mask, _, weights = _batch(7)
    weights = weights if weighted else None
    kwargs = {
        "zeros": {"exp_mask": torch.zeros_like(old), "off_cliprange_high": OFF_HIGH},
        "no_mask": {},
        "zeros_without_off_clip": {"exp_mask": torch.zeros_like(old)},
    }[how]
    config = _config(loss_agg_mode=mode)
    ours, our_metrics = exp_loss.compute_policy_loss_exp_on_off(
        old, new, adv, mask, loss_agg_mode=mode, config=config, rollout_is_weights=weights, **kwargs
    )
    vanilla, vanilla_metrics = core_algos.compute_policy_loss_vanilla(
        old, new, adv, mask, loss_agg_mode=mode, config=config, rollout_is_weights=weights
    )
    assert torch.equal(ours, vanilla)
    assert {key: our_metrics[key] for key in vanilla_metrics} == vanilla_metrics
    assert our_metrics["actor/exp_token_frac"] == 0.0 and our_metrics["actor/off_pg_loss"] == 0.0


def test_bad_inputs_are_named() -> None:
    old, new, adv, mask, exp, _ = _batch(3)
    config = _config()
    with pytest.raises(ValueError, match=r"exp_mask has shape \(6, 8\) but response_mask has \(6, 9\)"):
        exp_loss.compute_policy_loss_exp_on_off(
            old, new, adv, mask, config=config, exp_mask=exp[:, :8], off_cliprange_high=OFF_HIGH
        )
    with pytest.raises(ValueError, match="only 0 and 1"):
        exp_loss.compute_policy_loss_exp_on_off(
            old, new, adv, mask, config=config, exp_mask=exp * 0.5, off_cliprange_high=OFF_HIGH
        )
    with pytest.raises(
        ValueError, match=r"exp_manager\.off_cliprange_high.*meta_info\['exp_off_cliprange_high'\]"
    ):
        exp_loss.compute_policy_loss_exp_on_off(old, new, adv, mask, config=config, exp_mask=exp)
    with pytest.raises(ValueError, match="finite number >= 0"):
        exp_loss.compute_policy_loss_exp_on_off(
            old, new, adv, mask, config=config, exp_mask=exp, off_cliprange_high=-0.1
        )
    with pytest.raises(ValueError, match="needs the actor config"):
        exp_loss.compute_policy_loss_exp_on_off(
            old, new, adv, mask, exp_mask=exp, off_cliprange_high=OFF_HIGH
        )


# --- 3. registration ----------------------------------------------------------------------------------------


def test_import_verl_registers_the_loss() -> None:
    """The plugin registered it during ``import verl`` (verl's entry-point plugin loading)."""
    assert core_algos.get_policy_loss_fn("exp_on_off") is exp_loss.compute_policy_loss_exp_on_off
    exp_loss.register()  # idempotent
    assert core_algos.get_policy_loss_fn(exp_loss.LOSS_NAME) is exp_loss.compute_policy_loss_exp_on_off


# --- 4. the wrapper through verl's ppo_loss ---------------------------------------------------------------


PROMPT_LENS = [3, 2, 1, 3]
RESPONSE_LENS = [5, 4, 2, 1]
PROMPT_WIDTH, RESPONSE_WIDTH = 3, 5


def _actor_batch(exp_rows: list[int] | None, off_clip: float | None = OFF_HIGH, seed: int = 0):
    """The actor's training batch as verl's legacy trainer hands it to the engine: left-padded prompts,
    right-padded responses, ``DataProto.to_tensordict`` (``meta_info`` becomes non-tensor data) and
    ``left_right_2_no_padding``; plus the engine's non-tensor fields and a model output of per-position
    log-probs over the unpadded sequences. Returns (tensordict, model_output, padded current log-probs)."""
    g = torch.Generator().manual_seed(seed)
    bs = len(PROMPT_LENS)
    attention = torch.zeros(bs, PROMPT_WIDTH + RESPONSE_WIDTH, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        attention[i, PROMPT_WIDTH - p : PROMPT_WIDTH] = 1
        attention[i, PROMPT_WIDTH : PROMPT_WIDTH + r] = 1
    input_ids = torch.randint(1, 100, attention.shape, generator=g) * attention
    response_mask = attention[:, PROMPT_WIDTH:].float()
    old = -torch.rand(bs, RESPONSE_WIDTH, generator=g) * 2
    new = (old + torch.rand(bs, RESPONSE_WIDTH, generator=g) * 3 - 1.5) * response_mask
    tensors = {
        "prompts": input_ids[:, :PROMPT_WIDTH],
        "responses": input_ids[:, PROMPT_WIDTH:],
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "old_log_probs": old * response_mask,
        "advantages": torch.randn(bs, RESPONSE_WIDTH, generator=g) * response_mask,
    }
    meta = {}
    if exp_rows is not None:
        exp = torch.zeros(bs, RESPONSE_WIDTH)
        exp[exp_rows] = 1.0
        tensors["exp_mask"] = exp * response_mask
    if off_clip is not None:
        meta["exp_off_cliprange_high"] = off_clip
    data = left_right_2_no_padding(DataProto.from_single_dict(tensors, meta_info=meta).to_tensordict())
    tu.assign_non_tensor(
        data,
        global_batch_size=bs,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=2,
        batch_num_tokens=int(response_mask.sum()),
        dp_size=1,
    )
    # model output: log-prob of each sequence position; position prompt_len - 1 + j predicts response token j
    sequences = []
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        sequence = torch.zeros(p + r)
        sequence[p - 1 : p - 1 + r] = new[i, :r]
        sequences.append(sequence)
    return data, {"log_probs": torch.nested.as_nested_tensor(sequences, layout=torch.jagged)}, new


def _value(metric) -> float:
    return metric.aggregate() if hasattr(metric, "aggregate") else metric


def test_wrapper_gives_exp_tokens_the_off_clip_through_verls_ppo_loss() -> None:
    data, model_output, new = _actor_batch(exp_rows=[0, 2])
    config = _config()
    loss, metrics = exp_loss.exp_aware_ppo_loss(config, model_output, data)
    assert exp_loss.EXP_LOSS_INPUTS.get() is None  # published for the call only

    padded = data.select("old_log_probs", "advantages", "response_mask", "exp_mask").to_padded_tensor()
    mask = padded["response_mask"].bool()
    expected = _reference(
        padded["old_log_probs"], new, padded["advantages"], mask, padded["exp_mask"], "token-mean"
    )
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    on_only = _reference(
        padded["old_log_probs"],
        new,
        padded["advantages"],
        mask,
        torch.zeros_like(padded["exp_mask"]),
        "token-mean",
    )
    assert not torch.allclose(loss, on_only)  # the off clip changed something in this batch
    assert _value(metrics["actor/exp_token_frac"]) == pytest.approx(
        7 / 12
    )  # rows 0 and 2: 5 + 2 of 12 tokens
    assert _value(metrics["actor/pg_loss"]) == pytest.approx(loss.item())


def test_wrapper_over_the_engines_micro_batches_sums_to_the_batch_loss() -> None:
    """The engine splits the batch into micro-batches (non-tensor data carried along), sums their losses."""
    data, model_output, new = _actor_batch(exp_rows=[1, 3])
    config = _config()
    micro_batches, _ = prepare_micro_batches(data)
    assert len(micro_batches) == 2
    assert tu.get(micro_batches[1], "exp_off_cliprange_high") == OFF_HIGH
    total = 0.0
    for i, micro in enumerate(micro_batches):
        rows = slice(2 * i, 2 * i + 2)
        sequences = list(model_output["log_probs"].unbind())[rows]
        output = {"log_probs": torch.nested.as_nested_tensor(sequences, layout=torch.jagged)}
        total = total + exp_loss.exp_aware_ppo_loss(config, output, micro)[0]
    padded = data.select("old_log_probs", "advantages", "response_mask", "exp_mask").to_padded_tensor()
    expected = _reference(
        padded["old_log_probs"],
        new,
        padded["advantages"],
        padded["response_mask"].bool(),
        padded["exp_mask"],
        "token-mean",
    )
    torch.testing.assert_close(total, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("loss_mode", ["exp_on_off", "vanilla"])
@pytest.mark.parametrize("off_clip", [None, OFF_HIGH])
def test_wrapper_without_exp_mask_is_plain_ppo_loss(loss_mode: str, off_clip: float | None) -> None:
    data, model_output, _ = _actor_batch(exp_rows=None, off_clip=off_clip)
    ours, our_metrics = exp_loss.exp_aware_ppo_loss(_config(loss_mode), model_output, data.clone())
    theirs, their_metrics = ppo_loss(_config(loss_mode), model_output, data.clone())
    assert torch.equal(ours, theirs)
    for key, metric in their_metrics.items():
        assert _value(our_metrics[key]) == _value(metric), key
    # and with loss_mode exp_on_off but no exp_mask, the wrapper gives verl's vanilla loss
    vanilla, _ = ppo_loss(_config("vanilla"), model_output, data.clone())
    assert torch.equal(
        exp_loss.exp_aware_ppo_loss(_config("exp_on_off"), model_output, data.clone())[0], vanilla
    )


def test_wrapper_accepts_a_nested_exp_mask_and_rejects_a_wrong_shape() -> None:
    data, model_output, _ = _actor_batch(exp_rows=[0, 2])
    padded_loss, _ = exp_loss.exp_aware_ppo_loss(_config(), model_output, data.clone())
    nested = data.clone()
    lengths = torch.tensor(RESPONSE_LENS)
    response_nested = torch.nested.as_nested_tensor(
        [nested["response_mask"][i, :n] for i, n in enumerate(RESPONSE_LENS)], layout=torch.jagged
    )
    assert torch.equal(response_nested.offsets().diff(), lengths)
    nested["exp_mask"] = response_to_nested(nested["exp_mask"], response_nested)
    assert nested["exp_mask"].is_nested
    nested["response_mask"] = response_nested
    nested_loss, _ = exp_loss.exp_aware_ppo_loss(_config(), model_output, nested)
    torch.testing.assert_close(nested_loss, padded_loss)

    wrong = data.clone()
    wrong["exp_mask"] = torch.zeros(len(RESPONSE_LENS), RESPONSE_WIDTH + 1)
    with pytest.raises(
        ValueError,
        match=r"'exp_mask' in the training batch has shape \(4, 6\) but 'response_mask' "
        r"has \(4, 5\)",
    ):
        exp_loss.exp_aware_ppo_loss(_config(), model_output, wrong)
    assert exp_loss.EXP_LOSS_INPUTS.get() is None


def test_wrapper_without_the_off_clip_names_the_config_key() -> None:
    data, model_output, _ = _actor_batch(exp_rows=[0], off_clip=None)
    with pytest.raises(ValueError, match=r"exp_manager\.off_cliprange_high"):
        exp_loss.exp_aware_ppo_loss(_config(), model_output, data)
    assert exp_loss.EXP_LOSS_INPUTS.get() is None  # reset on error too


def test_wrapper_warns_once_when_the_loss_mode_ignores_exp_mask(monkeypatch, caplog) -> None:
    monkeypatch.setattr(exp_loss, "_warned_unused", False)
    data, model_output, _ = _actor_batch(exp_rows=[0])
    with caplog.at_level("WARNING", logger=exp_loss.__name__):
        exp_loss.exp_aware_ppo_loss(_config("vanilla"), model_output, data.clone())
        exp_loss.exp_aware_ppo_loss(_config("vanilla"), model_output, data.clone())
    warnings = [r for r in caplog.records if "policy_loss.loss_mode is 'vanilla'" in r.getMessage()]
    assert len(warnings) == 1


# --- 5. how the actor gets the loss: verl's set_loss_fn, no patch ------------------------------------------


def test_the_loss_reaches_the_actor_through_set_loss_fn_without_a_patch() -> None:
    """A fresh interpreter: verl's actor module keeps its own ``ppo_loss`` (nothing is rebound), the worker
    has the public seam, and the loss function the trainer hands over pickles (Ray ships it to workers)."""
    script = textwrap.dedent("""
        import inspect, pickle
        from functools import partial
        import verl.workers.engine_workers as engine_workers
        from verl.workers.utils.losses import ppo_loss
        from agentevolver.verl.step.exp_loss import exp_aware_ppo_loss
        assert engine_workers.ppo_loss is ppo_loss, engine_workers.ppo_loss
        assert "set_loss_fn" in vars(engine_workers.ActorRolloutRefWorker)
        assert tuple(inspect.signature(engine_workers.ActorRolloutRefWorker.set_loss_fn).parameters) == (
            "self", "loss_fn")
        fn = pickle.loads(pickle.dumps(partial(exp_aware_ppo_loss, {"policy_loss": {}})))
        assert fn.func is exp_aware_ppo_loss
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
