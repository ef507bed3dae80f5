"""Self-Questioning: the task manager writes its own training tasks (seed 000, chapter 2).

Pipeline: environment **profile** (:mod:`.profile`) -> **explore** (:mod:`.exploration`, strategies by
name) -> **summarise** with the real query masked (:mod:`.summarizer`, :mod:`.masking`; or, with
``task_manager.writer: env``, the environment renders the observed calls as tasks, :mod:`.env_writer`) -> **filter**
(:mod:`.filters`: real-time dedup, post-hoc LLM feasibility; :mod:`.eval_overlap`: no task equal to an
evaluation task) -> **mix** (:mod:`.mixture`: unified for
training, original-only for validation). Where the profile declares that observations prove answers, only
tasks whose answer :mod:`.proof` finds in what the environment returned are kept. :mod:`.graders` score
synthetic tasks (``reference``: the answer matched by code, :mod:`.answers`; or an LLM judge) and original
ones (the environment). :class:`TaskManager` runs generation with a resumable checkpoint
(:mod:`.checkpoint`); ``python -m agentevolver.module.task_manager`` is the command line. Seeds are
training tasks or, with ``task_manager.seed_split: explore``, the environment's exploration seeds: no human
task at all (:mod:`.seeds`). Every LLM role
(``task_explorer``, ``task_summarizer``, ``task_filter``, ``task_grader``) is an OpenAI-compatible endpoint
from ``llm.roles``. See docs/task_manager.md.
"""

from agentevolver.module.task_manager.deps import TaskManagerDeps
from agentevolver.module.task_manager.eval_overlap import EvalOverlapFilter, EvalQueries
from agentevolver.module.task_manager.exploration import EXPLORATION_STRATEGIES, ExplorationStrategy
from agentevolver.module.task_manager.filters import (
    POST_FILTERS,
    REALTIME_FILTERS,
    PostFilter,
    RealtimeFilter,
)
from agentevolver.module.task_manager.graders import GRADERS, Grader, GraderPool, agrade_episode
from agentevolver.module.task_manager.manager import GenerationReport, TaskManager
from agentevolver.module.task_manager.mixture import MIXTURES, MixtureStrategy
from agentevolver.module.task_manager.profile import EnvProfile, ProfileError, load_profile
from agentevolver.module.task_manager.seeds import seed_split, seed_tasks, spread_over
from agentevolver.module.task_manager.store import (
    original_objectives,
    read_objectives,
    write_objectives,
)

__all__ = [
    "EXPLORATION_STRATEGIES",
    "GRADERS",
    "MIXTURES",
    "POST_FILTERS",
    "REALTIME_FILTERS",
    "EnvProfile",
    "EvalOverlapFilter",
    "EvalQueries",
    "ExplorationStrategy",
    "GenerationReport",
    "Grader",
    "GraderPool",
    "MixtureStrategy",
    "PostFilter",
    "ProfileError",
    "RealtimeFilter",
    "TaskManager",
    "TaskManagerDeps",
    "agrade_episode",
    "load_profile",
    "original_objectives",
    "read_objectives",
    "seed_split",
    "seed_tasks",
    "spread_over",
    "write_objectives",
]
