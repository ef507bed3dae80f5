"""Typed models of this project's config sections (the keys documented in config/agentevolver.yaml).

The YAML file is where each key is defined and documented; these models are where its type and range are
enforced, once, at start-up. Every model forbids unknown keys so that a typo (`task_manager.nn=3`) fails
loudly instead of being silently ignored. verl's own sections are validated by verl's dataclasses.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from agentevolver.client.llm_config import LLMConfig
from agentevolver.config.agent_flow import AgentFlowConfig
from agentevolver.config.agent_program import AgentProgramConfig
from agentevolver.config.game import GameConfig, parse_player


class _Section(BaseModel):
    """Base of every section: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


#: A base URL: http(s)://host[:port][/path].
HttpUrl = Annotated[str, Field(pattern=r"^https?://[^\s/]+\S*$")]


class EnvServiceSection(_Section):
    """``env_service``: which environment the episodes act in, and where the service listens."""

    env_type: str = Field(min_length=1)
    train_split: str = Field(min_length=1)
    val_split: str = Field(min_length=1)
    create_params: dict[str, Any] = Field(default_factory=dict)
    env_url: HttpUrl
    timeout_s: float = Field(gt=0)
    max_retries: int = Field(ge=0)
    backoff_initial_s: float = Field(ge=0)
    backoff_max_s: float = Field(ge=0)
    max_connections: int = Field(ge=1)
    auth_token_env: str | None = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @model_validator(mode="after")
    def _backoff_order(self) -> EnvServiceSection:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"backoff_max_s ({self.backoff_max_s}) must be >= backoff_initial_s "
                             f"({self.backoff_initial_s})")
        return self


class MixtureSection(_Section):
    """``task_manager.mixture``: how original and synthetic tasks are mixed for training."""

    strategy: str = Field(min_length=1)
    use_original_tasks: bool
    synthetic_data_ratio: float = Field(ge=0.0)
    shuffle: bool
    seed: int


class GraderSection(_Section):
    """``task_manager.grader``: grader registry names for original and synthetic tasks, and the LLM judge's mode."""

    original_grader: str = Field(min_length=1)
    synthetic_grader: str = Field(min_length=1)
    use_reference_answer: bool
    scoring: Literal["binary", "graded"]


class DedupSection(_Section):
    """``task_manager.dedup``: how the real-time duplicate filter compares tasks."""

    embedder: str = Field(min_length=1)
    threshold: float = Field(gt=0.0, le=1.0)


class TaskManagerSection(_Section):
    """``task_manager``: Self-Questioning (profile -> explore -> summarise -> filter -> mix)."""

    n: int = Field(ge=0)
    plugin_modules: list[str]
    strategy: str = Field(min_length=1)
    max_explore_step: int = Field(ge=1)
    num_explore_threads: int = Field(ge=1)
    env_profile: str | None
    num_seed_tasks: int = Field(ge=-1)
    seed_split: str | None = Field(min_length=1)
    explorer_temperature: float | None = Field(ge=0.0)
    explorer_max_tokens: int | None = Field(ge=1)
    explorer_tool_choice: Literal["auto", "required"]
    exploration_params: dict[str, Any]
    explore_seed: int
    eval_splits: list[str]
    tasks_per_exploration: int = Field(ge=1)
    writer: Literal["env", "llm"]
    writer_all_renderings: bool
    parse_retries: int = Field(ge=0)
    demonstrations: bool
    max_observation_chars: int = Field(ge=64)
    realtime_filters: list[str]
    post_filters: list[str]
    dedup: DedupSection
    synthetic_tasks_path: str = Field(min_length=1)
    checkpoint_path: str = Field(min_length=1)
    save_explorations: bool
    mixture: MixtureSection
    grader: GraderSection

    @model_validator(mode="after")
    def _synthetic_needs_generation(self) -> TaskManagerSection:
        if not self.mixture.use_original_tasks and self.mixture.synthetic_data_ratio == 0.0:
            raise ValueError(
                "mixture.use_original_tasks is false and mixture.synthetic_data_ratio is 0: the training "
                "mixture would be empty; keep the original tasks or set a synthetic ratio > 0"
            )
        if self.num_seed_tasks == 0:
            raise ValueError("num_seed_tasks must be -1 (every training task) or >= 1; got 0 (turn synthesis "
                             "off with n: 0 instead)")
        return self


