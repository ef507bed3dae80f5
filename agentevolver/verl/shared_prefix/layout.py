"""Shared-prompt forward for GRPO groups: each group's prompt is computed once, its responses attend to it.

The ``rollout.n`` samples of a GRPO group share one prompt, yet the unshared update runs that prompt through
the model once per sample. Here a group becomes one row of the batch::

    [ prompt[:-1] | prompt[-1], response_1 | prompt[-1], response_2 | ... | prompt[-1], response_n ]
      prefix        segment 1                segment 2                       segment n

with a block attention mask: a prefix token attends to the prefix causally, a segment token to the whole
prefix and causally to its own segment, never to another segment. Position ids continue the prompt in every
segment. Every token therefore sees exactly the context it has in its own unshared sequence, so the logits
(and, through autograd, the gradients: the prefix's keys and values receive the sum of all segments'
gradients) equal the unshared ones up to floating-point summation order. The last prompt token is repeated
in each segment (one token per sample) so that the logit predicting each sample's first response token sits
inside that sample's segment.

Rows share a prefix only when their prompt tokens and prompt positions are identical (and, when group ids
are given, their group ids too); a row whose prompt is unique, e.g. a later sample of a multi-sample
episode, becomes a group of one, i.e. the ordinary causal sequence. Sharing is decided per call, so it only
pays off when the caller's micro-batch holds whole groups.

The mask is an explicit 4-D attention mask (boolean for ``sdpa``, additive for ``eager``), which
transformers passes to the attention kernel unchanged; ``flash_attention_*`` cannot take one, so a model
using it is refused (:func:`check_attention`). The same code runs on CPU and CUDA.

Entry points: :func:`plan_groups` (the layout), :func:`shared_forward` (log-probs/entropy per response token
from a plan), :func:`response_logprobs` (a padded verl-style batch, shared or unshared, for tests and
benchmarks).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "SUPPORTED_ATTENTION",
    "SWITCH",
    "SharedPrefixPlan",
    "check_attention",
    "model_inputs",
    "plan_groups",
    "response_logprobs",
    "response_outputs",
    "sequences_from_padded",
    "shared_forward",
    "unshared_forward",
]

#: Attention implementations that accept an explicit 4-D mask (transformers passes it through unchanged).
#: The switch of shared prompts, named after verl's actor config key ``actor_rollout_ref.actor.use_prefix_grouper``
#: (which verl's batch balancing reads too); the trainer puts the same name in a pass's ``meta_info``, which
#: reaches the engine as a micro-batch key.
SWITCH = "use_prefix_grouper"
SUPPORTED_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class SharedPrefixPlan:
    """Where every sample's tokens sit in the grouped rows, and the mask between them.

    ``input_ids``/``position_ids``: (G, L) rows, right-padded; ``segment``: (G, L) 0 for a prefix token,
    s + 1 for a token of the row's s-th sample, -1 for padding; ``groups``: the sample indices of each row;
    ``starts``: (B,) flat index (row * L + column) of each sample's repeated last prompt token, the position
    whose logits predict its first response token; ``response_lens``: (B,) response tokens per sample.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment: torch.Tensor
    groups: tuple[tuple[int, ...], ...]
    starts: torch.Tensor
    response_lens: torch.Tensor

    @property
    def num_samples(self) -> int:
        return int(self.response_lens.numel())

    @property
    def tokens(self) -> int:
        """Tokens the model computes for this plan (padding excluded)."""
        return int((self.segment >= 0).sum())

    @property
    def first_segment_column(self) -> int:
        """Smallest column of any segment: logits left of it are never read."""
        columns = self.starts % self.input_ids.shape[1]
        return int(columns.min()) if columns.numel() else 0

    def attention_mask(self, implementation: str = "sdpa", dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(G, 1, L, L) mask: query i sees key j iff j <= i, j is real and j is prefix or in i's segment.

        Padding queries see themselves only (a fully masked row would turn softmax into NaN in the unused
        outputs and their gradients). ``sdpa`` takes it as booleans, ``eager`` as an additive float mask.
        """
        check_attention(implementation)
        seg = self.segment
        length = seg.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=seg.device).tril()
        query, key = seg.unsqueeze(2), seg.unsqueeze(1)
        allowed = causal & (key >= 0) & ((key == 0) | (key == query))
        allowed |= torch.eye(length, dtype=torch.bool, device=seg.device)
        allowed = allowed.unsqueeze(1)
        if implementation == "sdpa":
            return allowed
        mask = torch.zeros(allowed.shape, dtype=dtype, device=seg.device)
        return mask.masked_fill(~allowed, torch.finfo(dtype).min)

    def sample_index(self) -> torch.Tensor:
        """(G, L) the sample each column belongs to (-1 for prefix and padding)."""
        owner = torch.full_like(self.segment, -1)
        for g, members in enumerate(self.groups):
            lookup = torch.tensor([-1, *members], dtype=torch.long, device=self.segment.device)
            owner[g] = lookup[self.segment[g].clamp(min=0)]
        return owner

    def response_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R) flat indices of the logits predicting each response token, and which of them are real."""
        width = int(self.response_lens.max()) if self.num_samples else 0
        offsets = torch.arange(width, device=self.starts.device)
        valid = offsets.unsqueeze(0) < self.response_lens.unsqueeze(1)
        index = self.starts.unsqueeze(1) + offsets.unsqueeze(0)
        return index.where(valid, torch.zeros_like(index)), valid


def check_attention(implementation: str) -> None:
    """Refuse an attention implementation that cannot take the block mask."""
    if implementation not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"shared-prompt training needs an attention implementation that takes a 4-D mask "
            f"({', '.join(SUPPORTED_ATTENTION)}); the model uses {implementation!r}: set "
            f"actor_rollout_ref.model.override_config.attn_implementation=sdpa or turn shared prompts off"
        )


