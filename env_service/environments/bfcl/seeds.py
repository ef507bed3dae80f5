"""bfcl's exploration seeds (split ``explore``): one per tool class, ``explore-GorillaFileSystem`` ...

Why one seed per *class*, not per function: BFCL exposes its 128 functions in eight classes, and a task always gets
whole classes (``involved_classes``), each with one shared state (the file system, the trading account, the car).
A function alone is rarely explorable (``mv`` needs ``ls`` and ``cd`` to mean anything), and 128 seeds would be 128
explorations of the same eight states. A seed therefore exposes exactly what a one-class task exposes: all the
functions of its class, on a fixed state.

That state is the class's part of ``initial_config`` of one fixed ``train`` task (:data:`SEED_STATES`; never a
val or test task, so no exploration starts from an evaluation scenario). The seed opens with one user turn, "find
out what the tools can do"; a reply without a function call ends it, and the episode. It has no ground truth, so
``evaluate`` scores it 0 (:data:`NOT_A_TASK`). Self-Questioning explores the seeds when no human task is given
(:mod:`env_service.environments.exploration_seeds`).
"""

from __future__ import annotations

import copy
import functools

from env_service.environments.bfcl.data import TOOL_CLASSES, BfclTask, all_tasks, func_docs, get_task
from env_service.environments.exploration_seeds import EXPLORE_SPLIT, is_seed, seed_id
from env_service.errors import UnknownTask

__all__ = ["NOT_A_TASK", "SEED_STATES", "bfcl_task", "is_seed_task", "seed_task_ids"]

#: Tool class -> the train task whose ``initial_config`` of that class the seed starts from, chosen by hand among the
#: class's train tasks for a state its functions can act on (a logged-in account, an open market, files to work on).
SEED_STATES: dict[str, str] = {
    "GorillaFileSystem": "multi_turn_base_1",  # /alex/workspace: log.txt, archive/, .hidden_file
    "MathAPI": "multi_turn_base_28",  # stateless: BFCL loads no scenario for it
    "MessageAPI": "multi_turn_base_72",  # logged in as USR005, with a user map and an inbox
    "TwitterAPI": "multi_turn_base_4",  # authenticated as tech_guru: tweets, comments, followings
    "TicketAPI": "multi_turn_base_125",  # logged in as John, one ticket of his in the queue
    "TradingBot": "multi_turn_base_101",  # authenticated, market open, orders and a watch list
    "TravelAPI": "multi_turn_base_152",  # a credit card, a budget and an access token, no booking yet
    "VehicleControlAPI": "multi_turn_base_52",  # engine stopped, doors locked, parking brake engaged
}

#: What a seed's ``evaluate`` means (also in ``info()["note"]`` and the last step's ``info``).
NOT_A_TASK = "This is an exploration seed, not a task: it has no ground truth, so it scores 0."

_PREFIX = "This tool belongs to "


def _summary(class_name: str) -> str:
    """What BFCL's docs say the class is (their shared first sentence), e.g. "the Gorilla file system"."""
    description = func_docs(class_name)[0].get("description", "")
    head = description.split(" Tool description:")[0].split(". ")[0].rstrip(".")
    return head.removeprefix(_PREFIX) or class_name


def _query(class_name: str) -> str:
    return (f"Find out what the tools of `{class_name}` ({_summary(class_name)}) can do: call them with sensible "
            "arguments, then report what you learned.")


@functools.cache
def _seeds() -> dict[str, BfclTask]:
    seeds = {}
    for class_name in TOOL_CLASSES:
        state = all_tasks()[SEED_STATES[class_name]].initial_config
        config = {class_name: copy.deepcopy(state[class_name])} if class_name in state else {}
        seeds[seed_id(class_name)] = BfclTask(
            id=seed_id(class_name), category=EXPLORE_SPLIT, index=-1,
            questions=[[{"role": "user", "content": _query(class_name)}]],
            initial_config=config, involved_classes=[class_name])
    return seeds


def seed_task_ids() -> list[str]:
    """The seed ids, one per tool class, in BFCL's class order (needs no bfcl-eval)."""
    return [seed_id(class_name) for class_name in TOOL_CLASSES]


def is_seed_task(task: BfclTask) -> bool:
    """Whether ``task`` is an exploration seed (built here), not a BFCL entry."""
    return task.category == EXPLORE_SPLIT


def bfcl_task(task_id: str) -> BfclTask:
    """The seed ``task_id`` names, or BFCL's entry of that id (:func:`~.data.get_task`, which names a bad id)."""
    if not is_seed(task_id):
        return get_task(task_id)
    seed = _seeds().get(task_id)
    if seed is None:
        raise UnknownTask(f"bfcl has no exploration seed {task_id!r}; seeds (one per tool class): "
                          f"{', '.join(seed_task_ids())}", field="task_id")
    return seed