RolloutMode = Literal["woexp", "mixed", "all"]


class ExpManagerSection(_Section):
    """``exp_manager``: which episodes get experience, and what training sees of it."""

    train_rollout_mode: RolloutMode
    val_rollout_mode: RolloutMode
    val_compare_mode: RolloutMode | None
    val_compare_at: Literal["final", "every"]
    rollout_ratio: float = Field(ge=0.0, le=1.0)
    train_sample_mode: Literal["allkeep", "alldiscard", "hybrid"]
    train_sample_keepratio: float = Field(ge=0.0, le=1.0)
    experience_kind: Literal["advice", "exemplar"]
    experience_template: str
    off_cliprange_high: float = Field(gt=0.0)
    init_exp_before_training: bool
    init_exp_max_tasks: int | None = Field(ge=1)
    init_exp_only: bool
    init_exp_clear_workspace: bool
    summary_batch_size: int = Field(ge=1)
    seed: int

    @model_validator(mode="after")
    def _compare_differs(self) -> ExpManagerSection:
        if self.val_compare_mode is not None and self.val_compare_mode == self.val_rollout_mode:
            raise ValueError(f"exp_manager.val_compare_mode={self.val_compare_mode} is val_rollout_mode's mode: the "
                             "second validation would repeat the first; set another mode (e.g. all when validation "
                             "runs woexp) or null to validate once")
        return self

    @model_validator(mode="after")
    def _template_has_slot(self) -> ExpManagerSection:
        if "{}" not in self.experience_template:
            raise ValueError("exp_manager.experience_template must contain '{}' where the retrieved experience "
                             f"goes; got {self.experience_template!r}")
        return self


class MemorySection(_Section):
    """``memory``: the experience memory service (ReMe task-memory API)."""

    base_url: HttpUrl
    workspace_id: str = Field(min_length=1)
    enable_summarizer: bool
    enable_context_generator: bool
    retrieve_top_k: int = Field(ge=1)
    updated_freq: int = Field(ge=0)
    timeout_s: float = Field(gt=0.0)
    max_retries: int = Field(ge=0)


