"""appworld's exploration seeds (split ``explore``): one per app, ``explore-amazon`` ... ``explore-venmo``.

Why per app: AppWorld has no function tools (the agent writes code against ``apis.<app>.<api>(...)``); an app is
what its tasks are about and what ``apis.api_docs`` documents, with one state of its own (the supervisor's
library, inbox, notes). Its APIs are many (hundreds in all) and rarely make sense alone (most need the app's
``login`` first), so a seed per API would only repeat the same few explorations. The nine day-to-day apps of
AppWorld 0.1.3 each get one; ``api_docs`` and ``supervisor`` do not: every exploration uses them (the docs, the
passwords, ``complete_task``), and the system prompt already says how.

A seed plays in a fixed world: that of the first task of AppWorld's ``train`` dataset (``load_task_ids("train")[0]``;
never a dev or test world, so no exploration starts from an evaluation scenario). It opens like that task, with the
seed's question in place of the instruction, and ends as any episode (``complete_task`` or the interaction
limit). It has no answer: ``evaluate`` scores it 0 without asking AppWorld (:data:`NOT_A_TASK`). Self-Questioning
explores the seeds when no human task is given (:mod:`env_service.environments.exploration_seeds`).
"""

from __future__ import annotations

from env_service.environments.exploration_seeds import is_seed, seed_id, seed_tool
from env_service.errors import UnknownTask

__all__ = ["APPS", "NOT_A_TASK", "seed_query", "seed_task_ids"]

#: App -> what it holds, in AppWorld's alphabetical order (our one-line summaries, not AppWorld's descriptions).
APPS: dict[str, str] = {
    "amazon": "online shopping: products, cart, orders and returns",
    "file_system": "the supervisor's files and directories",
    "gmail": "email: inbox, threads, drafts and attachments",
    "phone": "contacts, text and voice messages, alarms",
    "simple_note": "notes",
    "splitwise": "expenses shared with friends and groups",
    "spotify": "music: songs, albums, playlists and the library",
    "todoist": "to-do projects and tasks",
    "venmo": "payments and payment requests between friends",
}

#: What a seed's ``evaluate`` means (also in ``info()["note"]`` and the last step's ``info``).
NOT_A_TASK = "This is an exploration seed, not a task: it has no answer, so it scores 0."


def seed_task_ids() -> list[str]:
    """The seed ids, one per app (needs no AppWorld)."""
    return [seed_id(app) for app in APPS]


def seed_query(task_id: str) -> str:
    """The question the seed ``task_id`` opens with; :class:`UnknownTask` for an ``explore-`` id that is none."""
    app = seed_tool(task_id) if is_seed(task_id) else ""
    if app not in APPS:
        raise UnknownTask(f"appworld has no exploration seed {task_id!r}; seeds (one per app): "
                          f"{', '.join(seed_task_ids())}", field="task_id")
    return (f"Find out what the app `{app}` can do ({APPS[app]}): list its APIs with apis.api_docs, call them with "
            "sensible arguments and print what they return, then report what you learned and call "
            "apis.supervisor.complete_task().")
