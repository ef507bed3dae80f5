"""Rollout dumps: each training step's episodes as JSON lines in ``<run dir>/rollouts/step_<N>.jsonl``.

The dump is the durable record of what the agent did: the trajectory viewer reads it, and so do users'
analysis scripts (one ``json.loads`` per line; format in docs/rollout_dumps.md). A step's file is written
to a temporary name and renamed into place, so a reader (or a crash) never sees half a step; writing the
same step again (a resumed run) replaces the file instead of appending duplicates.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from agentevolver.module.agent_flow.episode import EpisodeResult

__all__ = ["ROLLOUT_DIR_NAME", "RolloutDumpWriter", "read_rollout_dump", "rollout_dump_dir", "rollout_dump_path"]

#: Sub-folder of the run directory holding the dumps.
ROLLOUT_DIR_NAME = "rollouts"


def rollout_dump_dir(configured: str | os.PathLike[str] | None, run_dir: str | os.PathLike[str]) -> Path:
    """Where a run's dumps go: ``agent_flow.dump.dir`` when set, else ``<run dir>/rollouts``."""
    return Path(configured) if configured else Path(run_dir) / ROLLOUT_DIR_NAME


def rollout_dump_path(directory: str | os.PathLike[str], step: int) -> Path:
    """``<directory>/step_<step>.jsonl`` (``directory`` is the ``rollouts`` folder itself)."""
    if step < 0:
        raise ValueError(f"step must be >= 0; got {step}")
    return Path(directory) / f"step_{step}.jsonl"


class RolloutDumpWriter:
    """Writes one file per step into ``directory`` (created on first write)."""

    def __init__(self, directory: str | os.PathLike[str], *, include_messages: bool = True) -> None:
        self.directory = Path(directory)
        self.include_messages = include_messages

    def write(
        self,
        step: int,
        episodes: Sequence[EpisodeResult],
        advantages: Sequence[list[float] | None] | None = None,
    ) -> Path:
        """Write ``episodes`` (with per-episode token advantages when known) as the dump of ``step``."""
        if advantages is not None and len(advantages) != len(episodes):
            raise ValueError(f"got {len(advantages)} advantage lists for {len(episodes)} episodes")
        records = (
            episode.to_dump_record(step=step, advantages=None if advantages is None else advantages[index],
                                   include_messages=self.include_messages)
            for index, episode in enumerate(episodes)
        )
        return self.write_records(step, records)

    def write_records(self, step: int, records: Iterable[dict[str, Any]]) -> Path:
        """Write already-built records (the trainer adds fields such as advantages) atomically."""
        path = rollout_dump_path(self.directory, step)
        self.directory.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=self.directory)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                for record in records:
                    out.write(json.dumps(record, ensure_ascii=False, allow_nan=False))
                    out.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def read_rollout_dump(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of one dump file, in order; a malformed line raises naming the file and line number."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON object ({err})") from err