class AdcaGrpoSection(_Section):
    """``attribution_driven_credit_assignment.adca_grpo``: ADCA-GRPO hyper-parameters (maths: docs/adca.md)."""

    prm_scheme: Literal["decouple", "allocation"]
    equal_trajectory_weight: bool
    fix_base: float = Field(gt=0.0)
    alpha: float = Field(ge=0.0)
    alpha_cosine_decay_enable: bool
    alpha_min: float = Field(ge=0.0)
    total_steps: int | None = Field(ge=1)
    orm_distribution: Literal["last_step", "all_steps"]
    enable_length_normalization: bool
    prm_steps: int | None = Field(ge=0)
    skip_type: Literal["none", "skip_small_adv", "skip_all_neg"]
    skip_small_adv_threshold: float = Field(ge=0.0)
    allocation_inconsistent_weight: float = Field(gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _alpha_min_below_alpha(self) -> AdcaGrpoSection:
        if self.alpha_cosine_decay_enable and self.alpha_min > self.alpha:
            raise ValueError(f"alpha_min ({self.alpha_min}) must not exceed alpha ({self.alpha})")
        return self


class AdcaJudgeSection(_Section):
    """``attribution_driven_credit_assignment.judge``: who labels the steps and how the LLM judge is asked (the
    endpoint itself, with its timeout, transport retries, backoff and concurrency limit, is ``llm.roles.judge``).

    ``source``, ``compare_with_env`` and ``label_synthetic_tasks`` have defaults (the YAML's) so that a config
    saved before they existed still validates; ``compare_with_env: true`` needs ``source: llm`` (with ``env`` there is no LLM label).
    """

    parse_retries: int = Field(ge=0)
    max_message_chars: int = Field(ge=200)
    source: Literal["llm", "env"] = "llm"
    compare_with_env: Literal["auto"] | bool = "auto"
    label_synthetic_tasks: bool = True

    @model_validator(mode="after")
    def _compare_needs_llm(self) -> AdcaJudgeSection:
        if self.source == "env" and self.compare_with_env is True:
            raise ValueError("compare_with_env=true compares the LLM judge's labels with the environment's, but "
                             "source=env calls no LLM judge: set compare_with_env to auto or false, or source to llm")
        return self


class AdcaSection(_Section):
    """``attribution_driven_credit_assignment``: Self-Attributing on/off and its hyper-parameters."""

    enable: bool
    judge: AdcaJudgeSection
    adca_grpo: AdcaGrpoSection


def _scalar_to_text(value: Any) -> Any:
    """YAML and Hydra turn ``8080`` or ``1.5`` into numbers; a command-line argument or an environment
    variable is text, so numbers are accepted and written back as text (bools and nulls are not: their
    text form is ambiguous)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


#: A command-line argument or environment-variable value (numbers become text).
ArgText = Annotated[str, BeforeValidator(_scalar_to_text)]


class ServiceSection(_Section):
    """``launcher.services.<name>``: how the launcher starts one companion service and knows it is ready.

    Only ``command``, ``url`` and ``ready_timeout_s`` are required, so a user-added service
    (``+launcher.services.mine={...}``) stays short; the built-in ones spell every key out in the YAML.
    """

    command: list[ArgText] = Field(min_length=1)
    extra_args: list[ArgText] = Field(default_factory=list)
    url: HttpUrl
    health_path: str = Field(default="/healthz", pattern=r"^/\S*$")
    ready_timeout_s: float = Field(gt=0)
    env: dict[str, ArgText] = Field(default_factory=dict)
    log_file: str | None = Field(default=None, pattern=r"^[^/\\]+$")


class LauncherSection(_Section):
    """``launcher``: companion services, the run record and the shutdown policy of ``launcher.py``."""

    record_dir: str = Field(min_length=1)
    poll_interval_s: float = Field(gt=0)
    probe_timeout_s: float = Field(gt=0)
    shutdown_grace_s: float = Field(ge=0)
    max_restarts: int = Field(ge=0)
    restart_backoff_s: float = Field(ge=0)
    services: dict[str, ServiceSection]

    @model_validator(mode="after")
    def _service_names_are_file_safe(self) -> LauncherSection:
        bad = [name for name in self.services if not name.replace("_", "").replace("-", "").isalnum()]
        if bad:
            raise ValueError(f"services: names may use letters, digits, '_' and '-' only; got {bad}")
        return self


class AgentEvolverSettings(_Section):
    """All of this project's sections, validated together (cross-section rules live here)."""

    env_service: EnvServiceSection
    agent_flow: AgentFlowConfig
    agent_program: AgentProgramConfig
    game: GameConfig
    task_manager: TaskManagerSection
    exp_manager: ExpManagerSection
    memory: MemorySection
    attribution_driven_credit_assignment: AdcaSection
    llm: LLMConfig
    launcher: LauncherSection

    @model_validator(mode="after")
    def _one_episode_kind(self) -> AgentEvolverSettings:
        if self.game.enabled and self.agent_program.enabled:
            raise ValueError("game.trained_seats and agent_program are both set; a run's episodes are games or "
                             "agent-program runs, not both: clear one of them")
        missing = sorted(name for kind, name in map(parse_player, self.game.opponents.values())
                         if kind == "endpoint" and name not in self.llm.endpoints)
        if missing:
            raise ValueError(f"game.opponents names endpoint(s) {missing} that llm.endpoints does not define; "
                             f"defined: {', '.join(sorted(self.llm.endpoints))}")
        return self


#: The top-level keys of the composed config that belong to this project (everything else is verl's).
PROJECT_SECTIONS: tuple[str, ...] = tuple(AgentEvolverSettings.model_fields)
