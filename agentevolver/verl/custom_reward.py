"""verl's ``reward.custom_reward_function`` for agent episodes: the way verl users plug in a reward.

verl runs a custom reward function only for rollouts that come back without a score, and our agent loop
always scores its episodes (the environment's ``/evaluate``, or a synthetic task's grader). So the agent
loop calls :func:`apply_custom_reward` on every finished episode; when ``reward.custom_reward_function.path``
is set, the function's score **replaces** the episode's outcome. Precedence, last one wins:

1. the environment's score (``/evaluate``, sparse or dense per ``agent_flow.sparse_reward``);
2. the madness penalty (``agent_flow.madness.penalize``) and, for a synthetic task, its grader's score;
3. the custom reward function, which sees 1-2 in ``extra_info`` and decides (return ``extra_info
   ["env_score"]`` to keep it, add a bonus, ignore it ...).

The function is loaded and called with verl's own contract, so a file written for verl works unchanged:
loaded by ``verl.trainer.ppo.reward.get_custom_reward_fn`` (``path``, ``name`` default ``compute_score``,
``reward_kwargs`` merged into every call), called as ``compute_score(data_source=..., solution_str=...,
ground_truth=..., extra_info=...)``, sync (run in a thread) or ``async``, returning a float or a dict with
``"score"``. For an episode:

* ``data_source``: the environment name (``env_service.env_type``);
* ``solution_str``: the episode's final sample's response decoded without special tokens (every assistant
  turn and observation after the first prompt), as verl's naive reward manager decodes a response;
* ``ground_truth``: the dataset row's ``reward_model.ground_truth`` when there is one, else the task's
  reference answer (synthetic tasks), else None;
* ``extra_info``: the row's ``extra_info`` plus ``task_id``, ``query``, ``rollout_id``, ``group_id``,
  ``termination``, ``error``, ``num_turns``, ``env_score`` (the outcome from 1-2), ``success_rate``,
  ``madness``, ``evaluator``, ``reward_description``, ``messages`` (the conversation as dicts) and
  ``metrics``.

The episode's ``success_rate`` (and with it ``episode/success_rate`` and validation accuracy) stays the
environment's. ``reward/before_custom`` and the numeric extra keys of a dict result
(``reward/custom/<key>``) go into the episode's metrics (rollout dumps). A function that raises or returns
something other than a finite number stops the run with the function and the task named: a broken reward is
a bug, not an episode failure.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from agentevolver.errors import AgentEvolverError, ConfigError
from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec

__all__ = ["CONFIG_KEY", "CustomReward", "RewardFunctionError", "apply_custom_reward", "check_custom_reward",
           "load_custom_reward", "reward_inputs"]

#: Where the function is configured (verl's key).
CONFIG_KEY = "reward.custom_reward_function"

_CACHE_LOCK = threading.Lock()
_CACHE: dict[str, CustomReward | None] = {}


class RewardFunctionError(AgentEvolverError, RuntimeError):
    """The custom reward function raised or returned something that is not a score."""


@dataclass(frozen=True)
class CustomReward:
    """A loaded custom reward function (``fn`` already merges ``reward_kwargs``, as verl wraps it)."""

    path: str
    name: str
    fn: Callable[..., Any]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.path})"

    async def score(self, **inputs: Any) -> tuple[float, dict[str, Any]]:
        """Call the function; ``(score, extra keys of a dict result)``."""
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await self.fn(**inputs)
            else:
                value = await asyncio.to_thread(self.fn, **inputs)
        except Exception as err:
            raise RewardFunctionError(
                f"{CONFIG_KEY} {self.label} raised {type(err).__name__}: {err} "
                f"(task {inputs.get('extra_info', {}).get('task_id')!r})") from err
        return _score_of(value, self.label)


def _score_of(value: Any, label: str) -> tuple[float, dict[str, Any]]:
    extra: dict[str, Any] = {}
    if isinstance(value, Mapping):
        if "score" not in value:
            raise RewardFunctionError(f"{CONFIG_KEY} {label} returned a dict without 'score' (keys: "
                                      f"{sorted(value)}); return a number or a dict with 'score'")
        extra = {str(k): v for k, v in value.items() if k != "score"}
        value = value["score"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            value = float(value)  # numpy / torch scalars
        except (TypeError, ValueError):
            raise RewardFunctionError(f"{CONFIG_KEY} {label} returned {type(value).__name__}; expected a number "
                                      "or a dict with 'score'") from None
    score = float(value)
    if not math.isfinite(score):
        raise RewardFunctionError(f"{CONFIG_KEY} {label} returned {score}; a score must be finite")
    return score, extra


def _section(config: Any) -> dict[str, Any]:
    node = OmegaConf.select(config, CONFIG_KEY) if OmegaConf.is_config(config) else None
    if node is None:
        return {}
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


def load_custom_reward(config: Any) -> CustomReward | None:
    """The configured function (cached per process and setting), or None when ``path`` is not set.

    Loaded through verl's ``get_custom_reward_fn``, so ``reward_kwargs`` are merged exactly as verl merges
    them. A missing file or function is a :class:`ConfigError` naming the key.
    """
    section = _section(config)
    path = section.get("path")
    if not path:
        return None
    key = json.dumps(section, sort_keys=True, default=str)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    name = section.get("name") or "compute_score"
    if not Path(str(path)).expanduser().is_file():
        raise ConfigError(f"{CONFIG_KEY}.path: no such file {path!r} (seen from this node; every node that runs "
                          "agent-loop workers must see it)")
    from verl.trainer.ppo.reward import get_custom_reward_fn

    try:
        fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {**section, "name": name}}}))
    except (AttributeError, ImportError, RuntimeError, SyntaxError) as err:
        raise ConfigError(f"{CONFIG_KEY}: cannot load {name!r} from {path!r}: {err}") from err
    loaded = CustomReward(path=str(path), name=str(name), fn=fn)
    with _CACHE_LOCK:
        _CACHE[key] = loaded
    return loaded


def check_custom_reward(config: Any) -> CustomReward | None:
    """Start-up check (driver or task runner): the function loads and accepts verl's four keyword arguments.

    Returns the loaded function (None when none is configured); raises :class:`ConfigError` otherwise, so a
    typo fails before any worker starts instead of in the first episode.
    """
    loaded = load_custom_reward(config)
    if loaded is None:
        return None
    from verl.trainer.ppo import reward as verl_reward

    target = loaded.fn
    # verl's private wrapper, partial(_call_with_kwargs, raw_fn, reward_kwargs): seam 5 of agentevolver.verl.patches,
    # whose guard (run on the driver) checks that these names and that layout still hold.
    if isinstance(target, functools.partial) and target.func in (verl_reward._call_with_kwargs,
                                                                 verl_reward._call_with_kwargs_async):
        target = target.args[0]
    try:
        inspect.signature(target).bind(data_source="x", solution_str="", ground_truth=None, extra_info={},
                                       **dict(_section(config).get("reward_kwargs") or {}))
    except TypeError as err:
        raise ConfigError(f"{CONFIG_KEY}: {loaded.label} must accept the keyword arguments data_source, "
                          f"solution_str, ground_truth, extra_info (and reward_kwargs): {err}") from err
    except ValueError:  # builtins without a signature: call-time errors will say what is wrong
        pass
    return loaded


def reward_inputs(result: EpisodeResult, spec: EpisodeSpec, row: Mapping[str, Any], tokenizer: Any) -> dict[str, Any]:
    """The four keyword arguments of verl's reward contract for one episode (see the module docstring)."""
    sample = result.final_sample
    response = list(sample.response_ids) if sample is not None else []
    solution = tokenizer.decode(response, skip_special_tokens=True) if response else ""
    reward_model = row.get("reward_model")
    ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
    if ground_truth is None:
        ground_truth = spec.task.ground_truth if spec.task is not None else None
    extra_info = dict(row.get("extra_info") or {}) if isinstance(row.get("extra_info"), Mapping) else {}
    extra_info.update({
        "task_id": result.task_id,
        "query": spec.query,
        "rollout_id": result.rollout_id,
        "group_id": result.group_id,
        "termination": result.termination,
        "error": result.error,
        "num_turns": result.num_turns,
        "env_score": result.reward.outcome,
        "success_rate": result.reward.success_rate,
        "madness": result.reward.madness,
        "evaluator": spec.task.evaluator if spec.task is not None else "env",
        "reward_description": result.reward.description,
        "messages": result.messages,
        "metrics": dict(result.metrics),
    })
    return {"data_source": result.env_type, "solution_str": solution, "ground_truth": ground_truth,
            "extra_info": extra_info}


async def apply_custom_reward(result: EpisodeResult, spec: EpisodeSpec, row: Mapping[str, Any], config: Any,
                              tokenizer: Any) -> EpisodeResult:
    """The episode with the custom function's score as its outcome; unchanged when none is configured."""
    custom = load_custom_reward(config)
    if custom is None:
        return result
    score, extra = await custom.score(**reward_inputs(result, spec, row, tokenizer))
    before = result.reward
    metrics = {**result.metrics, "reward/before_custom": float(before.outcome)}
    for key, value in extra.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            metrics[f"reward/custom/{key}"] = float(value)
    reward = before.model_copy(update={
        "outcome": score,
        "description": f"{custom.name}: {score:g} (before: {before.outcome:g}; {before.description})".strip(),
    })
    return result.model_copy(update={"reward": reward, "metrics": metrics})
