"""Actor LoRA on the CPU backend: what verl sends to the rollout, the ``hf`` server's adapter merge, and the checks.

verl 0.9.1 trains LoRA inside its FSDP engine: with ``actor_rollout_ref.model.lora_rank > 0`` it wraps the HF model
in peft's ``get_peft_model`` (``lora_alpha``, ``target_modules``, ``exclude_modules``, ``target_parameters``), the
optimiser holds only the adapters, and the reference policy is the actor with its adapter disabled (no second
model). Its naive weight sync (``ActorRolloutRefWorker.update_weights``) sends the rollout one of two things,
chosen by ``actor_rollout_ref.model.lora.merge``:

* **adapters** (``merge: false``, verl's default). On the first sync, if the rollout started on dummy weights
  (``rollout.load_format: dummy``, verl's default), the base model, full tensors, with each LoRA target's weight
  named ``<module>.base_layer.weight``; then, on every sync, only the adapters, in fp32, named as peft names them
  (``base_model.model.<module>.lora_A.weight`` and ``.lora_B.weight``), with the peft config as a dict.
* **merged weights** (``merge: true``). The whole model with the adapters merged in (peft's ``W + (B @ A) *
  scaling``), under the HF names, on every sync, cast to bf16 by verl (``FSDPEngine._merged_lora_per_tensor_param``).

The ``hf`` server (:mod:`.rollout`) takes both. Merged weights load like full fine-tuning's. Adapters are merged
by the server itself with :class:`AdapterMerger`: it keeps an fp32 copy of each target's base weight and loads
``base + (B @ A) * scaling``, computed in fp32 the way peft merges, so an fp32 rollout serves what the fp32
trainer computes with (verl's merged route rounds every weight to bf16 on the way) and a sync moves only the
adapters (0.6% of SmolLM2-135M's bytes at rank 8). verl's vLLM rollout takes both too: adapters become a vLLM
LoRA request (vLLM's own LoRA layers), merged weights load into its model.

:func:`check_lora` runs on the driver (``agentevolver.main_ppo``) and refuses, naming the key and the fix, the
combinations that would otherwise fail inside a Ray worker or train something else than asked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from omegaconf import OmegaConf

from agentevolver.errors import ConfigError

__all__ = ["AdapterMerger", "base_name", "check_lora", "lora_rank", "merges_on_sync"]

#: Prefix peft puts before the HF names of the wrapped model (``PeftModel.base_model.model``).
PEFT_PREFIX = "base_model.model."
#: The infix verl gives a LoRA target's weight in the base sync (peft's ``LoraLayer.base_layer``).
BASE_LAYER = ".base_layer"
_HALF = re.compile(r"^(?P<module>.+)\.lora_(?P<half>[AB])(?:\.default)?\.weight$")


def _select(cfg: Any, key: str, default: Any = None) -> Any:
    value = OmegaConf.select(cfg, key, default=default)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def lora_rank(cfg: Any) -> int:
    """The actor's LoRA rank for verl's FSDP engine (``actor_rollout_ref.model.lora_rank``; 0 = full fine-tuning)."""
    return int(_select(cfg, "actor_rollout_ref.model.lora_rank", 0) or 0)


def merges_on_sync(cfg: Any) -> bool:
    """Whether verl's weight sync sends merged weights (``actor_rollout_ref.model.lora.merge``) instead of adapters."""
    return bool(_select(cfg, "actor_rollout_ref.model.lora.merge", False))