def plan_groups(
    sequences: Sequence[torch.Tensor],
    prompt_lens: Sequence[int],
    position_ids: Sequence[torch.Tensor] | None = None,
    group_keys: Sequence[Hashable] | None = None,
    pad_token_id: int = 0,
) -> SharedPrefixPlan:
    """Group samples whose prompts are identical and lay each group out as one row.

    ``sequences[b]``: the sample's real tokens (prompt then response, no padding); ``prompt_lens[b]`` >= 1:
    how many of them are prompt; ``position_ids[b]``: their positions (default 0, 1, ...). Samples are
    grouped when prompt tokens, prompt positions and ``group_keys`` (when given) are all equal.
    """
    count = len(sequences)
    if len(prompt_lens) != count:
        raise ValueError(f"{count} sequences but {len(prompt_lens)} prompt lengths")
    if position_ids is None:
        position_ids = [torch.arange(len(seq), device=seq.device) for seq in sequences]
    if position_ids and position_ids[0].dim() != 1:
        raise ValueError("shared prompts need 1-D position ids per sample (multi-axis rope is not supported)")

    keyed: dict[Hashable, list[int]] = {}
    for b in range(count):
        prompt_len = int(prompt_lens[b])
        if not 1 <= prompt_len <= len(sequences[b]):
            raise ValueError(f"sample {b}: prompt length {prompt_len} outside 1..{len(sequences[b])}")
        key = (
            None if group_keys is None else group_keys[b],
            tuple(sequences[b][:prompt_len].tolist()),
            tuple(position_ids[b][:prompt_len].tolist()),
        )
        keyed.setdefault(key, []).append(b)
    groups = tuple(tuple(members) for members in keyed.values())

    rows_ids, rows_pos, rows_seg = [], [], []
    starts = [0] * count
    lengths = []
    for members in groups:
        first = members[0]
        prefix_len = int(prompt_lens[first]) - 1
        ids = [sequences[first][:prefix_len]]
        pos = [position_ids[first][:prefix_len]]
        seg = [torch.zeros(prefix_len, dtype=torch.long)]
        cursor = prefix_len
        for s, b in enumerate(members):
            part = slice(prefix_len, None)
            ids.append(sequences[b][part])
            pos.append(position_ids[b][part])
            seg.append(torch.full((len(sequences[b]) - prefix_len,), s + 1, dtype=torch.long))
            starts[b] = cursor
            cursor += len(sequences[b]) - prefix_len
        rows_ids.append(torch.cat(ids))
        rows_pos.append(torch.cat(pos))
        rows_seg.append(torch.cat(seg))
        lengths.append(cursor)

    device = sequences[0].device if count else torch.device("cpu")
    length = max(lengths, default=0)
    input_ids = torch.full((len(groups), length), pad_token_id, dtype=torch.long, device=device)
    positions = torch.zeros((len(groups), length), dtype=torch.long, device=device)
    segment = torch.full((len(groups), length), -1, dtype=torch.long, device=device)
    flat_start = torch.zeros(count, dtype=torch.long, device=device)
    for g, members in enumerate(groups):
        n = lengths[g]
        input_ids[g, :n] = rows_ids[g]
        positions[g, :n] = rows_pos[g]
        segment[g, :n] = rows_seg[g].to(device)
        for b in members:
            flat_start[b] = g * length + starts[b]
    response_lens = torch.tensor([len(sequences[b]) - int(prompt_lens[b]) for b in range(count)],
                                 dtype=torch.long, device=device)
    return SharedPrefixPlan(input_ids, positions, segment, groups, flat_start, response_lens)


