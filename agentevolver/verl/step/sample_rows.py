"""Multi-sample episodes as training rows: every generated token is trained once.

``linear_think``, ``memory`` and ``self_clip`` rewrite the context during an episode, so one episode yields
several samples (one per context; the last is the *final* sample). verl's agent loop returns one row per
episode, which carries the final sample's tensors; the agent loop puts the earlier samples' token lists in
``non_tensor_batch["other_samples"]`` (:func:`agentevolver.verl.agent_loop.to_agent_loop_output`).

Right after the rollout (stage ``sample_rows``), :func:`expand_sample_rows` appends one row per earlier sample,
so the log-prob passes run once over every row; the advantages are computed on the episode rows alone
(:func:`episode_rows`), so **each episode counts once in its GRPO group**, and :func:`spread_advantages` then
gives each added row its episode's:

* tokens laid out exactly as verl's agent loop lays out a row (prompt left-padded to
  ``rollout.prompt_length``, response right-padded to ``rollout.response_length``, positions from the
  attention mask);
* **advantage = the episode's**, broadcast: for an outcome-level estimator (GRPO and kin) the episode's
  scalar (read from the final sample's policy tokens) on every policy token of the earlier sample; for a
  sample labelled by ADCA, the episode's per-step advantage (``non_tensor_batch["step_advantages"]``) through
  the sample's own step ids, exactly as the final sample gets it;
* ``rollout_log_probs`` are the sample's own; ``old_log_probs`` (the rollout's in bypass mode) and
  ``ref_log_prob`` come from the step's log-prob passes over all rows, as the episode rows' do;
* per-sample ``exp_mask`` and ``step_ids``; every other column, and every tensor that is not per token
  (verl's ``dummy_tensor``), is copied from the episode's row.

The batch is then padded with fully masked rows (no token trained) to a whole number of PPO mini-batches
(``ppo_mini_batch_size * rollout.n`` rows, as for the episodes; an episode with k samples adds k - 1 rows,
so a step with earlier samples makes more optimizer steps, like the reference, which trains every sample as
a row). A response-shaped tensor this module does not know how to fill for an added row (e.g. a critic's
``values``) is an error naming it, never a silent zero: such combinations are refused at start-up
(:func:`refusal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agentevolver.config.estimators import in_family, members
from agentevolver.verl.shared_prefix.layout import SWITCH as SHARED_PROMPTS

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["OTHER_SAMPLES", "SAMPLE_PARENT", "SAMPLE_ROLE", "SHARED_PROMPTS", "add_sample_rows", "balance", "episode_rows", "expand_sample_rows", "minibatch_rows",
           "refusal", "spread_advantages"]

#: The agent loop's column with each episode's earlier samples (a list of token-field dicts per row).
OTHER_SAMPLES = "other_samples"
#: Added column: "final" for an episode's own row, "earlier" for an added sample, "pad" for padding.
SAMPLE_ROLE = "sample_role"
#: Added column: the index of each row's episode row (its own index for an episode row; 0 for padding).
SAMPLE_PARENT = "sample_parent"

#: Response-shaped columns filled here for an added row; anything else response-shaped is refused.
_ZERO_FILLED = ("token_level_scores", "token_level_rewards", "rm_scores")
_KNOWN = frozenset({"prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids",
                    "rollout_log_probs", "old_log_probs", "ref_log_prob", "advantages", "returns", *_ZERO_FILLED})


def balance(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``balance``: verl's batch balancing (``trainer.balance_batch``) reorders the episode rows so every
    data-parallel rank gets a like share of tokens (GRPO groups stay together when shared prompts are on)."""
    if trainer.config.trainer.balance_batch:
        trainer._balance_batch(state.batch, metrics=state.metrics)
        state.batch = state.batch  # reordered in place: the episode view is derived again
    return state


