"""The reference AgentEvolver's config keys and launcher flags, and what each is called here.

One declarative table drives three things: ``python -m agentevolver.config migrate`` (rewrite a reference
config), the refusal of a reference-style config or ``+old.key=`` override at start-up (one message that
names every old key and its new name), and the launcher's handling of the reference's ``--with-*`` flags.
The table comes from comparing the reference's ``config/agentevolver.yaml``, ``examples/basic.yaml`` and
``examples/overall.yaml`` and its ``launcher.py`` with ``config/agentevolver.yaml`` here; keys that both
systems spell alike (verl's own keys, most of ``exp_manager`` and ``task_manager``) are not listed: they
keep their path and meaning. docs/configuration.md ("Migrating a reference config") prints this table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULTS_DROPPED",
    "KEY_RULES",
    "NOTHING",
    "REFERENCE_FLAGS",
    "REFERENCE_SEARCHPATH",
    "FlagRule",
    "KeyRule",
    "rule_for",
    "same_value",
]


class _Nothing:
    """Marks a reference value that needs no key here (what it asked for is what this project does)."""

    def __repr__(self) -> str:
        return "NOTHING"


#: Value-map target: this old value needs no key here.
NOTHING = _Nothing()

#: ``(value, whole old config) -> True`` when dropping the value changes nothing here.
Lossless = Callable[[Any, Mapping[str, Any]], bool]


def _always(_value: Any, _tree: Mapping[str, Any]) -> bool:
    return True


def _never(_value: Any, _tree: Mapping[str, Any]) -> bool:
    return False


def _is(expected: Any) -> Lossless:
    """Equal to ``expected``, where True is not 1 and None is only None."""
    return lambda value, _tree: same_value(value, expected)


def same_value(value: Any, expected: Any) -> bool:
    """``value == expected`` without YAML's bool/number confusion (True == 1 in Python)."""
    if isinstance(value, bool) or isinstance(expected, bool) or value is None or expected is None:
        return value is expected
    return bool(value == expected)


def _falsy(value: Any, _tree: Mapping[str, Any]) -> bool:
    return not value


def _matches_pos_scale(value: Any, tree: Mapping[str, Any]) -> bool:
    """The reference weighed disagreeing steps of successes and failures apart; here one weight does both."""
    adca = tree.get("attribution_driven_credit_assignment") or {}
    pos = adca.get("pos_unconsistent_scale", 0.2) if isinstance(adca, Mapping) else 0.2
    try:
        return abs(float(value)) == abs(float(pos))
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class KeyRule:
    """One reference key (a node covers all keys below it) and what became of it.

    ``values`` (looked up first) translates reference values whose spelling changed; a value may become
    several keys (``{path: value}``) or ``NOTHING``. ``new`` set: the key moved there (a node moves with its
    children). ``new`` None: no key here; ``dropped_when`` says for which values that loses nothing ("dropped"),
    every other value is reported as "no equivalent" with ``note`` saying what to do instead.
    ``exact`` False: the closest setting here, not the same behaviour (the note says how it differs).
    """

    old: str
    new: str | None
    note: str = ""
    values: Mapping[Any, Any] = field(default_factory=dict)
    dropped_when: Lossless = _never
    exact: bool = True


def _moved(old: str, new: str, note: str = "", values: Mapping[Any, Any] | None = None,
           exact: bool = True) -> KeyRule:
    return KeyRule(old, new, note, dict(values or {}), exact=exact)


def _dropped(old: str, why: str) -> KeyRule:
    return KeyRule(old, None, why, dropped_when=_always)


def _no_equivalent(old: str, todo: str, dropped_when: Lossless = _never) -> KeyRule:
    return KeyRule(old, None, todo, dropped_when=dropped_when)


_ROLLOUT = "actor_rollout_ref.rollout"
_ADCA = "attribution_driven_credit_assignment"
_GRADER = "task_manager.grader"


def _grader(scoring: str, reference: bool) -> dict[str, Any]:
    return {f"{_GRADER}.synthetic_grader": "llm", f"{_GRADER}.scoring": scoring,
            f"{_GRADER}.use_reference_answer": reference}