def check_lora(cfg: Any) -> None:
    """Refuse LoRA settings that verl would fail on inside a worker, or silently not apply (driver side).

    Raises:
        ConfigError: naming the key and what to set instead.
    """
    strategy = str(_select(cfg, "actor_rollout_ref.actor.strategy", "fsdp"))
    megatron_rank = int(_select(cfg, "actor_rollout_ref.model.lora.rank", 0) or 0)
    rank = lora_rank(cfg)
    if strategy in ("fsdp", "fsdp2") and megatron_rank > 0 and rank == 0:
        # verl's trainer reads lora.rank to take the reference policy from the actor (adapter disabled), but the
        # FSDP engine reads lora_rank: the actor would train all weights and the reference step would fail.
        raise ConfigError(
            f"actor_rollout_ref.model.lora.rank={megatron_rank} is Megatron's LoRA key; with "
            f"actor_rollout_ref.actor.strategy={strategy} set actor_rollout_ref.model.lora_rank={megatron_rank} "
            "(and lora_alpha, target_modules) and leave lora.rank at 0")
    if rank < 0:
        raise ConfigError(f"actor_rollout_ref.model.lora_rank must be >= 0 (0 = full fine-tuning); got {rank}")
    if rank == 0 and _select(cfg, "actor_rollout_ref.model.lora_adapter_path") is None:
        return
    rollout = str(_select(cfg, "actor_rollout_ref.rollout.name", ""))
    merge = merges_on_sync(cfg)
    if rollout == "hf" and not merge and _select(cfg, "actor_rollout_ref.model.target_parameters"):
        raise ConfigError(
            "actor_rollout_ref.model.target_parameters (LoRA on bare parameters) cannot be merged by the hf rollout "
            "server, which merges adapters of linear layers; set actor_rollout_ref.model.lora.merge=true (verl "
            "then sends merged weights) or target modules instead")
    load_format = str(_select(cfg, "actor_rollout_ref.rollout.load_format", "dummy"))
    if not merge and _select(cfg, "actor_rollout_ref.rollout.layered_summon", False) and "dummy" in load_format:
        raise ConfigError(
            "actor_rollout_ref.rollout.layered_summon=true sends only adapters, so the rollout must start on the "
            f"real base weights, not load_format={load_format!r}: set actor_rollout_ref.rollout.load_format=auto")
    contents = _select(cfg, "actor_rollout_ref.actor.checkpoint.save_contents", []) or []
    if "hf_model" in contents:
        # verl's FSDP checkpoint manager saves the peft model's full state dict into the HF folder as it is: keys
        # such as base_model.model.model.layers.0.mlp.up_proj.base_layer.weight / .lora_A.default.weight, which
        # transformers does not load as the model (it would start from random weights, reporting missing keys).
        raise ConfigError(
            "actor_rollout_ref.actor.checkpoint.save_contents has hf_model, which verl 0.9.1 writes for a LoRA "
            "actor under peft's names (…base_layer.weight, …lora_A.default.weight) that transformers cannot load "
            "as the model; drop it (the sharded model files hold the adapters, with "
            "actor_rollout_ref.actor.checkpoint.save_lora_only=true the adapters alone)")


def base_name(name: str) -> str:
    """The HF name of a weight verl sends in the adapters route's base sync (``q_proj.base_layer.weight`` ->
    ``q_proj.weight``)."""
    return name.replace(BASE_LAYER + ".", ".")


def _scaling(module: str, rank: int, peft_config: Mapping[str, Any]) -> float:
    """peft's ``LoraLayer.scaling``: ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA), ``alpha_pattern`` per module."""
    alpha = peft_config.get("lora_alpha", rank)
    patterns = peft_config.get("alpha_pattern") or {}
    if patterns:
        from peft.utils.other import get_pattern_key

        key = get_pattern_key(list(patterns), module)
        alpha = patterns.get(key, alpha)
    return float(alpha) / (math.sqrt(rank) if peft_config.get("use_rslora", False) else rank)


def _refuse_unmergeable(peft_config: Mapping[str, Any]) -> None:
    unsupported = {
        "use_dora": "DoRA's magnitude vectors",
        "lora_bias": "LoRA biases",
    }
    found = [what for key, what in unsupported.items() if peft_config.get(key)]
    if peft_config.get("modules_to_save"):
        found.append(f"fully trained modules (modules_to_save={peft_config['modules_to_save']})")
    if peft_config.get("target_parameters"):
        found.append(f"LoRA on bare parameters (target_parameters={peft_config['target_parameters']})")
    if found:
        raise ValueError(
            f"the hf rollout server merges adapters of linear layers only; this adapter has {', '.join(found)}: "
            "set actor_rollout_ref.model.lora.merge=true (verl then sends merged weights)")