def add_sample_rows(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``sample_rows``: the earlier samples of multi-sample episodes become rows of their own, padded to
    whole mini-batches (:func:`expand_sample_rows`); the episodes stay the first ``episode_count`` rows.

    The rows are laid out here for the log-prob passes and the update, so this stage also asks the
    actor/reference engines to compute each GRPO group's prompt once (verl's switch
    ``actor_rollout_ref.actor.use_prefix_grouper``, read by verl's ``_balance_batch`` to keep groups together,
    travels to the workers in ``meta_info``, which verl turns into every micro-batch's non-tensor data; the
    engine, :mod:`agentevolver.verl.shared_prefix.engine`, then groups samples whose prompt tokens are
    identical). Off, the key is absent and verl's own forward runs.
    """
    config = trainer.config
    state.episode_count = len(state.batch)
    rows, metrics = expand_sample_rows(
        state.batch, pad_token_id=_pad_id(trainer.tokenizer),
        rows_per_minibatch=minibatch_rows(config.actor_rollout_ref.actor.ppo_mini_batch_size,
                                          config.actor_rollout_ref.rollout.n),
        bypass=trainer.bypass)
    state.metrics.update(metrics)
    if getattr(trainer, "use_prefix_grouper", False):
        rows.meta_info[SHARED_PROMPTS] = True
    state.batch = rows
    return state


def _pad_id(tokenizer: Any) -> int:
    for value in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if value is not None:
            return int(value)
    return 0


def refusal(*, multi_sample: bool, adv_estimator: str, use_critic: bool, distillation: bool) -> str | None:
    """Why this run cannot train every sample of its episodes (None = it can); checked at start-up."""
    if not multi_sample:
        return None
    if use_critic:
        return ("a multi-sample context manager (agent_flow.context_template) cannot be trained with a "
                "critic: the added samples have no values; use a critic-free estimator (algorithm.adv_estimator="
                "grpo) or the linear context manager")
    if not in_family(adv_estimator, "outcome"):  # one number per episode, so it can be broadcast
        return (f"a multi-sample context manager trains each earlier sample with its episode's advantage, which "
                f"needs an outcome-level estimator ({', '.join(sorted(members('outcome')))}); "
                f"algorithm.adv_estimator={adv_estimator!r} gives per-token advantages")
    if distillation:
        return "a multi-sample context manager cannot be combined with distillation (no teacher outputs per sample)"
    return None


def _left_pad(rows: Sequence[Sequence[int]], width: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"an earlier sample's prompt has {len(row)} tokens, over rollout.prompt_length={width}")
        if row:
            ids[i, width - len(row):] = torch.as_tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
    return ids, mask


def _right_pad(rows: Sequence[Sequence[float]], width: int, pad: float, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), pad, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(
                f"an earlier sample's response has {len(row)} tokens, over rollout.response_length={width}")
        if row:
            out[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
    return out


def _episode_scalar(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) the advantage on each row's policy tokens (constant for outcome-level estimators); 0 without any."""
    mask = mask.to(advantages.dtype)
    count = mask.sum(-1)
    return torch.where(count > 0, (advantages * mask).sum(-1) / count.clamp_min(1), torch.zeros_like(count))


def _sample_advantages(parent: int, step_ids: torch.Tensor, mask: torch.Tensor, scalar: torch.Tensor,
                       step_table: Sequence[Any] | None) -> torch.Tensor:
    table = step_table[parent] if step_table is not None else None
    if table is None:
        return scalar[parent] * mask
    values = torch.as_tensor([*map(float, table), 0.0], dtype=torch.float32)  # index -1 -> the trailing 0
    ids = step_ids.clamp(max=len(values) - 2) if len(values) > 1 else torch.full_like(step_ids, -1)
    return values[ids] * mask


