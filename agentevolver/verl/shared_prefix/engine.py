"""verl's FSDP LM-head engine, computing each GRPO group's shared prompt once when the micro-batch asks.

verl 0.9.1 carries the switch ``actor_rollout_ref.actor.use_prefix_grouper`` ("enable PrefixGrouper-based
shared-prefix forward") and, when it is on, balances batches by whole ``uid`` groups and keeps each group's
rows together (``RayPPOTrainer._balance_batch``); but its engine workers never take a shared forward. This
engine does, through the seams verl's own ``forward_step`` calls: ``prepare_model_inputs`` lays the
micro-batch out as grouped rows with a block mask (:mod:`agentevolver.verl.shared_prefix.layout`) and
``prepare_model_outputs`` turns the rows' logits back into verl's per-sample nested ``log_probs`` /
``entropy`` (the values ``no_padding_2_padding`` reads: the positions predicting the response tokens; the
prompt positions hold zeros). Autocast, the loss call and the output packing stay verl's. What this relies on
in verl (the three methods' signatures, ``forward_step`` calling the other two, the engine attributes read here,
the nested layout ``no_padding_2_padding`` reads) is seam 6 of :mod:`agentevolver.verl.patches`, checked on the
driver before a run starts.

A micro-batch takes the shared forward when its non-tensor data carries ``use_prefix_grouper=True`` (the
trainer puts it in the batch's ``meta_info`` for the old-log-prob, reference and update passes, as verl does
for ``calculate_entropy``), at least two of its samples have identical prompts, and nothing asks for what the
grouped rows cannot give (fused kernels, top-k distillation, sum of squared probabilities, Ulysses sequence
parallelism, multi-axis positions, multimodal inputs); otherwise verl's own path runs unchanged. Samples are
grouped by identical prompt tokens and positions, whatever their ``uid``: that equality is what makes the
shared forward exact.

The class is built on first use (:func:`engine_class`): verl's engine module runs this project's plugin hook
when it is imported (the hook registers the CPU engines, this one among them), so a module-level import of it
here would import this module again half-initialised whenever this module is imported first.
"""

from __future__ import annotations

import logging

import torch
from tensordict import TensorDict
from torch.distributed.tensor import DTensor
from verl.utils import tensordict_utils as tu

from agentevolver.verl.shared_prefix.layout import (
    SWITCH,
    SharedPrefixPlan,
    check_attention,
    model_inputs,
    plan_groups,
    response_outputs,
)

__all__ = ["SWITCH", "TOKEN_SHARE", "SharedPromptMixin", "engine_class", "sharing_plan"]

logger = logging.getLogger(__name__)

#: Micro-batch options the grouped rows cannot serve; any of them set keeps verl's own forward.
_UNSUPPORTED_OPTIONS = ("use_fused_kernels", "distillation_use_topk", "distillation_only", "calculate_sum_pi_squared")
_PLAN = "shared_prompt_plan"
#: Update metric (``actor/`` prefixed by verl): the micro-batches' forwarded tokens over the unshared count.
TOKEN_SHARE = "shared_prompt_token_ratio"
_logged = False


def sharing_plan(micro_batch: TensorDict, pad_token_id: int = 0) -> SharedPrefixPlan | None:
    """The grouped layout of a verl micro-batch (nested ``input_ids``/``position_ids``, padded ``prompts`` and
    ``attention_mask``), or None when no two samples share a prompt or the batch is not one this layout takes."""
    from verl.utils.model import extract_multi_modal_inputs

    input_ids, position_ids = micro_batch["input_ids"], micro_batch["position_ids"]
    if not input_ids.is_nested or position_ids.dim() != 2:
        return None
    if extract_multi_modal_inputs(micro_batch.get("multi_modal_inputs", [])):  # text rows carry empty dicts
        return None
    prompts = micro_batch["prompts"]
    if prompts.is_nested:
        prompt_lens = prompts.offsets().diff().tolist()
    else:  # as no_padding_2_padding counts them
        prompt_lens = micro_batch["attention_mask"][:, : prompts.shape[1]].sum(dim=1).tolist()
    plan = plan_groups(list(input_ids.unbind()), prompt_lens, list(position_ids.unbind()), pad_token_id=pad_token_id)
    return plan if len(plan.groups) < plan.num_samples else None


