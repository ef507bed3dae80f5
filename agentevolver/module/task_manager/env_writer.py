"""The environment as task writer (``task_manager.writer: env``): tasks rendered from observations, no LLM.

Why: Self-Questioning has two parts whose effects an ablation must tell apart, exploring the environment
and *writing* tasks from what was seen. With a small writer model (SmolLM2-135M on calc: 0 tasks kept of
8 explorations, docs/task_manager.md) the second part measures the model, not the idea. Where an
exploration's observations determine a task completely (calc: the calculator was called with ``17 * 23``
and returned ``391``), the environment's profile can write the task itself: each successful tool call the
explorer made becomes a question in the style of the environment's own tasks ("What is 17 * 23?"), its
observed result the answer, the observation the evidence. The profile declares how (``env_writer``:
:class:`~agentevolver.module.task_manager.profile.EnvWriterSpec`).

The rendered tasks are not trusted for being rendered: they go through the same proof check
(:func:`.summarizer.add_objectives` -> :func:`.proof.prove`), real-time filters and post filters as an LLM's.
What the rendering itself drops, counted in :attr:`Rendering.counts` and shown in the run's report:

* ``calls_failed``: the tool returned an error (a ``failure_prefixes`` result) or, for number answers, not
  exactly one number;
* ``calls_not_rendered``: a tool the profile gives no template, or a call lacking an argument a template needs;
* ``calls_merged``: the same call again in one exploration (one task, not two);
* ``seed_copies``: one of the call's renderings is the seed task's own question, word for word (the explorer
  solved the seed, and "Compute 65 - 59." would restate "What is 65 - 59?"; an LLM writer never sees that
  text, because its record is masked). A word problem's arithmetic ("What is 12 * 5?" from a story about
  12 muffins a day for 5 days) is a different question and is kept;
* ``over_limit``: beyond ``task_manager.tasks_per_exploration`` (the same ceiling the LLM writer is asked for).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentevolver.errors import ConfigError
from agentevolver.module.task_manager.deps import TaskManagerDeps
from agentevolver.module.task_manager.profile import AnswerProof, CallRendering, EnvWriterSpec
from agentevolver.module.task_manager.proof import Observation, observations
from agentevolver.module.task_manager.summarizer import SummaryOutcome, add_objectives
from agentevolver.schema import Task, Trajectory
from agentevolver.text_numbers import one_number

__all__ = ["EnvWriter", "RenderedTask", "Rendering", "format_expression", "render_tasks"]

#: Rendering counters, in the order the report shows them.
RENDER_COUNTS = ("calls_seen", "calls_failed", "calls_not_rendered", "calls_merged", "seed_copies", "over_limit",
                 "tasks_rendered")

_TOKEN = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+|\*\*|[-+*/^×÷·−]|[()]|[^\s\d()]+")
_BINARY = {"+", "-", "*", "/", "**", "^", "×", "÷", "·", "−"}


@dataclass(frozen=True)
class RenderedTask:
    """One task the environment wrote: the fields the proof check reads (as an LLM writer's item has them)."""

    query: str
    answer: str
    evidence: str
    call: str
    confidence: float | None = None


@dataclass
class Rendering:
    """The tasks rendered from one exploration, and what the rendering skipped (see the module docstring)."""

    tasks: list[RenderedTask] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)


def format_expression(text: str) -> str:
    """An arithmetic expression as the environment's own tasks write it: one space around each binary
    operator, none inside parentheses or after a sign ("12*(3+4)" -> "12 * (3 + 4)", "-5+3" -> "-5 + 3");
    a trailing ``=`` is dropped (the calculator ignores it too)."""
    out: list[str] = []
    previous = ""  # "", "value", "operator", "(" or ")"
    for token in _TOKEN.findall(text.strip().rstrip("=").strip()):
        if token in ("+", "-", "−") and previous in ("", "operator", "("):
            out.append(token)  # a sign, written against its number
            previous = "operator"
        elif token in _BINARY:
            out.append(f" {token} ")
            previous = "operator"
        else:
            out.append(token)
            previous = token if token in "()" else "value"
    return "".join(out).strip()