class AdapterMerger:
    """Merges LoRA adapters into the served model: ``weight = base + (B @ A) * scaling``, in fp32.

    The base of a target is what the last full load wrote there (:meth:`set_base`, from verl's base sync), or else
    the served weight when the target's first adapter arrives (:meth:`merge` snapshots it through ``current``).
    Halves are paired as they arrive, so adapters may come in any bucket order; :meth:`finish` fails on a half
    whose partner never came, and on a sync that leaves out a target an earlier one had (the served weight
    would keep a stale adapter).
    """

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}  # HF weight name -> fp32 base weight
        self.targets: set[str] | None = None  # weight names adapted by the first adapter sync
        self._pending: dict[str, dict[str, torch.Tensor]] = {}
        self._merged: set[str] = set()

    def set_base(self, name: str, tensor: torch.Tensor) -> None:
        """Record ``tensor`` as the (fp32) base of the weight ``name``."""
        self.base[name] = tensor.detach().to("cpu", torch.float32, copy=True)

    def forget(self, names: Iterable[str]) -> None:
        """Weights overwritten by a full load: their next adapter merges onto what is served then."""
        for name in names:
            self.base.pop(name, None)

    def begin(self) -> None:
        self._pending.clear()
        self._merged = set()

    def merge(
        self,
        adapters: Iterable[tuple[str, torch.Tensor]],
        peft_config: Mapping[str, Any],
        current: Callable[[str], torch.Tensor],
    ) -> list[tuple[str, torch.Tensor]]:
        """The merged weights of every target whose two halves have now arrived.

        Args:
            adapters: ``(peft name, tensor)`` pairs, e.g. ``base_model.model.model.layers.0.mlp.up_proj.lora_A.weight``.
            peft_config: the adapter's peft config as a dict (``LoraConfig.to_dict()``).
            current: the served weight of an HF name (the base snapshot of a target seen for the first time).

        Raises:
            ValueError: a tensor that is not a linear layer's ``lora_A``/``lora_B`` weight, or a config peft
                merges differently (DoRA, LoRA biases, trained modules, bare parameters).
        """
        _refuse_unmergeable(peft_config)
        ready: list[tuple[str, torch.Tensor]] = []
        for name, tensor in adapters:
            match = _HALF.match(name.removeprefix(PEFT_PREFIX))
            if match is None:
                raise ValueError(
                    f"adapter tensor {name!r} is not a linear layer's lora_A/lora_B weight, which is all the hf "
                    "rollout server merges: set actor_rollout_ref.model.lora.merge=true (verl then sends merged "
                    "weights)")
            module = match["module"]
            halves = self._pending.setdefault(module, {})
            halves[match["half"]] = tensor
            if len(halves) < 2:
                continue
            del self._pending[module]
            weight = f"{module}.weight"
            lora_a, lora_b = halves["A"].to(torch.float32), halves["B"].to(torch.float32)
            if weight not in self.base:
                self.set_base(weight, current(weight))
            delta = (lora_b @ lora_a) * _scaling(module, lora_a.shape[0], peft_config)
            if peft_config.get("fan_in_fan_out", False):
                delta = delta.T
            ready.append((weight, self.base[weight] + delta))
            self._merged.add(weight)
        return ready

    def finish(self) -> int:
        """End an adapter sync; returns how many targets it merged.

        Raises:
            RuntimeError: a half without its partner, or a target of an earlier sync left out of this one.
        """
        if self._pending:
            orphans = sorted(f"{module}.lora_{next(iter(halves))}" for module, halves in self._pending.items())
            raise RuntimeError(f"adapter sync ended with {len(orphans)} unpaired LoRA half(s), e.g. {orphans[:3]}")
        if self.targets is None:
            self.targets = set(self._merged)
        missing = sorted(self.targets - self._merged)
        if missing:
            raise RuntimeError(f"adapter sync left out {len(missing)} LoRA target(s) of the first sync, e.g. "
                               f"{missing[:3]}: the served weights would keep stale adapters")
        return len(self._merged)