#: Every reference config key that is spelled differently here or has no counterpart (ordered as in the
#: reference's config/agentevolver.yaml).
KEY_RULES: tuple[KeyRule, ...] = (
    _moved("data.val_type", "env_service.val_split",
           "the validation split's name in the environment service (appworld: val = AppWorld's dev, "
           "test = test_normal)", {"test_normal": "test"}),
    KeyRule(f"{_ROLLOUT}.use_qwen3", None,
            "Qwen3's '/no_think' is a chat-template switch here",
            {True: {"agent_flow.context.chat_template_kwargs.enable_thinking": False}, False: NOTHING}),
    _dropped(f"{_ROLLOUT}.enable_request_id", "generation requests are tracked per episode here"),
    _dropped(f"{_ROLLOUT}.debug_llm_io",
             "debug printing; every episode's messages are written by agent_flow.dump (include_messages)"),
    _dropped(f"{_ROLLOUT}.multi_turn.completion_callback",
             "the episode loop is the agent loop named by actor_rollout_ref.rollout.agent.default_agent_loop"),
    _moved(f"{_ROLLOUT}.multi_turn.max_steps", "agent_flow.max_steps"),
    _dropped(f"{_ROLLOUT}.custom_dataflow_cls", "read by no code in the reference either"),
    _no_equivalent(f"{_ROLLOUT}.max_env_worker",
                   "episodes run concurrently in verl's agent-loop workers "
                   "(actor_rollout_ref.rollout.agent.num_workers); env_service.max_connections caps the "
                   "connections to the environment service"),
    _moved(f"{_ROLLOUT}.context_template", "agent_flow.context_template", "",
           {"context_selfclip": "self_clip"}),
    _no_equivalent(f"{_ROLLOUT}.context_template_train_sp_action",
                   "the reference's special-action training of its clip context manager has no counterpart",
                   dropped_when=_falsy),
    _moved(f"{_ROLLOUT}.max_env_len", "agent_flow.context.max_env_len"),
    _moved(f"{_ROLLOUT}.sparse", "agent_flow.sparse_reward"),
    _moved("actor_rollout_ref.actor.off_cliprange_high", "exp_manager.off_cliprange_high"),
    _no_equivalent("env_service.env_feedin_preference",
                   "each environment formats its own observations here; its options go in "
                   "env_service.create_params (docs/env_<name>.md)"),
    _no_equivalent("thread_pool",
                   "pools are sized where they are used: task_manager.num_explore_threads (explorations at "
                   "once), llm.endpoints.<name>.max_concurrency (LLM requests at once)"),
    _no_equivalent("task_manager.train_data_path",
                   "generated tasks are kept in task_manager.synthetic_tasks_path (JSON lines of this "
                   "project's task format; a reference task file cannot be read)"),
    _dropped("task_manager.val_data_path", "validation uses the environment's own tasks only"),
    _no_equivalent("task_manager.llm_client",
                   "the Self-Questioning LLMs are the roles task_explorer, task_summarizer, task_filter and "
                   "task_grader: point each at an endpoint in llm.endpoints that serves your model (docs/llm.md)"),
    _no_equivalent("task_manager.bs", "the task batch is data.train_batch_size",
                   dropped_when=_is("${data.train_batch_size}")),
    _moved("task_manager.strategy_args.max_explore_step", "task_manager.max_explore_step"),
    _no_equivalent("task_manager.strategy_args.max_llm_retries",
                   "llm.roles.task_explorer -> llm.endpoints.<name>.max_retries (docs/llm.md)"),
    _no_equivalent("task_manager.strategy_args.env_url", "exploration acts in env_service.env_url",
                   dropped_when=_is("${env_service.env_url}")),
    _no_equivalent("task_manager.strategy_args.exploration_llm_temperature",
                   "llm.roles.task_explorer -> llm.endpoints.<name>.temperature (docs/llm.md)"),
    _no_equivalent("task_manager.strategy_args.exploration_llm_top_p",
                   "not configurable here (the endpoint's default top_p)"),
    _no_equivalent("task_manager.strategy_args.exploration_llm_top_k",
                   "not configurable here (the endpoint's default top_k)"),
    _moved(f"{_GRADER}.synthetic_grader", f"{_GRADER}.synthetic_grader",
           "the reference's grader names are the `llm` grader with task_manager.grader.scoring (binary | "
           "graded) and use_reference_answer (the '-gt' variants); '-no_constraint' and 'avg-' (an average of "
           "several judgements) have no counterpart",
           {"llm-binary-gt-no_constraint": _grader("binary", True), "llm-binary-gt": _grader("binary", True),
            "llm-binary-no_constraint": _grader("binary", False), "llm-binary": _grader("binary", False),
            "llm-gt": _grader("graded", True),
            "avg-llm-binary-gt": _grader("binary", True), "avg-llm": _grader("graded", False)},
           exact=False),
    _moved("exp_manager.reme", "memory"),
    _dropped(f"{_ADCA}.evaluation_type",
             "the step judge is always an OpenAI-compatible endpoint (llm.roles.judge), local or hosted"),
    _no_equivalent(f"{_ADCA}.consistent_scale",
                   "steps whose label agrees with the outcome weigh 1 in the allocation scheme",
                   dropped_when=_is(1.0)),
    _moved(f"{_ADCA}.pos_unconsistent_scale", f"{_ADCA}.adca_grpo.allocation_inconsistent_weight",
           "one weight for every step whose label disagrees with its trajectory's outcome"),
    _no_equivalent(f"{_ADCA}.neg_unconsistent_scale",
                   f"one weight for both kinds of disagreeing step: {_ADCA}.adca_grpo."
                   "allocation_inconsistent_weight (taken from pos_unconsistent_scale)",
                   dropped_when=_matches_pos_scale),
    _no_equivalent(f"{_ADCA}.concurrent", "llm.roles.judge -> llm.endpoints.<name>.max_concurrency (docs/llm.md)"),
    _no_equivalent(f"{_ADCA}.model", "llm.roles.judge -> llm.endpoints.<name>.model (docs/llm.md)"),
    _no_equivalent(f"{_ADCA}.api_max_retries", "llm.roles.judge -> llm.endpoints.<name>.max_retries (docs/llm.md)"),
    _no_equivalent(f"{_ADCA}.llm_evaluation_log_dir", "judge prompts and replies are not written to files here",
                   dropped_when=_is(None)),
    _no_equivalent(f"{_ADCA}.adca_grpo.do_batch_norm", "the process and outcome rewards are always z-scored",
                   dropped_when=_is(True)),
    _dropped(f"{_ADCA}.adca_grpo.enable_adca_metric", "the adca/* metrics are always logged"),
)