def render_tasks(record: Sequence[Observation], spec: EnvWriterSpec, rules: AnswerProof, *,
                 seed_query: str | None = None, limit: int | None = None) -> Rendering:
    """Each successful, renderable tool call of ``record`` (in order) -> a task (see the module docstring).

    ``rules`` is the profile's ``answers``: for ``kind: number`` a successful result is exactly one number.
    """
    rendering = Rendering()
    seen: set[str] = set()
    failures = tuple(prefix.casefold() for prefix in spec.failure_prefixes)
    seed_text = _plain(seed_query) if seed_query else None
    for obs in record:
        if obs.call is None or obs.tool is None:
            continue  # not a tool result (a nudge, the environment's reply to plain text)
        rendering.counts["calls_seen"] += 1
        result = obs.text.strip()
        if not _succeeded(result, failures, rules):
            rendering.counts["calls_failed"] += 1
            continue
        how = spec.calls.get(obs.tool)
        values = _argument_values(obs.arguments, how) if how is not None else None
        if how is None or values is None or not how.fields() <= values.keys():
            rendering.counts["calls_not_rendered"] += 1
            continue
        key = json.dumps([obs.tool, sorted((k, v) for k, v in values.items() if k in how.fields())])
        if key in seen:
            rendering.counts["calls_merged"] += 1
            continue
        seen.add(key)
        template = how.templates[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(how.templates)]
        query = template.format(**values)
        if seed_text is not None and any(_plain(t.format(**values)) == seed_text for t in how.templates):
            rendering.counts["seed_copies"] += 1
            continue
        if limit is not None and len(rendering.tasks) >= limit:
            rendering.counts["over_limit"] += 1
            continue
        answer = one_number(result) if rules.kind == "number" else result
        rendering.tasks.append(RenderedTask(query=query, answer=answer, evidence=f"{obs.call} -> {result}",
                                            call=obs.call))
    rendering.counts["tasks_rendered"] = len(rendering.tasks)
    return rendering


class EnvWriter:
    """Writes task objectives from trajectories with the profile's ``env_writer`` (no LLM; thread-safe).

    The same interface as :class:`.summarizer.Summarizer`, so the manager runs either one.
    """

    def __init__(self, deps: TaskManagerDeps) -> None:
        self.deps = deps
        profile = deps.profile
        if profile.env_writer is None or profile.answers is None:
            where = deps.section.env_profile or f"the shipped profile profiles/{deps.env_type}.json"
            raise ConfigError(
                f"task_manager.writer is 'env' but the environment profile of {deps.env_type!r} ({where}) declares "
                "no env_writer (how the environment renders a task from an exploration); set task_manager.writer=llm, "
                "or add an env_writer section with answers to the profile and point task_manager.env_profile at it "
                "(docs/task_manager.md, 'The task writer')")
        self.spec: EnvWriterSpec = profile.env_writer
        self.rules: AnswerProof = profile.answers

    def summarize(self, seed: Task, trajectory: Trajectory) -> SummaryOutcome:
        """Render the exploration's successful calls, then prove and build objectives like an LLM's tasks."""
        rendering = render_tasks(observations(trajectory), self.spec, self.rules, seed_query=trajectory.query,
                                 limit=self.deps.section.tasks_per_exploration)
        outcome = SummaryOutcome(objectives=[], rendered=rendering.counts)
        add_objectives(self.deps, seed, trajectory, rendering.tasks, outcome)
        return outcome

    def identity(self) -> str:
        """Who writes the tasks, for the run's report."""
        tools = ", ".join(sorted(self.spec.calls))
        return f"env: the {self.deps.env_type} profile renders each successful {tools} call (no LLM)"


def _succeeded(result: str, failures: tuple[str, ...], rules: AnswerProof) -> bool:
    if not result or result.casefold().startswith(failures):
        return False
    return rules.kind != "number" or one_number(result) is not None


def _argument_values(arguments: Any, how: CallRendering) -> dict[str, str] | None:
    """The call's arguments as the text a template shows (None when they are not a JSON object)."""
    if not isinstance(arguments, dict):
        return None
    words = {key.casefold(): value for key, value in how.words.items()}
    values: dict[str, str] = {}
    for name, value in arguments.items():
        if isinstance(value, bool) or value is None or isinstance(value, dict | list):
            continue
        if isinstance(value, int | float):
            text = f"{value:.12g}"
        else:
            text = " ".join(str(value).split())
            if name in how.expressions:
                text = format_expression(text)
            text = words.get(text.casefold(), text)
        if text:
            values[name] = text
    return values


def _plain(text: str) -> str:
    return " ".join(text.casefold().strip(" .?!").split())
