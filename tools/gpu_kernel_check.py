"""The GPU kernel check: our own tensor code on one CUDA device, with torch, transformers and numpy alone.

``scripts/gpu_check.sh`` (without ``--kernels``) trains 2 GRPO steps through vLLM, verl and Ray: it needs the
whole GPU install and internet-free wheels. The GPU machine our checks are lent has torch, transformers and
numpy but none of verl, Ray, vLLM, tensordict, pydantic, omegaconf or hydra, cannot fetch anything, and
receives the working tree plus at most 64 MiB of carried files. What can go wrong on CUDA that the CPU suite
cannot see is this project's own tensor code meeting CUDA kernels (SDPA with explicit masks, bf16
rounding, device placement of index tensors, scatter/index_add atomics), so that is what this checks, on a
small Llama built here from a config (no model file needs to travel):

* ``generator``: :class:`~agentevolver.backends.cpu.generator.HFGenerator` (the CPU backend's batched
  decoder: left padding, per-row position ids, rows dropped from the KV cache as they finish, the shared
  prefix cache) greedy-decodes what transformers' own ``generate`` decodes, request by request, in one
  batch of rows of different lengths and limits, and in one batch sharing a cached prefix; its log-probs
  are compared with an fp32 forward over the same tokens.
* ``shared prompt``: :mod:`agentevolver.verl.shared_prefix.layout` (a GRPO group's prompt computed once,
  its responses attending to it through a block mask) gives the per-token log-probs and entropies of
  separate full forwards, and in fp32 the same parameter gradients; a deliberately leaking mask must miss
  by far more than the tolerance (the check can see the error it is there to catch).
* ``adca``: :func:`~agentevolver.module.adv_processor.adca_grpo.prm_grpo_advantages` on CUDA tensors equals
  the same call on CPU tensors over every combination of its switches and on one large batch; the CPU
  result also equals the per-sample oracle (:mod:`tools.adv_oracle`).

``--device cpu`` runs the same checks on CPU: tests/test_gpu_kernel_check.py runs that dry run through
``bash scripts/gpu_check.sh --kernels`` in the default suite, with the packages the GPU machine lacks
blocked, so the check cannot rot between GPU runs. Tolerances are the module constants below; the report
states each next to what was measured. docs/backends.md, "The GPU kernel check".

Import rule: this module and everything it imports need only torch, transformers, numpy and the standard
library (tests/test_gpu_kernel_check.py enforces it). It is a test harness, not part of the runtime package:
run it from the repository root as ``python -m tools.gpu_kernel_check`` (what ``scripts/gpu_check.sh
--kernels`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import itertools
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import transformers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from agentevolver.backends.cpu.generator import HFGenerator
from agentevolver.paths import REPO_ROOT
from agentevolver.verl.shared_prefix.layout import SharedPrefixPlan, plan_groups, shared_forward

__all__ = ["CHECKS", "CheckResult", "adca_modules", "build_model", "main", "run_checks"]

#: The model every check runs: a random Llama with grouped-query attention (4 query heads on 2 key/value
#: heads, head_dim 64 as SmolLM2 and the GPU preset's models have), small enough for the CPU dry run.
MODEL_CONFIG: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
#: Weight std by parameter name (norms stay 1). transformers' default (0.02 everywhere) leaves the residual
#: stream equal to the input embedding: greedy decoding then maps the current token to the next one and
#: no position, mask or cache bug could change its output. These make context matter (changing one
#: token 40 positions back moves later log-probs by ~1) while keeping the model well conditioned (bf16 vs
#: fp32 log-probs ~0.03 apart on average): larger query/key weights make attention so sharp that bf16
#: rounding flips which token a head attends to, and the bf16 limits would have to be loose.
INIT_STD = {"embed_tokens": 1.0, "q_proj": 0.1, "k_proj": 0.1, "lm_head": 0.2}
INIT_STD_OTHER = 0.05
PAD_ID = 0
EOS_ID = MODEL_CONFIG["vocab_size"] - 1
DTYPES = ("float32", "bfloat16")

# Limits. Measured on the CPU dry run (seed 0), for scale: transformers' own bf16 forward is 0.13 at most and
# 0.03 on average from the fp32 forward in log-prob (bf16 logits alone are rounded to 1/16 near 10); the
# generator's bf16 log-probs 0.13 / 0.03 (with the CPU-only decode attention); shared vs separate forwards
# in bf16 0.06 / 0.007; every fp32 difference below 1e-5 at most and 3e-6 on average. Bugs move far more:
# the leaking-mask control 3.1 at most, 0.57 on average; bugs put into the generator by hand (positions that
# count padding, a decode position that does not advance, padding left visible) failed both dtypes with
# first wrong tokens 0.8 to 8 logits from a tie and log-probs up to 3.8 (0.23 on average) off.

#: Greedy tokens may part from transformers' only where the two candidates are this close under the fp32
#: model (logit units; the check model's logits have std ~3): a near-tie that rounding may break either way.
#: Each side's bf16 error on a logit difference is up to ~0.13, in opposite directions at worst: 0.4.
GEN_TIE_TOL = {"float32": 1e-3, "bfloat16": 0.4}
#: |generator log-prob - fp32 forward log-prob| over every generated token: (largest, mean).
GEN_LOGPROB_TOL = {"float32": (1e-4, 1e-5), "bfloat16": (0.3, 0.08)}
#: |shared - separate| per-token log-prob and entropy: (largest, mean).
SHARED_TOL = {"float32": (1e-4, 1e-5), "bfloat16": (0.25, 0.03)}
#: fp32 gradients: largest |shared - separate| entry over the largest |separate| entry, per parameter.
SHARED_GRAD_RTOL = 1e-4
#: The leaking mask must move the log-probs by at least this many tolerances (largest and mean alike).
LEAK_FACTOR = 5.0
#: ADCA: |device - cpu| <= atol + rtol * |cpu| for float32 results (float64 ones must agree to 1e-9).
ADCA_ATOL, ADCA_RTOL = 1e-5, 1e-5
#: ADCA: the vectorised CPU result against the per-sample oracle (tests/test_adv_processor.py's limits).
ADCA_ORACLE_TOL = 1e-4


@dataclass
class CheckResult:
    """One report line: ``ok``, a one-line ``detail`` with the measured numbers and their limits, and the
    same numbers (``measured``, ``limits``) for the JSON report."""

    name: str
    ok: bool
    detail: str
    measured: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


# -- the model ----------------------------------------------------------------------------------------------


def build_model(seed: int = 0) -> LlamaForCausalLM:
    """The check model (:data:`MODEL_CONFIG`), fp32 on CPU, weights drawn from ``seed`` without touching
    torch's global RNG; callers copy it to the device and dtype they test, so every copy has equal weights.

    The weights are rounded to bf16 values once here, so the fp32 and the bf16 copies are the same function
    and the fp32 copy is the exact reference for the bf16 one: what remains between them is the rounding of
    the bf16 computation, which is what the bf16 limits are about (not a perturbed model).
    """
    config = LlamaConfig(**MODEL_CONFIG, bos_token_id=PAD_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    config._attn_implementation = "sdpa"  # the GPU preset's attention, and the one the block mask needs
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(config)
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"transformers {transformers.__version__} built the check model with "
                           f"{model.config._attn_implementation!r} attention; the checks need sdpa")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
                continue
            std = next((value for key, value in INIT_STD.items() if key in name), INIT_STD_OTHER)
            param.copy_((torch.randn(param.shape, generator=generator) * std).to(torch.bfloat16).float())
    return model.eval()


def _copy(model: torch.nn.Module, device: torch.device, dtype: str) -> LlamaForCausalLM:
    return copy.deepcopy(model).to(device=device, dtype=getattr(torch, dtype)).eval()


def _random_ids(generator: torch.Generator, count: int) -> list[int]:
    """Token ids that are neither padding nor EOS."""
    return torch.randint(PAD_ID + 1, EOS_ID, (count,), generator=generator).tolist()


def _token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log_softmax at ``labels``, in fp32 (verl's ``logprobs_from_logits`` without flash-attn does the same)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy per position in fp32, the formula of verl's ``entropy_from_logits``."""
    logits = logits.float()
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