def _nested_like(values: torch.Tensor, plan: SharedPrefixPlan, input_ids: torch.Tensor) -> torch.Tensor:
    """(B, R) response values -> verl's per-sample nested tensor over prompt + response: value j of sample b at
    position prompt_len - 1 + j (the position whose logits predict response token j), zeros elsewhere."""
    offsets = input_ids.offsets().to(values.device)
    lengths = offsets.diff()
    prompt_lens = lengths - plan.response_lens.to(values.device)
    _, valid = plan.response_index()
    columns = torch.arange(values.shape[1], device=values.device)
    flat = (offsets[:-1] + prompt_lens - 1).unsqueeze(1) + columns.unsqueeze(0)
    out = values.new_zeros(int(offsets[-1])).index_put((flat[valid],), values[valid])
    return torch.nested.nested_tensor_from_jagged(out, offsets)


class SharedPromptMixin:
    """The overrides of ``FSDPEngineWithLMHead`` (combined with it by :func:`engine_class`): micro-batches with
    ``use_prefix_grouper`` compute shared prompts once, every other call goes to verl's methods."""

    #: Token ratio of the micro-batch being stepped (None: verl's own forward ran).
    _shared_tokens: float | None = None

    def _shares(self, micro_batch: TensorDict) -> bool:
        if not tu.get_non_tensor_data(data=micro_batch, key=SWITCH, default=False):
            return False
        if self.use_ulysses_sp or any(tu.get_non_tensor_data(data=micro_batch, key=key, default=False)
                                      for key in _UNSUPPORTED_OPTIONS):
            return False
        check_attention(getattr(self.module.config, "_attn_implementation", None) or "eager")
        return True

    def forward_step(self, micro_batch: TensorDict, loss_function, forward_only):
        """verl's step, plus the update's metric :data:`TOKEN_SHARE` (tokens forwarded / tokens the unshared
        pass would forward: 1.0 where nothing was shared), so a run shows that its prompts were shared."""
        self._shared_tokens = None
        loss, output = super().forward_step(micro_batch, loss_function, forward_only)
        metrics = output.get("metrics") if isinstance(output, dict) else None
        if loss_function is not None and isinstance(metrics, dict):
            metrics[TOKEN_SHARE] = self._shared_tokens if self._shared_tokens is not None else 1.0
        return loss, output

    def prepare_model_inputs(self, micro_batch: TensorDict):
        plan = sharing_plan(micro_batch, tu.get_non_tensor_data(data=micro_batch, key="pad_token_id", default=0)) \
            if self._shares(micro_batch) else None
        if plan is None:
            return super().prepare_model_inputs(micro_batch)
        unshared = int(micro_batch["input_ids"].offsets()[-1])
        self._shared_tokens = plan.tokens / max(unshared, 1)
        global _logged
        if not _logged:
            _logged = True
            logger.info("shared prompts: %d samples in %d rows, %d tokens instead of %d (first such micro-batch "
                        "of this process)", plan.num_samples, len(plan.groups), plan.tokens, unshared)
        return model_inputs(self.module, plan), {_PLAN: plan}

    def prepare_model_outputs(self, output, output_args, micro_batch: TensorDict, logits_processor_func):
        plan = output_args.get(_PLAN)
        if plan is None:
            return super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
        calculate_entropy = tu.get_non_tensor_data(data=micro_batch, key="calculate_entropy", default=False)
        logits = output.logits
        if isinstance(logits, DTensor):
            logits = logits.full_tensor()
        log_probs, entropy = response_outputs(logits, plan, micro_batch["temperature"], calculate_entropy,
                                              self._entropy)
        model_output = {"log_probs": _nested_like(log_probs, plan, micro_batch["input_ids"])}
        if calculate_entropy:
            model_output["entropy"] = _nested_like(entropy, plan, micro_batch["input_ids"])
        return model_output

    def _entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """Entropy per position with the engine's own settings (chunking, compile, checkpointing)."""
        flat = logits.reshape(-1, logits.shape[-1])
        config = self.engine_config
        if config.entropy_from_logits_with_chunking:
            def compute(x):
                return self.compute_entropy_from_logits(x, chunk_size=config.entropy_from_logits_chunk_size)
        else:
            compute = self.compute_entropy_from_logits
        values = torch.utils.checkpoint.checkpoint(compute, flat) if config.entropy_checkpointing else compute(flat)
        return values.view(logits.shape[:-1])


_engine_class: type | None = None


def engine_class() -> type:
    """``SharedPromptFSDPEngine``: :class:`SharedPromptMixin` over verl's ``FSDPEngineWithLMHead`` (built once)."""
    global _engine_class
    if _engine_class is None:
        from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

        if _engine_class is None:  # the import may have run the plugin hook, which builds it through this function
            _engine_class = type("SharedPromptFSDPEngine", (SharedPromptMixin, FSDPEngineWithLMHead),
                                 {"__module__": __name__, "__doc__": SharedPromptMixin.__doc__})
    return _engine_class
