"""The generation checkpoint: which explorations are finished and what they produced, so a killed run
resumes where it stopped (seed 000, chapter 2: ``.generate_task.checkpoint.json`` with a digest).

The file holds a digest of the generation's inputs (seed tasks, environment, profile, strategy, models,
prompts, real-time filters: :func:`inputs_digest`). A checkpoint whose digest differs from the current
run's is ignored, so a changed input starts afresh rather than mixing tasks from two setups. ``n`` and the
thread count are not inputs: exploration ``seed#round`` does not depend on them, so raising ``n`` adds
rounds and keeps the finished ones. Post-filter verdicts are cached too, under their own digest (changing
the judge re-judges, but does not re-explore). Writes are atomic (temp file + rename): a kill mid-write
leaves the previous checkpoint intact.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentevolver.schema import TaskObjective, Trajectory

__all__ = ["CHECKPOINT_VERSION", "ExplorationRecord", "GenerationCheckpoint", "atomic_write_text", "explorations_log_path",
           "inputs_digest"]

logger = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1


def inputs_digest(inputs: Any) -> str:
    """SHA-256 of the canonical JSON of ``inputs``."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class ExplorationRecord:
    """One finished exploration: the tasks it kept after the real-time filters and its counters."""

    key: str
    seed_task_id: str
    round: int
    objectives: list[TaskObjective]
    counts: dict[str, int] = field(default_factory=dict)
    #: the exploration itself, for the explorations log (:func:`explorations_log_path`); not checkpointed
    trajectory: Trajectory | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "seed_task_id": self.seed_task_id, "round": self.round,
                "objectives": [o.model_dump(mode="json") for o in self.objectives], "counts": self.counts}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExplorationRecord:
        return cls(key=data["key"], seed_task_id=data["seed_task_id"], round=int(data["round"]),
                   objectives=[TaskObjective.model_validate(o) for o in data["objectives"]],
                   counts={k: int(v) for k, v in data.get("counts", {}).items()})


class GenerationCheckpoint:
    """Load with :meth:`open`; update :attr:`explorations` / :attr:`verdicts`; :meth:`save` after each batch."""

    def __init__(self, path: Path, digest: str, verdict_digest: str) -> None:
        self.path = path
        self.digest = digest
        self.verdict_digest = verdict_digest
        self.explorations: dict[str, ExplorationRecord] = {}
        #: ``"<filter>:<task_id>"`` -> ``{"keep": bool, "reason": str, "unparsed": bool}``
        self.verdicts: dict[str, dict[str, Any]] = {}
        #: What :meth:`open` found: "fresh" (no file), "resumed", "inputs changed", "unreadable".
        self.status = "fresh"

    @classmethod
    def open(cls, path: str | Path, digest: str, verdict_digest: str) -> GenerationCheckpoint:
        """The checkpoint at ``path`` if it was written for these inputs, else an empty one."""
        checkpoint = cls(Path(path), digest, verdict_digest)
        if not checkpoint.path.is_file():
            return checkpoint
        try:
            data = json.loads(checkpoint.path.read_text(encoding="utf-8"))
            if data.get("version") != CHECKPOINT_VERSION or data.get("digest") != digest:
                checkpoint.status = "inputs changed"
                logger.info("checkpoint %s was written for other inputs; starting afresh", path)
                return checkpoint
            checkpoint.explorations = {r["key"]: ExplorationRecord.from_json(r) for r in data["explorations"]}
            if data.get("verdict_digest") == verdict_digest:
                checkpoint.verdicts = dict(data.get("verdicts", {}))
        except (OSError, ValueError, KeyError, TypeError) as err:
            checkpoint.status = "unreadable"
            logger.warning("checkpoint %s is unreadable (%s); starting afresh", path, err)
            return checkpoint
        checkpoint.status = "resumed"
        return checkpoint

    def save(self) -> None:
        """Write atomically (a kill during the write leaves the previous file)."""
        data = {"version": CHECKPOINT_VERSION, "digest": self.digest, "verdict_digest": self.verdict_digest,
                "explorations": [r.to_json() for r in self.explorations.values()], "verdicts": self.verdicts}
        atomic_write_text(self.path, json.dumps(data, ensure_ascii=False))


def explorations_log_path(checkpoint_path: str | Path) -> Path:
    """Where ``task_manager.save_explorations`` writes the explorations (JSON lines), beside the checkpoint:
    ``calc.checkpoint.json`` -> ``calc.explorations.jsonl``, any other name ``<stem>.explorations.jsonl``.
    Derived, not configured, so each run folder that holds a checkpoint holds its explorations too."""
    path = Path(checkpoint_path)
    suffix = ".checkpoint.json"
    base = path.name[: -len(suffix)] if path.name.endswith(suffix) and len(path.name) > len(suffix) else path.stem
    return path.with_name(f"{base}.explorations.jsonl")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