# -- (a) the generator --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    prompt: list[int]
    max_tokens: int


def _generator_requests(seed: int) -> dict[str, list[_Request]]:
    """Three runs: every prompt alone; six prompts of 5..60 tokens with different ``max_tokens`` in one batch
    (left padding, rows leaving the cache at different steps); four prompts with a common 150-token prefix
    in one batch (the prefix cache), two of them identical as in a GRPO group."""
    generator = torch.Generator().manual_seed(seed + 1)
    varied = [_Request(_random_ids(generator, n), m)
              for n, m in zip((5, 17, 33, 9, 60, 24), (20, 7, 13, 20, 3, 16), strict=True)]
    prefix = _random_ids(generator, 150)
    tails = [_random_ids(generator, n) for n in (4, 9, 1)]
    shared = [_Request(prefix + tails[0], 20), _Request(prefix + tails[1], 12), _Request(prefix + tails[2], 20),
              _Request(prefix + tails[0], 20)]
    return {"single": varied + shared, "batched": varied, "shared prefix": shared}


def _hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy ``generate`` for one unpadded prompt."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=EOS_ID,
                              pad_token_id=PAD_ID, return_dict_in_generate=True)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out.sequences[0, len(prompt):].tolist()


def _fp32_logits(oracle: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """(len(tokens), V) fp32 logits that predict each of ``tokens`` after ``prompt``: one full forward."""
    device = next(oracle.parameters()).device
    ids = torch.tensor([prompt + tokens], dtype=torch.long, device=device)
    with torch.inference_mode():
        logits = oracle(input_ids=ids).logits[0].float()
    return logits[len(prompt) - 1: len(prompt) - 1 + len(tokens)]


async def _serve_runs(generator: HFGenerator, runs: dict[str, list[_Request]]) -> dict[str, tuple[list[Any], dict]]:
    """Each run through ``generate``: ``single`` one request at a time, the others all at once with
    ``max_batch_size`` set to their count, so the batcher starts them as one batch. Returns per run the
    outputs and the generator's counters it added."""
    results: dict[str, tuple[list[Any], dict]] = {}
    async with generator:
        for name, requests in runs.items():
            before = dict(generator.stats)
            params = [{"temperature": 0.0, "max_tokens": r.max_tokens, "logprobs": True} for r in requests]
            calls = [generator.generate(f"{name}-{i}", prompt_ids=r.prompt, sampling_params=p)
                     for i, (r, p) in enumerate(zip(requests, params, strict=True))]
            if name == "single":
                generator.max_batch_size = 1
                outputs = [await call for call in calls]
            else:
                generator.max_batch_size = len(requests)
                outputs = list(await asyncio.gather(*calls))
            results[name] = (outputs, {k: generator.stats[k] - before[k] for k in before})
    return results


def check_generator(device: torch.device, dtype: str, base: torch.nn.Module, seed: int) -> CheckResult:
    """(a) HFGenerator on ``device`` in ``dtype`` against transformers' ``generate`` and an fp32 forward."""
    runs = _generator_requests(seed)
    reference = _copy(base, device, dtype)  # transformers' generate
    oracle = reference if dtype == "float32" else _copy(base, device, "float32")
    longest = max(r.max_tokens for r in runs["single"])
    expected = {tuple(r.prompt): _hf_greedy(reference, r.prompt, longest) for r in runs["single"]}
    # its own copy: on CPU in bf16 HFGenerator switches the model's decode attention (decode_attention.py)
    served = HFGenerator(_copy(base, device, dtype), [EOS_ID], pad_token_id=PAD_ID, max_batch_size=16,
                         batch_wait_s=5.0, seed=seed)
    served_runs = asyncio.run(_serve_runs(served, runs))

    problems: list[str] = []
    equal = parted = 0
    worst_gap = 0.0
    errors: list[torch.Tensor] = []  # |generator log-prob - fp32 forward log-prob| of every generated token
    for name, (outputs, stats) in served_runs.items():
        requests = runs[name]
        if name != "single" and (stats["batches"] != 1 or stats["rows"] != len(requests)):
            problems.append(f"{name}: {stats['rows']:g} rows in {stats['batches']:g} batches, want "
                            f"{len(requests)} in 1")
        if name == "shared prefix":
            if stats["prefix_cached_tokens"] <= 0:
                problems.append("shared prefix: no prompt token came from the prefix cache")
            if outputs[0].token_ids != outputs[3].token_ids:
                problems.append("shared prefix: two identical prompts decoded differently")
        for index, (request, output) in enumerate(zip(requests, outputs, strict=True)):
            label = f"{name}[{index}]"
            tokens = list(output.token_ids)
            want = expected[tuple(request.prompt)][: request.max_tokens]
            if output.stop_reason not in ("completed", "length") or not tokens or \
                    len(output.log_probs or ()) != len(tokens):
                problems.append(f"{label}: stop_reason {output.stop_reason!r}, {len(tokens)} tokens, "
                                f"{len(output.log_probs or ())} log-probs")
                continue
            logits = _fp32_logits(oracle, request.prompt, tokens)
            exact = _token_logprobs(logits, torch.tensor(tokens, device=logits.device))
            errors.append((torch.tensor(output.log_probs, device=exact.device) - exact).abs())
            part = next((t for t, (a, b) in enumerate(zip(tokens, want, strict=False)) if a != b), None)
            if part is None:
                if len(tokens) != len(want):
                    problems.append(f"{label}: {len(tokens)} tokens, transformers' generate {len(want)}")
                else:
                    equal += 1
                continue
            # the contexts are equal up to ``part``, so the fp32 logits there judge both choices
            parted += 1
            gap = abs(float(logits[part, want[part]] - logits[part, tokens[part]]))
            worst_gap = max(worst_gap, gap)
            if gap > GEN_TIE_TOL[dtype]:
                problems.append(f"{label}: token {part} is {tokens[part]}, transformers' generate {want[part]}; "
                                f"fp32 logit gap {gap:.3g} > {GEN_TIE_TOL[dtype]:g} (not a near-tie)")
    error = torch.cat(errors) if errors else torch.zeros(1)
    lp_max, lp_mean = float(error.max()), float(error.mean())
    # context: transformers' own forward in this dtype over its own greedy tokens, against the fp32 forward
    own_errors = []
    for prompt, tokens in expected.items():
        ids = torch.tensor([[*prompt, *tokens]], device=device)
        with torch.inference_mode():
            own = reference(input_ids=ids).logits[0, len(prompt) - 1: -1]
        labels = torch.tensor(tokens, device=device)
        own_errors.append((_token_logprobs(own, labels) - _token_logprobs(_fp32_logits(oracle, list(prompt), tokens),
                                                                          labels)).abs())
    own_error = torch.cat(own_errors)
    own_max, own_mean = float(own_error.max()), float(own_error.mean())
    max_tol, mean_tol = GEN_LOGPROB_TOL[dtype]
    if lp_max > max_tol or lp_mean > mean_tol:
        problems.append(f"log-probs off the fp32 forward by {lp_max:.3g} at most, {lp_mean:.3g} on average "
                        f"(limits {max_tol:g}, {mean_tol:g}; transformers' own {dtype} forward: {own_max:.3g}, "
                        f"{own_mean:.3g})")

    counts = {name: len(outputs) for name, (outputs, _) in served_runs.items()}
    cached = served_runs["shared prefix"][1]["prefix_cached_tokens"] // max(len(runs["shared prefix"]), 1)
    detail = (f"{sum(counts.values())} requests ({counts['single']} alone, {counts['batched']} in one batch, "
              f"{counts['shared prefix']} in one batch over a {cached:g}-token cached prefix): {equal} equal "
              f"transformers' generate token for token, {parted} part at a near-tie (fp32 logit gap "
              f"{worst_gap:.3g} <= {GEN_TIE_TOL[dtype]:g}); log-probs vs an fp32 forward: max {lp_max:.3g} "
              f"(<= {max_tol:g}), mean {lp_mean:.3g} (<= {mean_tol:g}); transformers' own {dtype} forward: max "
              f"{own_max:.3g}, mean {own_mean:.3g}")
    detail = _problems_first(problems, detail)
    return CheckResult(
        f"generator {dtype}", not problems, detail,
        measured={"requests": sum(counts.values()), "equal": equal, "parted_at_near_tie": parted,
                  "max_tie_gap": worst_gap, "max_logprob_error": lp_max, "mean_logprob_error": lp_mean,
                  "transformers_max_logprob_error": own_max, "transformers_mean_logprob_error": own_mean,
                  "generated_tokens": int(error.numel()), "cached_prefix_tokens": cached, "problems": problems,
                  "stats": {name: stats for name, (_, stats) in served_runs.items()}},
        limits={"tie_gap": GEN_TIE_TOL[dtype], "max_logprob_error": max_tol, "mean_logprob_error": mean_tol},
    )


# -- (b) the shared prompt ----------------------------------------------------------------------------------


def _shared_prompt_batch(seed: int, device: torch.device) -> tuple[list[torch.Tensor], list[int]]:
    """Two GRPO groups (4 and 3 samples, prompts of 41 and 26 tokens), the next turn of group a's episode
    (a longer prompt: its own row), and a group of one; responses of 1 to 30 tokens."""
    generator = torch.Generator().manual_seed(seed + 2)
    prompt_a, prompt_b = _random_ids(generator, 41), _random_ids(generator, 26)
    rows = [(prompt_a, 12), (prompt_b, 19), (prompt_a, 1), (prompt_a + _random_ids(generator, 6), 9),
            (prompt_b, 5), (prompt_a, 30), (_random_ids(generator, 9), 14), (prompt_b, 22), (prompt_a, 7)]
    sequences = [torch.tensor(prompt + _random_ids(generator, n), device=device) for prompt, n in rows]
    return sequences, [len(prompt) for prompt, _ in rows]


def _separate(model: torch.nn.Module, sequences: Sequence[torch.Tensor], prompt_lens: Sequence[int],
              width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: each sample's own full causal forward, unpadded; (B, width) log-probs and entropies."""
    log_probs = torch.zeros(len(sequences), width, device=sequences[0].device)
    entropy = torch.zeros_like(log_probs)
    for b, (sequence, prompt_len) in enumerate(zip(sequences, prompt_lens, strict=True)):
        logits = model(input_ids=sequence[None], use_cache=False).logits[0, prompt_len - 1: -1]
        count = len(sequence) - prompt_len
        log_probs[b, :count] = _token_logprobs(logits, sequence[prompt_len:])
        entropy[b, :count] = _entropy(logits)
    return log_probs, entropy


def check_shared_prompt(device: torch.device, dtype: str, base: torch.nn.Module, seed: int) -> CheckResult:
    """(b) shared-prompt log-probs (and, in fp32, gradients) against separate full forwards on ``device``."""
    model = _copy(base, device, dtype)
    sequences, prompt_lens = _shared_prompt_batch(seed, device)
    plan = plan_groups(sequences, prompt_lens, pad_token_id=PAD_ID)
    valid = torch.arange(int(plan.response_lens.max()), device=device)[None, :] < plan.response_lens[:, None]
    width = valid.shape[1]
    max_tol, mean_tol = SHARED_TOL[dtype]

    def shared(which: SharedPrefixPlan) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs, entropy = shared_forward(model, which, calculate_entropy=True, logprob_fn=_token_logprobs,
                                            entropy_fn=_entropy)
        assert entropy is not None
        return log_probs.float(), entropy.float()

    with torch.no_grad():
        lp_shared, ent_shared = shared(plan)
        lp_separate, ent_separate = _separate(model, sequences, prompt_lens, width)
        # the same mask with every sample of a row in one segment: later samples see earlier ones' tokens
        leaky = dataclasses.replace(plan, segment=plan.segment.clamp(max=1))
        lp_leaky, _ = shared(leaky)
        lp_fp32 = _separate(_copy(base, device, "float32"), sequences, prompt_lens, width)[0] \
            if dtype != "float32" else lp_separate
    lp_diff, ent_diff = (lp_shared - lp_separate)[valid].abs(), (ent_shared - ent_separate)[valid].abs()
    leak = (lp_leaky - lp_separate)[valid].abs()
    own_error = float((lp_separate - lp_fp32)[valid].abs().max())
    lp_max, lp_mean, ent_max, ent_mean = (float(lp_diff.max()), float(lp_diff.mean()), float(ent_diff.max()),
                                          float(ent_diff.mean()))
    leak_max, leak_mean = float(leak.max()), float(leak.mean())
    measured: dict[str, Any] = {
        "samples": plan.num_samples, "rows": len(plan.groups), "tokens": plan.tokens,
        "unshared_tokens": sum(len(s) for s in sequences), "max_logprob_diff": lp_max,
        "mean_logprob_diff": lp_mean, "max_entropy_diff": ent_max, "mean_entropy_diff": ent_mean,
        "leaking_mask_max_logprob_diff": leak_max, "leaking_mask_mean_logprob_diff": leak_mean,
        f"separate_{dtype}_vs_fp32_max_logprob_diff": own_error,
    }
    problems = []
    if len(plan.groups) >= plan.num_samples:
        problems.append("no two samples were grouped")
    if max(lp_max, ent_max) > max_tol or max(lp_mean, ent_mean) > mean_tol:
        problems.append(f"log-probs differ by {lp_max:.3g} at most, {lp_mean:.3g} on average, entropies by "
                        f"{ent_max:.3g}, {ent_mean:.3g} (limits {max_tol:g}, {mean_tol:g})")
    if leak_max < LEAK_FACTOR * max_tol or leak_mean < LEAK_FACTOR * mean_tol:
        problems.append(f"a leaking mask moved log-probs by only {leak_max:.3g} at most, {leak_mean:.3g} on "
                        f"average (want >= {LEAK_FACTOR:g} x the limits): this check could not see a masking error")
    grad_note = ""
    if dtype == "float32":
        weights = torch.rand(valid.shape, generator=torch.Generator().manual_seed(seed + 3)).to(device) * valid
        model.zero_grad(set_to_none=True)
        (shared(plan)[0] * weights).sum().backward()
        grads_shared = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        (_separate(model, sequences, prompt_lens, width)[0] * weights).sum().backward()
        worst, worst_name = 0.0, ""
        for name, param in model.named_parameters():
            reference = param.grad
            if reference is None or name not in grads_shared:
                problems.append(f"no gradient for {name}")
                continue
            scale = float(reference.abs().max()) or 1.0
            relative = float((grads_shared[name] - reference).abs().max()) / scale
            if relative > worst:
                worst, worst_name = relative, name
        measured["max_grad_rel_diff"], measured["max_grad_rel_diff_param"] = worst, worst_name
        if worst > SHARED_GRAD_RTOL:
            problems.append(f"gradient of {worst_name} differs by {worst:.3g} of its largest entry "
                            f"(> {SHARED_GRAD_RTOL:g})")
        grad_note = f", gradients within {worst:.3g} of each parameter's largest entry (<= {SHARED_GRAD_RTOL:g})"
    detail = (f"{plan.num_samples} samples in {len(plan.groups)} rows ({plan.tokens} of "
              f"{measured['unshared_tokens']} tokens) vs separate forwards: log-probs max {lp_max:.3g} mean "
              f"{lp_mean:.3g}, entropies max {ent_max:.3g} mean {ent_mean:.3g} (<= {max_tol:g}, {mean_tol:g})"
              f"{grad_note}; a leaking mask: max {leak_max:.3g} mean {leak_mean:.3g}"
              + (f"; separate {dtype} vs fp32: max {own_error:.3g}" if dtype != "float32" else ""))
    if problems:
        detail = "; ".join(problems)
    return CheckResult(f"shared prompt {dtype}", not problems, detail, measured=measured,
                       limits={"max": max_tol, "mean": mean_tol, "grad_rel": SHARED_GRAD_RTOL,
                               "leak_min": [LEAK_FACTOR * max_tol, LEAK_FACTOR * mean_tol]})


def _problems_first(problems: list[str], detail: str) -> str:
    """A check's report line: its measurements, or, when it failed, the first four problems."""
    if not problems:
        return detail
    return "; ".join(problems[:4]) + (f" (+{len(problems) - 4} more)" if len(problems) > 4 else "")


# -- (c) ADCA -----------------------------------------------------------------------------------------------


def adca_modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    """``(groups, adca_grpo)`` of :mod:`agentevolver.module.adv_processor`, the maths modules, which need torch
    and numpy only (the package's ``__init__`` imports the judge's stack lazily), and the per-sample oracle
    :mod:`tools.adv_oracle`."""
    from agentevolver.module.adv_processor import adca_grpo, groups
    from tools import adv_oracle

    return groups, adca_grpo, adv_oracle


def _adca_batch(seed: int, size: int, length: int, max_steps: int) -> dict[str, Any]:
    """A rollout-like batch: groups of 4 (and two groups of one), 0..max_steps steps per sample, each step a
    run of policy tokens followed by observation tokens (step id -1), padding; some samples unlabelled."""
    rng = np.random.default_rng(seed)
    step_ids = np.full((size, length), -1, dtype=np.int64)
    for i in range(size):
        steps = int(rng.integers(0, max_steps + 1)) if i % 7 else max(1, max_steps // 2)
        cursor = 0
        for step in range(steps):
            policy, observation = int(rng.integers(1, 12)), int(rng.integers(0, 8))
            if cursor + policy > length:
                break
            step_ids[i, cursor: cursor + policy] = step
            cursor += policy + observation
    mask = (step_ids >= 0) & (rng.random((size, length)) > 0.05)  # a few masked-out policy tokens too
    groups = [f"uid-{i // 4}" if i < size - 2 else f"single-{i}" for i in range(size)]
    outcomes = rng.choice([0.0, 1.0, 0.5, -1.0], size=size).tolist()
    counts = (step_ids.max(axis=1) + 1).clip(min=0)
    step_flags = [None if rng.random() < 0.15 else [bool(f) for f in rng.random(int(c)) > 0.4] for c in counts]
    fallback = rng.standard_normal((size, length)).astype(np.float32)
    return {"step_ids": torch.from_numpy(step_ids), "mask": torch.from_numpy(mask.astype(np.float32)),
            "outcomes": outcomes, "groups": groups, "step_flags": step_flags, "fallback": torch.from_numpy(fallback)}


def _adca_run(adca: ModuleType, groups: ModuleType, data: dict[str, Any], hyper: Any, use_fallback: bool,
              device: torch.device) -> Any:
    step_ids = data["step_ids"].to(device)
    steps = adca.num_steps(step_ids)
    flags, labelled = adca.pack_step_flags(data["step_flags"], steps)
    fallback = data["fallback"].to(device) if use_fallback else None
    return adca.prm_grpo_advantages(step_ids, data["mask"].to(device), torch.tensor(data["outcomes"], device=device),
                                    groups.group_index(data["groups"], device=device), flags, labelled, fallback,
                                    hyper, steps=steps)


def check_adca(device: torch.device, seed: int) -> CheckResult:
    """(c) ADCA advantages from ``device`` tensors equal those from CPU tensors (and the CPU ones the oracle)."""
    groups, adca, oracle_module = adca_modules()
    small = _adca_batch(seed + 4, size=48, length=96, max_steps=7)
    large = _adca_batch(seed + 5, size=512, length=4096, max_steps=30)
    switches = itertools.product(("decouple", "allocation"), (True, False), ("last_step", "all_steps"),
                                 (False, True), (True, False))
    cases: list[tuple[str, dict[str, Any], Any, bool, bool]] = []
    for index, (scheme, equal_weight, orm, length_norm, norm_std) in enumerate(switches):
        hyper = adca.AdcaHyper(prm_scheme=scheme, equal_trajectory_weight=equal_weight, orm_distribution=orm,
                               enable_length_normalization=length_norm, norm_adv_by_std=norm_std, alpha=0.3)
        cases.append((f"{scheme}/{equal_weight}/{orm}/{length_norm}/{norm_std}", small, hyper, index % 2 == 0,
                      True))
    cases.append(("large", large, adca.AdcaHyper(), True, False))

    worst = {"advantages": 0.0, "orm_scores": 0.0, "step_rewards": 0.0, "step_advantages": 0.0, "metrics": 0.0,
             "oracle": 0.0}
    problems: list[str] = []
    cpu = torch.device("cpu")
    for name, data, hyper, use_fallback, with_oracle in cases:
        on_cpu = _adca_run(adca, groups, data, hyper, use_fallback, cpu)
        on_device = _adca_run(adca, groups, data, hyper, use_fallback, device)
        for key in ("advantages", "orm_scores", "step_rewards", "step_advantages"):
            want, got = getattr(on_cpu, key), getattr(on_device, key).to(cpu)
            if got.shape != want.shape or got.dtype != want.dtype:
                problems.append(f"{name}: {key} {tuple(got.shape)} {got.dtype} vs cpu {tuple(want.shape)} {want.dtype}")
                continue
            diff = float((got - want).abs().max()) if want.numel() else 0.0
            worst[key] = max(worst[key], diff)
            atol, rtol = (ADCA_ATOL, ADCA_RTOL) if want.dtype == torch.float32 else (1e-9, 1e-9)
            if not torch.allclose(got, want, atol=atol, rtol=rtol):
                problems.append(f"{name}: {key} differ by {diff:.3g}")
        if not torch.equal(on_device.labelled.to(cpu), on_cpu.labelled):
            problems.append(f"{name}: labelled samples differ")
        if on_device.metrics.keys() != on_cpu.metrics.keys():
            problems.append(f"{name}: metrics {sorted(on_device.metrics)} vs cpu {sorted(on_cpu.metrics)}")
        else:
            for key, value in on_cpu.metrics.items():
                diff = abs(on_device.metrics[key] - value)
                worst["metrics"] = max(worst["metrics"], diff)
                if diff > ADCA_ATOL + ADCA_RTOL * abs(value):
                    problems.append(f"{name}: metric {key} {on_device.metrics[key]} vs cpu {value}")
        if with_oracle:
            fallback = data["fallback"] if use_fallback else None
            oracle = oracle_module.naive_prm_grpo_advantages(data["step_ids"], data["mask"], data["outcomes"],
                                                             data["groups"], data["step_flags"], fallback, hyper)
            diff = float((on_cpu.advantages - oracle).abs().max())
            worst["oracle"] = max(worst["oracle"], diff)
            if not torch.allclose(on_cpu.advantages, oracle, atol=ADCA_ORACLE_TOL, rtol=ADCA_ORACLE_TOL):
                problems.append(f"{name}: CPU advantages differ from the per-sample oracle by {diff:.3g}")
    detail = (f"{len(cases)} cases (the {len(cases) - 1} switch combinations on 48x96 tokens, one 512x4096 "
              f"batch): |{device.type} - cpu| advantages {worst['advantages']:.3g} (<= {ADCA_ATOL:g} + "
              f"{ADCA_RTOL:g}|x|), outcome scores {worst['orm_scores']:.3g}, step advantages "
              f"{worst['step_advantages']:.3g}, metrics {worst['metrics']:.3g}; CPU vs per-sample oracle "
              f"{worst['oracle']:.3g} (<= {ADCA_ORACLE_TOL:g})")
    detail = _problems_first(problems, detail)
    return CheckResult("adca", not problems, detail, measured={"cases": len(cases), "max_abs_diff": worst,
                                                               "problems": problems},
                       limits={"atol": ADCA_ATOL, "rtol": ADCA_RTOL, "oracle": ADCA_ORACLE_TOL})


# -- running and reporting ----------------------------------------------------------------------------------

#: Check families by the name ``--only`` takes.
CHECKS = ("generator", "shared-prompt", "adca")


def run_checks(device: torch.device, *, only: Sequence[str] = CHECKS, dtypes: Sequence[str] = DTYPES,
               seed: int = 0, on_result: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Every selected check in turn; one that raises becomes a FAIL line carrying the exception (and its
    traceback in ``measured``), and the others still run."""
    base = build_model(seed)
    plan: list[tuple[str, Callable[[], CheckResult]]] = []
    for dtype in dtypes:
        if "generator" in only:
            plan.append((f"generator {dtype}", lambda d=dtype: check_generator(device, d, base, seed)))
    for dtype in dtypes:
        if "shared-prompt" in only:
            plan.append((f"shared prompt {dtype}", lambda d=dtype: check_shared_prompt(device, d, base, seed)))
    if "adca" in only:
        plan.append(("adca", lambda: check_adca(device, seed)))
    results = []
    for name, run in plan:
        started = time.perf_counter()
        try:
            result = run()
        except Exception as exc:  # a check's own failure is a report line, not a crash
            result = CheckResult(name, False, f"raised {type(exc).__name__}: {exc}",
                                 measured={"traceback": traceback.format_exc()})
        if device.type == "cuda":
            try:
                torch.cuda.synchronize(device)
            except RuntimeError as exc:  # an asynchronous CUDA error of this check surfaces here
                result = CheckResult(name, False, f"CUDA error: {exc}", measured={"traceback": traceback.format_exc()})
        result.seconds = time.perf_counter() - started
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def _environment(device: torch.device) -> dict[str, Any]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores"
    return {"device": str(device), "device_name": name, "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": transformers.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads()}


def default_report_path() -> Path:
    """``$AGENTEVOLVER_GPU_CHECK_DIR/kernel_report.json``, next to the full check's ``report.json``."""
    folder = os.environ.get("AGENTEVOLVER_GPU_CHECK_DIR") or str(REPO_ROOT / "outputs" / "gpu_check")
    return Path(folder) / "kernel_report.json"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.gpu_kernel_check",
        description="Our generator, shared-prompt forward and ADCA maths on a CUDA device (torch, transformers "
                    "and numpy only); exit 0 only if every check passes. --device cpu is the dry run.")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (the dry run); default cuda")
    parser.add_argument("--report", type=Path, default=None,
                        help=f"JSON report path (default {default_report_path()})")
    parser.add_argument("--only", default=",".join(CHECKS),
                        help=f"comma-separated subset of {', '.join(CHECKS)} (default all)")
    parser.add_argument("--dtypes", default=",".join(DTYPES),
                        help=f"comma-separated subset of {', '.join(DTYPES)} (default both)")
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs (default 0)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default torch's; 1 is fastest on a busy small machine)")
    args = parser.parse_args(argv)
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    args.dtypes = [name.strip() for name in args.dtypes.split(",") if name.strip()]
    for value, allowed, flag in ((args.only, CHECKS, "--only"), (args.dtypes, DTYPES, "--dtypes")):
        unknown = sorted(set(value) - set(allowed))
        if unknown or not value:
            parser.error(f"{flag} takes a non-empty subset of {', '.join(allowed)}; got {', '.join(value) or 'none'}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks, print one line per check and the verdict, write the JSON report; 0 = every check
    passed, 1 = one failed, 2 = the device is not there."""
    args = _parse(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision("highest")  # no TF32: the fp32 limits are fp32's
    report_path: Path = args.report or default_report_path()
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        print(f"[gpu-kernel-check] bad --device {args.device!r}: {exc}", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"[gpu-kernel-check] torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no CUDA "
              f"device; --device cpu runs the same checks on CPU (the dry run)", file=sys.stderr)
        return 2
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    environment = _environment(device)
    mode = " (dry run: every check on CPU; it tests the check, not CUDA)" if device.type == "cpu" else ""
    print(f"[gpu-kernel-check] {environment['device']} ({environment['device_name']}){mode} | torch "
          f"{environment['torch']} (CUDA {environment['cuda']}), transformers {environment['transformers']}, "
          f"numpy {environment['numpy']}, Python {environment['python']}", flush=True)

    def show(result: CheckResult) -> None:
        print(f"  {'ok  ' if result.ok else 'FAIL'} {result.name}: {result.detail} [{result.seconds:.1f} s]",
              flush=True)

    started = time.perf_counter()
    results = run_checks(device, only=args.only, dtypes=args.dtypes, seed=args.seed, on_result=show)
    failed = [result.name for result in results if not result.ok]
    report = {"pass": not failed, **environment, "seconds": time.perf_counter() - started, "seed": args.seed,
              "model": MODEL_CONFIG, "checks": [dataclasses.asdict(result) for result in results]}
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2, default=str))
    print(f"report: {report_path}")
    print("GPU kernel check: PASS" if not failed else f"GPU kernel check: FAIL ({', '.join(failed)})")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
