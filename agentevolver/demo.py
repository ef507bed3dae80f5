"""Smoke demo of what the foundation provides: ``python -m agentevolver.demo [hydra overrides ...]``.

It walks the path every later capability stands on: compose and validate the config, resolve the policy
model offline (converting the built-in SmolLM2 on first use), render a tool-use prompt with the built-in
chat template, and answer a question greedily. The CPU quickstart runs it until the trainer lands.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from rich.console import Console
from rich.table import Table

from agentevolver.config import load_config
from agentevolver.errors import AgentEvolverError
from agentevolver.module.agent_flow.plugins import plugin_name_errors

#: Demo tool schema (OpenAI function format), rendered into the system turn by the chat template.
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression and return the result.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 12 * 31"}},
            "required": ["expression"],
        },
    },
}


def run(overrides: list[str], question: str, max_new_tokens: int, console: Console) -> str:
    """Run the demo; returns the model's answer to ``question``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentevolver.models import resolve_model_path
    from agentevolver.module.adv_processor.stage import adca_on

    cfg, settings = load_config(overrides, checks=(plugin_name_errors,))
    table = Table(title="config (validated)", show_header=True)
    table.add_column("key")
    table.add_column("value")
    for key, value in [
        ("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path),
        ("algorithm.adv_estimator", cfg.algorithm.adv_estimator),
        ("actor_rollout_ref.rollout.n", cfg.actor_rollout_ref.rollout.n),
        ("env_service.env_url", settings.env_service.env_url),
        ("task_manager.n (Self-Questioning)", settings.task_manager.n),
        ("exp_manager.train_rollout_mode (Self-Navigating)", settings.exp_manager.train_rollout_mode),
        ("ADCA on (Self-Attributing: algorithm.adv_estimator=adca_grpo)",
         adca_on(cfg.algorithm.adv_estimator, settings.attribution_driven_credit_assignment.enable)),
        ("llm.roles.judge", settings.llm.roles["judge"]),
    ]:
        table.add_row(key, str(value))
    console.print(table)

    started = time.perf_counter()
    model_dir = resolve_model_path(str(cfg.actor_rollout_ref.model.path))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    console.print(f"[bold]model[/bold] {model_dir} loaded in {time.perf_counter() - started:.1f} s "
                  f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")

    tools_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 * 31?"}], tools=[CALCULATOR_TOOL],
        add_generation_prompt=True, tokenize=False,
    )
    console.rule("tool-use prompt rendered by the built-in chat template")
    console.print(tools_prompt, markup=False, highlight=False, soft_wrap=True)

    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True,
    )
    started = time.perf_counter()
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    console.rule("greedy answer")
    console.print(f"[bold]Q:[/bold] {question}\n[bold]A:[/bold] {answer}")
    console.print(f"({time.perf_counter() - started:.1f} s on CPU)")
    return answer


def main(argv: list[str] | None = None) -> int:
    """CLI entry; returns the exit status (2 for a user error such as a bad config value)."""
    parser = argparse.ArgumentParser(prog="python -m agentevolver.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--question", default="What is the capital of France?")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. actor_rollout_ref.model.path=tiny-test")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    try:
        run(args.overrides, args.question, args.max_new_tokens, console)
    except AgentEvolverError as err:
        console.print(f"[red]error:[/red] {err}", markup=True, highlight=False)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