def expand_sample_rows(
    batch: Any,
    *,
    pad_token_id: int,
    rows_per_minibatch: int,
    bypass: bool,
) -> tuple[Any, dict[str, float]]:
    """The batch with one row per sample (see the module docstring) and ``train/*`` counts.

    The episode rows stay first, in their order (rows ``0 .. len(batch) - 1``), so the advantage stage finds
    them there; ``sample_parent`` names each row's episode row. A batch without earlier samples comes back
    as the same rows, apart from the two columns and the padding.
    """
    from verl import DataProto

    # A shallow copy: the caller's batch (episode rows) keeps its columns.
    meta = {key: value for key, value in batch.meta_info.items() if key != "global_token_num"}
    batch = DataProto(batch=batch.batch, non_tensor_batch=dict(batch.non_tensor_batch), meta_info=meta)
    others = batch.non_tensor_batch.pop(OTHER_SAMPLES, None)
    size = len(batch)
    parents: list[int] = []
    samples: list[dict[str, Any]] = []
    if others is not None:
        for index, entry in enumerate(others):
            for sample in entry or ():
                parents.append(index)
                samples.append(sample)
    batch.non_tensor_batch[SAMPLE_ROLE] = np.array(["final"] * size, dtype=object)
    batch.non_tensor_batch[SAMPLE_PARENT] = np.arange(size, dtype=np.int64)
    metrics = {"train/episode_rows": float(size), "train/earlier_sample_rows": float(len(samples))}
    if samples:
        batch = DataProto.concat([batch, _earlier_rows(batch, parents, samples, pad_token_id, bypass, meta)])
    pad = (-len(batch)) % max(int(rows_per_minibatch), 1)
    if pad:
        padding = batch.select_idxs(np.zeros(pad, dtype=np.int64))
        padding.batch["response_mask"] = torch.zeros_like(padding.batch["response_mask"])
        padding.non_tensor_batch[SAMPLE_ROLE] = np.array(["pad"] * pad, dtype=object)
        if "exp_mask" in padding.non_tensor_batch:
            padding.non_tensor_batch["exp_mask"] = np.array([False] * pad, dtype=object)
        batch = DataProto.concat([batch, padding])
    metrics["train/pad_rows"] = float(pad)
    metrics["train/rows"] = float(len(batch))
    if "attention_mask" in batch.batch:
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
    return batch, metrics


def _earlier_rows(batch: Any, parents: list[int], samples: list[dict[str, Any]], pad_token_id: int, bypass: bool,
                  meta: dict[str, Any]) -> Any:
    """One row per earlier sample, laid out as verl's agent loop lays out an episode's row."""
    from verl import DataProto

    tensors = batch.batch
    prompt_width = tensors["prompts"].shape[1]
    response_width = tensors["responses"].shape[1]
    others_keys = [key for key in tensors.keys() if key not in _KNOWN and key != "exp_mask"]  # noqa: SIM118
    per_token = sorted(key for key in others_keys if tensors[key].dim() >= 2
                       and tensors[key].shape[1] in (response_width, prompt_width + response_width))
    if per_token:
        raise ValueError(f"cannot add rows for earlier samples: the batch has {per_token}, which this trainer does "
                         "not know how to fill for them (see agentevolver/verl/step/sample_rows.py)")
    per_row = {key: tensors[key][torch.as_tensor(parents)] for key in others_keys}  # e.g. verl's dummy_tensor
    prompts, prompt_mask = _left_pad([s["prompt_ids"] for s in samples], prompt_width, pad_token_id)
    responses = _right_pad([s["response_ids"] for s in samples], response_width, pad_token_id, torch.long)
    response_attention = _right_pad([[1] * len(s["response_ids"]) for s in samples], response_width, 0, torch.long)
    response_mask = _right_pad([s["response_mask"] for s in samples], response_width, 0, torch.long)
    response_mask = response_mask * response_attention
    attention_mask = torch.cat([prompt_mask, response_attention], dim=1)
    step_ids = _right_pad([s["step_ids"] for s in samples], response_width, -1, torch.long)
    added: dict[str, torch.Tensor] = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask.to(tensors["response_mask"].dtype),
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
    }
    if tensors["position_ids"].dim() != 2:
        raise ValueError("earlier samples of multi-modal (3-D position ids) episodes cannot be added as rows")
    if "rollout_log_probs" in tensors:
        missing = [i for i, s in enumerate(samples) if s.get("response_logprobs") is None]
        if missing and bypass:
            raise ValueError("bypass mode trains against the rollout's log-probs, but an earlier sample has none")
        added["rollout_log_probs"] = _right_pad(
            [s.get("response_logprobs") or [0.0] * len(s["response_ids"]) for s in samples], response_width,
            0.0, tensors["rollout_log_probs"].dtype)
    added.update(per_row)
    for key in _ZERO_FILLED:
        if key in tensors:
            added[key] = torch.zeros((len(samples), response_width), dtype=tensors[key].dtype)
    non_tensor = {key: values[parents] for key, values in batch.non_tensor_batch.items()}
    non_tensor[SAMPLE_ROLE] = np.array(["earlier"] * len(samples), dtype=object)
    non_tensor[SAMPLE_PARENT] = np.asarray(parents, dtype=np.int64)
    if "exp_mask" in non_tensor:
        non_tensor["exp_mask"] = np.array([bool(s.get("exp_mask", False)) for s in samples], dtype=object)
    if "step_ids" in non_tensor:
        column = np.empty(len(samples), dtype=object)
        column[:] = [row.numpy().astype(np.int32) for row in step_ids]  # the agent loop's padded rows
        non_tensor["step_ids"] = column
    missing_keys = sorted(set(tensors.keys()) - set(added.keys()) - {"exp_mask"})
    if missing_keys:
        raise ValueError(f"earlier-sample rows lack {missing_keys}")
    return DataProto.from_dict(tensors=added, non_tensors=non_tensor, meta_info=dict(meta))