def _attention_implementation(model: torch.nn.Module) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) or "eager"


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    # a peft model (a LoRA actor) takes **kwargs and hands them to the model it wraps: ask that one
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


def model_inputs(model: torch.nn.Module, plan: SharedPrefixPlan, prompt_logits: bool = False) -> dict:
    """Keyword arguments of ``model(...)`` for the grouped rows: ids, positions, the block mask and, where the
    model takes it, ``logits_to_keep`` so that the LM head skips the columns left of the first segment (their
    logits are never read) unless ``prompt_logits`` asks for every position."""
    implementation = _attention_implementation(model)
    dtype = next(model.parameters()).dtype
    inputs = {"input_ids": plan.input_ids, "position_ids": plan.position_ids,
              "attention_mask": plan.attention_mask(implementation, dtype=dtype)}
    skip = plan.first_segment_column if _takes_logits_to_keep(model) and not prompt_logits else 0
    if skip:
        inputs["logits_to_keep"] = plan.input_ids.shape[1] - skip
    return inputs


def response_outputs(
    logits: torch.Tensor,
    plan: SharedPrefixPlan,
    temperature: float | torch.Tensor = 1.0,
    calculate_entropy: bool = False,
    entropy_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    logprob_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs (and entropy) of the response tokens from the logits of the grouped rows.

    ``logits``: (G, K, V), the last K columns of the rows (K = L without ``logits_to_keep``);
    ``temperature``: one value or one per sample (B,). Zero past each sample's response. Log-probs use
    ``logprob_fn(logits, labels)`` (default verl's ``logprobs_from_logits``), entropy ``entropy_fn`` (default
    verl's ``entropy_from_logits``), as the engine does. verl is imported only for a default that is used, so
    a caller passing both functions needs torch alone (the GPU kernel check runs where verl is not installed:
    ``tools/gpu_kernel_check.py``).
    """
    length = plan.input_ids.shape[1]
    kept = logits.shape[1]
    skip = length - kept
    if isinstance(temperature, torch.Tensor) and temperature.numel() > 1:
        owner = plan.sample_index()[:, skip:]
        scale = temperature.to(logits.device, torch.float32)[owner.clamp(min=0)].where(owner >= 0, 1.0)
        logits = logits / scale.unsqueeze(-1).to(logits.dtype)
    else:
        value = float(temperature)
        if value != 1.0:
            logits = logits / value
    labels = torch.roll(plan.input_ids, shifts=-1, dims=1)[:, skip:]
    index, valid = plan.response_index()
    # Flat indices row * L + column, re-based onto the kept window: row * K + column - skip.
    index = ((index // length) * kept + index % length - skip).where(valid, torch.zeros_like(index))

    if logprob_fn is None:
        from verl.utils.torch_functional import logprobs_from_logits

        log_probs = logprobs_from_logits(logits, labels, inplace_backward=not calculate_entropy)
    else:
        log_probs = logprob_fn(logits, labels)
    out = log_probs.reshape(-1)[index].masked_fill(~valid, 0.0)
    entropy = None
    if calculate_entropy:
        if entropy_fn is None:
            from verl.utils.torch_functional import entropy_from_logits

            entropy_fn = entropy_from_logits
        entropy = entropy_fn(logits).reshape(-1)[index].masked_fill(~valid, 0.0)
    return out, entropy


def shared_forward(
    model: torch.nn.Module,
    plan: SharedPrefixPlan,
    temperature: float | torch.Tensor = 1.0,
    calculate_entropy: bool = False,
    prompt_logits: bool = False,
    *,
    logprob_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    entropy_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob (and entropy) of every response token under ``model``: one forward over the grouped rows.

    Returns (B, R) tensors, R the longest response, zero past each sample's response; differentiable.
    ``logprob_fn``/``entropy_fn``: as in :func:`response_outputs` (default verl's).
    """
    logits = model(**model_inputs(model, plan, prompt_logits), use_cache=False).logits
    return response_outputs(logits, plan, temperature, calculate_entropy, entropy_fn, logprob_fn=logprob_fn)


def unshared_forward(
    model: torch.nn.Module,
    sequences: Sequence[torch.Tensor],
    prompt_lens: Sequence[int],
    position_ids: Sequence[torch.Tensor] | None = None,
    pad_token_id: int = 0,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference: every sample's whole sequence, right-padded, causal (verl's ``use_remove_padding=false``)."""
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    count = len(sequences)
    device = sequences[0].device
    lengths = torch.tensor([len(seq) for seq in sequences], device=device)
    length = int(lengths.max())
    ids = torch.full((count, length), pad_token_id, dtype=torch.long, device=device)
    pos = torch.zeros((count, length), dtype=torch.long, device=device)
    mask = torch.zeros((count, length), dtype=torch.long, device=device)
    for b, seq in enumerate(sequences):
        ids[b, : len(seq)] = seq
        pos[b, : len(seq)] = torch.arange(len(seq), device=device) if position_ids is None else position_ids[b]
        mask[b, : len(seq)] = 1
    logits = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False).logits
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = logprobs_from_logits(logits, torch.roll(ids, shifts=-1, dims=1), inplace_backward=not calculate_entropy)
    entropy_all = entropy_from_logits(logits) if calculate_entropy else None

    prompts = torch.tensor([int(p) for p in prompt_lens], device=device)
    response_lens = lengths - prompts
    width = int(response_lens.max())
    offsets = torch.arange(width, device=device)
    valid = offsets.unsqueeze(0) < response_lens.unsqueeze(1)
    columns = (prompts.unsqueeze(1) - 1 + offsets.unsqueeze(0)).where(valid, torch.zeros_like(valid, dtype=torch.long))
    out = log_probs.gather(1, columns).masked_fill(~valid, 0.0)
    entropy = entropy_all.gather(1, columns).masked_fill(~valid, 0.0) if calculate_entropy else None
    return out, entropy


def sequences_from_padded(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_width: int,
    position_ids: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], list[int], list[torch.Tensor] | None]:
    """verl's padded batch (prompts left-padded to ``prompt_width``, responses right-padded) as real tokens.

    Tokens with attention mask 0 are dropped, as verl's ``left_right_2_no_padding`` does; the prompt length is
    the number of real tokens in the first ``prompt_width`` columns, as in ``no_padding_2_padding``.
    """
    keep = attention_mask.bool()
    sequences = [input_ids[b][keep[b]] for b in range(input_ids.shape[0])]
    prompt_lens = [int(n) for n in keep[:, :prompt_width].sum(dim=1)]
    positions = None if position_ids is None else [position_ids[b][keep[b]] for b in range(input_ids.shape[0])]
    return sequences, prompt_lens, positions


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_width: int,
    *,
    position_ids: torch.Tensor | None = None,
    group_ids: Sequence[Hashable] | None = None,
    shared: bool = True,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    pad_token_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs (and entropy) of the response tokens of a verl-style padded batch.

    ``R`` is the longest real response; column j of row b is response token j of sample b (zero past its
    response), as ``no_padding_2_padding`` lays out the engine's output. ``shared`` picks the grouped forward
    (prompts computed once per group) or the per-sample reference.
    """
    sequences, prompt_lens, positions = sequences_from_padded(input_ids, attention_mask, prompt_width, position_ids)
    if not shared:
        return unshared_forward(model, sequences, prompt_lens, positions, pad_token_id, temperature,
                                calculate_entropy)
    plan = plan_groups(sequences, prompt_lens, positions, group_ids, pad_token_id)
    return shared_forward(model, plan, temperature, calculate_entropy)