#: Defaults-list entries of reference presets that go away, and why.
DEFAULTS_DROPPED: Mapping[str, str] = {
    "ppo_trainer": "config/agentevolver.yaml already includes verl's ppo_trainer; listing both fails with "
                   "'model_engine appears more than once in the final defaults list'",
}

#: ``hydra.searchpath`` entries of reference presets: this project's search-path plugin adds its config/
#: folder and verl's trainer configs to every search path.
REFERENCE_SEARCHPATH: tuple[str, ...] = ("file://external/config_fallback", "file://config")


def rule_for(path: str) -> tuple[KeyRule, str] | None:
    """The rule covering a dotted key ``path`` and the path below the rule's key ("" when it is the key)."""
    best: tuple[KeyRule, str] | None = None
    for rule in KEY_RULES:
        if path == rule.old:
            return rule, ""
        if path.startswith(rule.old + ".") and (best is None or len(rule.old) > len(best[0].old)):
            best = (rule, path[len(rule.old) + 1 :])
    return best


@dataclass(frozen=True)
class FlagRule:
    """A reference ``launcher.py`` flag: an alias of one of ours (run with a warning) or refused.

    ``env``: the environment ``--with-env`` serves instead; ``service``: the built-in service started
    instead; neither: refused, ``note`` says what to do.
    """

    flags: tuple[str, ...]
    note: str
    env: str | None = None
    service: str | None = None
    takes_value: bool = False

    @property
    def replacement(self) -> str | None:
        """Our flag that does the same, or None when the flag is refused."""
        if self.env is not None:
            return f"--with-env {self.env}"
        return f"--with-{self.service}" if self.service is not None else None


_NO_ENV = ("this project has no {name} environment (see env_service/environments/); serve a registered "
           "environment with --with-env NAME, or add your own as a plug-in (docs/env_service.md)")

#: The reference launcher's flags that ours does not spell the same way (``--conf``, ``--target`` and
#: ``--with-logview`` are the same here).
REFERENCE_FLAGS: tuple[FlagRule, ...] = (
    FlagRule(("--with-appworld",), "starts the environment service serving appworld at env_service.env_url",
             env="appworld"),
    FlagRule(("--with-bfcl",), "starts the environment service serving bfcl at env_service.env_url", env="bfcl"),
    FlagRule(("--with-reme",), "starts this project's memory service (the ReMe task-memory API) at "
             "memory.base_url; a ReMe server already answering there is reused", service="memory"),
    FlagRule(("--with-webshop",), _NO_ENV.format(name="webshop")),
    FlagRule(("--with-crafters",), _NO_ENV.format(name="crafters")),
    FlagRule(("--db",), "no debug switch: set RAY_DEBUG_POST_MORTEM=1 in the launcher's environment (the "
             "training run inherits it)", takes_value=True),
    FlagRule(("--reboot",), "the reference's flag did nothing; a service that already answers its health URL "
             "is reused, so stop it yourself to restart it"),
    FlagRule(("-k", "--kill", "--python-killer"), "this launcher stops exactly the processes it started when "
             "it exits and never kills other jobs by name; stop those by their pid"),
)
