"""Every LLM role with and without structured outputs, played by a locally served model (default SmolLM2-135M).

    .venv/bin/python bench/structured_roles.py [--model smollm2-135m-instruct] [--temperature 0.7]
                                               [--base-url URL] [--roles writer,judge,grader,filter,memory]

Starts ``python -m agentevolver.llm_server`` (or uses ``--base-url``), then runs each role through the
project's own code twice: ``before`` = ``structured_output: off`` (free text, parsed, re-asked with the
error shown, as every role did before) and ``after`` = ``structured_output: json_schema`` (the role's
schema sent as ``response_format``). Per role and mode: parse rate (replies that parsed), re-asks per
request, the share of outputs that are right, and seconds per request (one request = a role's job for one
input, re-asks included; requests run 8 at a time, as roles send them). Inputs (``bench/data``, by hand):

* task writer (``calc``, grounded): 10 exploration records, each a real calc task solved by its reference
  calculator call; right = written tasks whose answer the record proves (:mod:`...task_manager.proof`);
* step judge (ADCA): 10 calc episodes, 24 steps labelled GOOD/BAD by hand; right = labels that match
  (a sample the judge could not label counts as wrong);
* synthetic-task grader (``llm``): the same episodes, whose final answer is right or wrong; right = the
  grader's success verdict (>= 0.5) matches;
* feasibility filter: 10 tasks, 5 doable with a calculator and 5 not; right = the verdict matches;
* experience summariser: extraction from 6 of the episodes (3 successes, 3 failures); no re-asks in
  this role, and no hand label (right: -).

Prints a markdown table with the machine load (``uptime``) before and after; docs/llm_server.md holds
the measured one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from agentevolver.client.llm_client import LLMClients  # noqa: E402
from agentevolver.config import load_config  # noqa: E402
from agentevolver.config.schema import AgentEvolverSettings  # noqa: E402
from agentevolver.memory_service import prompts as memory_prompts  # noqa: E402
from agentevolver.module.adv_processor.judge import JudgeInput, evaluate_step_flags  # noqa: E402
from agentevolver.module.adv_processor.judge_prompt import StepText, Transcript  # noqa: E402
from agentevolver.module.task_manager.deps import ROLE_FILTER, TaskManagerDeps  # noqa: E402
from agentevolver.module.task_manager.filters import LlmFeasibilityFilter  # noqa: E402
from agentevolver.module.task_manager.graders import LlmJudgeGrader  # noqa: E402
from agentevolver.module.task_manager.summarizer import Summarizer  # noqa: E402
from agentevolver.schema import ChatMessage, Reward, Task, TaskObjective, ToolCall, ToolFunction, Trajectory  # noqa: E402

DATA = json.loads((ROOT / "bench" / "data" / "calc_episodes.json").read_text())
#: calc training tasks the writer's records come from (spread over levels, each solved by one call).
WRITER_TASKS = ["train-single-000", "train-single-011", "train-single-022", "train-word-000", "train-word-009",
                "train-chain-000", "train-chain-007", "train-convert-000", "train-convert-005", "train-single-033"]
CONCURRENCY = 8


@dataclass
class Row:
    """One role in one mode: counters summed over its requests."""

    requests: int = 0
    replies: int = 0
    unparsed: int = 0
    right: int = 0
    outputs: int = 0  # what "right" is a share of
    seconds: list[float] = field(default_factory=list)
    notes: Counter[str] = field(default_factory=Counter)  # e.g. the writer's rejection reasons
    samples: list[str] = field(default_factory=list)  # a few outputs, for --show

    def cells(self) -> list[str]:
        parse = f"{self.replies - self.unparsed}/{self.replies}" if self.replies else "-"
        reasks = f"{(self.replies - self.requests) / self.requests:.2f}" if self.requests else "-"
        right = f"{self.right}/{self.outputs}" if self.outputs else "-"
        return [str(self.requests), parse, reasks, right, f"{statistics.mean(self.seconds):.1f}"]


def settings_for(base_url: str, model: str, mode: str, temperature: float, max_tokens: int,
                 demonstrations: bool = True) -> AgentEvolverSettings:
    _cfg, settings = load_config([
        f"task_manager.demonstrations={str(demonstrations).lower()}",
        "env_service.env_type=calc", f"llm.endpoints.local.base_url={base_url}", f"llm.endpoints.local.model={model}",
        f"llm.endpoints.local.structured_output={mode}", f"llm.endpoints.local.temperature={temperature}",
        f"llm.endpoints.local.max_tokens={max_tokens}", "llm.endpoints.local.timeout_s=1800",
        "llm.endpoints.local.max_retries=1", f"llm.endpoints.local.max_concurrency={CONCURRENCY}",
    ])
    return settings


def timed_pool(jobs: list[Callable[[], Any]]) -> list[tuple[Any, float]]:
    def run(job: Callable[[], Any]) -> tuple[Any, float]:
        started = time.perf_counter()
        return job(), time.perf_counter() - started

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(run, jobs))


# -- the roles -----------------------------------------------------------------------------------------------


def writer_record(task_id: str) -> Trajectory:
    """A calc exploration that solved ``task_id`` with its reference call (the real system prompt, the task
    masked as the summariser sees it, the call, the tool's result, the final answer)."""
    from env_service.environments.calc.prompts import SYSTEM_PROMPT
    from env_service.environments.calc.tasks import get_task
    from env_service.environments.calc.tools import run_tool

    task = get_task(task_id)
    result = run_tool(task.solution["name"], task.solution["arguments"]).text
    call = ToolCall(id="c1", function=ToolFunction(name=task.solution["name"],
                                                   arguments=json.dumps(task.solution["arguments"])))
    messages = [ChatMessage(role="system", content=SYSTEM_PROMPT), ChatMessage(role="user", content=task.query),
                ChatMessage(role="assistant", content="", tool_calls=[call]),
                ChatMessage(role="tool", content=result, tool_call_id="c1", name=task.solution["name"]),
                ChatMessage(role="assistant", content=f"FINAL ANSWER: {result}")]
    return Trajectory(task_id=task_id, rollout_id=0, env_type="calc", query=task.query, messages=messages,
                      num_steps=2, metadata={"query_index": 1, "opening_len": 2})


def run_writer(settings: AgentEvolverSettings, llm: LLMClients) -> Row:
    summarizer = Summarizer(TaskManagerDeps(settings=settings, llm=llm))
    outcomes = timed_pool([lambda t=t: summarizer.summarize(Task(task_id=t, env_type="calc"), writer_record(t))
                           for t in WRITER_TASKS])
    row = Row(requests=len(outcomes))
    for outcome, seconds in outcomes:
        row.replies += outcome.replies
        row.unparsed += outcome.unparsed_replies
        row.outputs += outcome.proofs["checked"]
        row.right += outcome.proofs["proved"]
        row.notes.update({k.removeprefix("rejected_"): v for k, v in outcome.proofs.items() if k.startswith("rejected_")})
        row.notes["malformed or copied items"] += outcome.rejected_items
        row.samples += [f"{o.task.query!r} -> {o.task.ground_truth!r}" for o in outcome.objectives]
        row.samples += outcome.errors[:2]
        row.seconds.append(seconds)
    return row


def _transcript(episode: dict[str, Any]) -> Transcript:
    return Transcript(task=episode["task"], steps=tuple(StepText(a, o) for a, o, _ in episode["steps"]))


def run_judge(settings: AgentEvolverSettings, llm: LLMClients) -> Row:
    client = llm.for_role("judge")
    episodes = DATA["episodes"]

    async def one(episode: dict[str, Any]) -> tuple[Any, float]:
        item = JudgeInput(num_steps=len(episode["steps"]), outcome=float(episode["correct"]), grpo_advantage=1.0,
                          success=episode["correct"], transcript=_transcript(episode))
        started = time.perf_counter()
        result = await evaluate_step_flags([item], client, parse_retries=2)
        return result, time.perf_counter() - started

    async def everything() -> list[tuple[Any, float]]:
        return await asyncio.gather(*(one(e) for e in episodes))

    row = Row(requests=len(episodes))
    for episode, (result, seconds) in zip(episodes, asyncio.run(everything()), strict=True):
        replies = result.parse_retries + 1 if result.status[0] in ("judged", "unparseable") else 0
        row.replies += replies
        row.unparsed += replies - (result.status[0] == "judged")
        labels = [label == "GOOD" for _, _, label in episode["steps"]]
        row.outputs += len(labels)
        row.right += sum(a == b for a, b in zip(result.flags[0] or [], labels, strict=False))
        row.seconds.append(seconds)
    return row


def _messages(episode: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": episode["task"]}]
    for action, observation, _ in episode["steps"]:
        messages += [{"role": "assistant", "content": action, "author": "llm"},
                     {"role": "user", "content": observation}]
    return messages


def run_grader(settings: AgentEvolverSettings, llm: LLMClients) -> Row:
    grader = LlmJudgeGrader(settings, llm)
    episodes = DATA["episodes"]

    async def one(episode: dict[str, Any]) -> tuple[Any, float]:
        task = Task(task_id="bench", env_type="calc", query=episode["task"], ground_truth=episode["answer"])
        started = time.perf_counter()
        graded = await grader.agrade(task, _messages(episode), Reward())
        return graded, time.perf_counter() - started

    async def everything() -> list[tuple[Any, float]]:
        return await asyncio.gather(*(one(e) for e in episodes))

    row = Row(requests=len(episodes), outputs=len(episodes))
    for episode, ((reward, metrics), seconds) in zip(episodes, asyncio.run(everything()), strict=True):
        row.replies += int(metrics.get("grader/replies", 0))
        row.unparsed += int(metrics.get("grader/unparsed_replies", 0))
        parsed = not metrics.get("grader/unparsed") and not metrics.get("grader/errors")
        row.right += parsed and (reward.success_rate >= 0.5) == episode["correct"]
        row.seconds.append(seconds)
    return row


def run_filter(settings: AgentEvolverSettings, llm: LLMClients) -> Row:
    judge = LlmFeasibilityFilter(TaskManagerDeps(settings=settings, llm=llm))
    assert judge.client is llm.for_role(ROLE_FILTER)
    cases = DATA["feasibility"]
    objectives = [TaskObjective(task=Task(task_id=f"f{i}", env_type="calc", query=q, ground_truth=a),
                                source="synthetic", seed_task_id="s") for i, (q, a, _) in enumerate(cases)]
    verdicts = timed_pool([lambda o=o: judge.judge(o) for o in objectives])
    row = Row(requests=len(cases), outputs=len(cases))
    for (_q, _a, feasible), (verdict, seconds) in zip(cases, verdicts, strict=True):
        row.replies += verdict.replies
        row.unparsed += verdict.replies - (not verdict.unparsed)
        row.right += not verdict.unparsed and verdict.keep == feasible
        row.seconds.append(seconds)
    return row


def run_memory(settings: AgentEvolverSettings, llm: LLMClients) -> Row:
    client = llm.for_role("exp_summarizer")
    chosen = [e for e in DATA["episodes"] if e["correct"]][:3] + [e for e in DATA["episodes"] if not e["correct"]][:3]
    schema = memory_prompts.extraction_schema(3)

    async def one(episode: dict[str, Any]) -> tuple[Any, float]:
        system = (memory_prompts.SUCCESS_SYSTEM if episode["correct"] else memory_prompts.FAILURE_SYSTEM).format(n=3)
        messages = [ChatMessage(role=m["role"], content=m["content"]) for m in _messages(episode)]
        attempt = memory_prompts.render_trajectory(messages, max_chars=6000, max_message_chars=800)
        user = f"Score of this attempt: {float(episode['correct']):g}\n\nAttempt:\n{attempt}"
        started = time.perf_counter()
        reply = await client.achat([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                   schema=schema)
        return memory_prompts.parse_experiences(reply.text, 3), time.perf_counter() - started

    async def everything() -> list[tuple[Any, float]]:
        return await asyncio.gather(*(one(e) for e in chosen))

    row = Row(requests=len(chosen), replies=len(chosen))
    for found, seconds in asyncio.run(everything()):
        row.unparsed += found is None
        row.seconds.append(seconds)
    return row


ROLES: dict[str, tuple[str, Callable[[AgentEvolverSettings, LLMClients], Row]]] = {
    "writer": ("task writer (calc, grounded)", run_writer),
    "judge": ("step judge (ADCA)", run_judge),
    "grader": ("synthetic-task grader (llm)", run_grader),
    "filter": ("feasibility filter", run_filter),
    "memory": ("experience summariser", run_memory),
}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def measure(base_url: str, args: argparse.Namespace) -> list[list[str]]:
    rows = []
    for key in args.roles.split(","):
        name, run = ROLES[key]
        for label, mode in (("before (free text)", "off"), ("after (json_schema)", "json_schema")):
            settings = settings_for(base_url, args.model, mode, args.temperature, args.max_tokens,
                                    not args.no_demonstrations)
            with LLMClients(settings.llm) as llm:
                row = run(settings, llm)
            rows.append([name, label, *row.cells()])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
            if row.notes:
                print(f"  {name}, {label}: " + ", ".join(f"{k} {v}" for k, v in sorted(row.notes.items())),
                      file=sys.stderr, flush=True)
            if args.show:
                for sample in row.samples[:args.show]:
                    print(f"    {sample}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--base-url", default=None, help="an already running server (default: start one)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--roles", default=",".join(ROLES))
    parser.add_argument("--no-demonstrations", action="store_true",
                        help="task writer without the worked example (task_manager.demonstrations=false)")
    parser.add_argument("--show", type=int, default=0, help="print this many outputs per role and mode")
    args = parser.parse_args()
    load_before = uptime()
    started = time.perf_counter()
    if args.base_url:
        rows = measure(args.base_url, args)
    else:
        from test_llm_server import llm_server

        with tempfile.TemporaryDirectory() as tmp, llm_server(Path(tmp), "--max-concurrency", str(CONCURRENCY),
                                                              model=args.model) as server:
            rows = measure(server.base_url, args)
    print(f"\n{args.model}, temperature {args.temperature}, max_tokens {args.max_tokens}, {CONCURRENCY} requests "
          f"in flight; {time.perf_counter() - started:.0f} s in all")
    print(f"load before: {load_before}\nload after:  {uptime()}\n")
    print("| role | mode | requests | parse rate (replies) | re-asks / request | right | s / request |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
