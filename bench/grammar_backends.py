"""Grammar-constrained decoding libraries compared on this CPU: xgrammar vs llguidance (the two vLLM ships).

    .venv/bin/python bench/grammar_backends.py [--model smollm2-135m-instruct] [--samples 10] [--max-tokens 96]

For each library, with the model's real tokenizer: the one-off tokenizer set-up, the compile time of the
role schemas this project sends (task writer with string length limits, step judge with a fixed array
length, grader with number ranges), then ``--samples`` sampled replies (temperature 1.0) per schema from a
plain KV-cache decode loop, batch 1: how many replies validate against their schema (``jsonschema``), and
the cost of the token mask per generated token (compute + apply) against the model's forward pass.
Why this exists: the issue asked to measure before choosing the library; the result is in
docs/llm_server.md ("Structured outputs").
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import jsonschema
import torch

SCHEMAS: dict[str, dict[str, Any]] = {
    "task_writer": {
        "type": "object",
        "properties": {"tasks": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object",
            "properties": {"query": {"type": "string", "minLength": 8, "maxLength": 160},
                           "answer": {"type": "string", "minLength": 1, "maxLength": 40},
                           "evidence": {"type": "string", "minLength": 1, "maxLength": 120}},
            "required": ["query", "answer", "evidence"], "additionalProperties": False}}},
        "required": ["tasks"], "additionalProperties": False,
    },
    "step_judge": {
        "type": "object",
        "properties": {"judgments": {"type": "array", "minItems": 3, "maxItems": 3,
                                     "items": {"type": "string", "enum": ["GOOD", "BAD"]}}},
        "required": ["judgments"], "additionalProperties": False,
    },
    "grader": {
        "type": "object",
        "properties": {"relevance": {"type": "number", "minimum": 0, "maximum": 1},
                       "success": {"type": "number", "minimum": 0, "maximum": 1},
                       "efficiency": {"type": "number", "minimum": 0, "maximum": 1},
                       "reason": {"type": "string", "maxLength": 120}},
        "required": ["relevance", "success", "efficiency", "reason"], "additionalProperties": False,
    },
}

PROMPT = ("A calculator agent computed 17 * 23 = 391, then 391 - 100 = 291. Reply with JSON only, matching "
          "this schema: {schema}")


class XGrammar:
    name = "xgrammar 0.2.8"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        started = time.perf_counter()
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.setup_s = time.perf_counter() - started
        self.vocab_size = vocab_size

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, matcher: Any, logits: torch.Tensor) -> None:
        bitmask = self.xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(bitmask, 0)
        self.xgr.apply_token_bitmask_inplace(logits, bitmask)

    def accept(self, matcher: Any, token: int) -> None:
        assert matcher.accept_token(token)

    def done(self, matcher: Any) -> bool:
        return matcher.is_terminated()


class LLGuidance:
    name = "llguidance 1.9.1"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import llguidance
        import llguidance.hf

        self.llg = llguidance
        started = time.perf_counter()
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.setup_s = time.perf_counter() - started
        self.vocab_size = vocab_size
        self.bits = torch.arange(32, dtype=torch.int32)

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False})
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)  # compiles on construction
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return grammar

    def matcher(self, compiled: Any) -> Any:
        return self.llg.LLMatcher(self.tokenizer, compiled)

    def mask(self, matcher: Any, logits: torch.Tensor) -> None:
        words = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32)
        allowed = ((words[:, None] >> self.bits) & 1).reshape(-1)[: logits.shape[-1]].bool()
        logits.masked_fill_(~allowed, float("-inf"))

    def accept(self, matcher: Any, token: int) -> None:
        assert matcher.consume_token(token), matcher.get_error()

    def done(self, matcher: Any) -> bool:
        return matcher.is_stopped()


def sample(model: Any, tokenizer: Any, backend: Any, compiled: Any, prompt: list[int], max_tokens: int,
           eos: set[int], rng: torch.Generator) -> tuple[str, float, float, int]:
    """One constrained reply: (text, mask seconds, forward seconds, tokens)."""
    from transformers import DynamicCache

    matcher = backend.matcher(compiled)
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt])
    out: list[int] = []
    mask_s = forward_s = 0.0
    for _ in range(max_tokens):
        started = time.perf_counter()
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1, :].float()
        forward_s += time.perf_counter() - started
        started = time.perf_counter()
        backend.mask(matcher, logits)
        mask_s += time.perf_counter() - started
        token = int(torch.multinomial(torch.softmax(logits, dim=-1)[0], 1, generator=rng))
        started = time.perf_counter()
        backend.accept(matcher, token)
        mask_s += time.perf_counter() - started
        out.append(token)
        if token in eos or backend.done(matcher):
            break
        ids = torch.tensor([[token]])
    return tokenizer.decode(out, skip_special_tokens=True), mask_s, forward_s, len(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentevolver.models import resolve_model_path

    torch.set_num_threads(args.threads)
    folder = resolve_model_path(args.model)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    eos = {tokenizer.eos_token_id}
    rng = torch.Generator().manual_seed(0)
    rows = []
    for backend_cls in (XGrammar, LLGuidance):
        backend = backend_cls(tokenizer, int(model.config.vocab_size))
        for name, schema in SCHEMAS.items():
            started = time.perf_counter()
            compiled = backend.compile(schema)
            compile_s = time.perf_counter() - started
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": PROMPT.format(schema=json.dumps(schema))}],
                add_generation_prompt=True, tokenize=False)
            prompt = tokenizer.encode(text, add_special_tokens=False)
            valid = tokens = 0
            mask_s = forward_s = 0.0
            with torch.inference_mode():
                for _ in range(args.samples):
                    reply, m, f, n = sample(model, tokenizer, backend, compiled, prompt, args.max_tokens, eos, rng)
                    mask_s, forward_s, tokens = mask_s + m, forward_s + f, tokens + n
                    try:
                        jsonschema.validate(json.loads(reply), schema)
                        valid += 1
                    except (ValueError, jsonschema.ValidationError):
                        pass
            rows.append((backend.name, f"{backend.setup_s:.2f}", name, f"{1000 * compile_s:.0f}",
                         f"{valid}/{args.samples}", f"{1000 * mask_s / tokens:.2f}",
                         f"{1000 * forward_s / tokens:.1f}", f"{tokens / args.samples:.0f}"))
    print("| library | tokenizer set-up (s) | schema | compile (ms) | valid | mask ms/token | forward ms/token "
          "| tokens/reply |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