def episode_rows(rows: Any, episodes: int) -> Any:
    """The first ``episodes`` rows of ``rows`` (the episodes'): ``rows`` itself when it has no other rows."""
    return rows if len(rows) == episodes else rows.select_idxs(np.arange(episodes, dtype=np.int64))


def spread_advantages(rows: Any, episodes: Any) -> dict[str, float]:
    """Give every row its episode's advantage, once the advantage stage has computed the episodes' (``episodes``
    = the first rows of ``rows``, from :func:`episode_rows`): the episode rows take theirs; an earlier sample
    its episode's (the scalar, or ADCA's step advantages through its own step ids); padding 0."""
    count = len(episodes)
    advantages = episodes.batch["advantages"]
    if len(rows) == count:  # no earlier-sample rows: nothing to spread
        return {}
    role = rows.non_tensor_batch[SAMPLE_ROLE]
    parent = np.asarray(rows.non_tensor_batch[SAMPLE_PARENT], dtype=np.int64)
    mask_f = rows.batch["response_mask"].to(torch.float32)
    scalar = _episode_scalar(advantages.to(torch.float32), episodes.batch["response_mask"])
    step_table = episodes.non_tensor_batch.get("step_advantages")
    step_ids = rows.non_tensor_batch.get("step_ids")
    no_steps = torch.zeros(mask_f.shape[1], dtype=torch.long)  # read only through an ADCA step table
    full = torch.zeros_like(mask_f)
    full[:count] = advantages.to(torch.float32)
    earlier = np.flatnonzero(role == "earlier")
    for row in earlier:
        ids = torch.as_tensor(np.asarray(step_ids[row], dtype=np.int64)) if step_ids is not None else no_steps
        full[row] = _sample_advantages(int(parent[row]), ids, mask_f[row], scalar, step_table)
    policy = mask_f[earlier] > 0 if earlier.size else torch.zeros(0, dtype=torch.bool)
    metrics = {"train/earlier_sample_policy_tokens": float(policy.sum())}
    metrics["train/earlier_sample_adv_abs_mean"] = float(full[earlier][policy].abs().mean()) if policy.any() else 0.0
    rows.batch["advantages"] = full.to(advantages.dtype)
    if "returns" in episodes.batch:
        rows.batch["returns"] = full.clone().to(episodes.batch["returns"].dtype)
    for key in ("token_level_scores", "token_level_rewards"):
        if key in episodes.batch:
            column = torch.zeros_like(full, dtype=episodes.batch[key].dtype)
            column[:count] = episodes.batch[key]
            rows.batch[key] = column
    return metrics


def minibatch_rows(ppo_mini_batch_size: int, rollout_n: int) -> int:
    """Rows per PPO mini-batch in verl's legacy trainer: ``ppo_mini_batch_size`` prompts x ``rollout.n``."""
    return int(ppo_mini_batch_size) * int(rollout_n)

