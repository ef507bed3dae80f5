"""Workspaces as JSONL: one memory per line (experience text + metadata, no vectors).

The same format serves ReMe's ``dump``/``load`` actions (``<path>/<workspace_id>.jsonl`` on the service's
machine) and the HTTP export/import routes (the file travels in the request/response), so a memory can be
seeded from an existing library, backed up, or moved to a machine with another embedder: lines carry text,
and the receiving service embeds it with its own model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import ValidationError

from agentevolver.memory_service.errors import FileProblem
from agentevolver.schema.memory_wire import MemoryRecordIn, TaskMemory

__all__ = ["dump_path", "parse_jsonl", "resolve_io_dir", "to_jsonl_lines"]


def to_jsonl_lines(memories: Iterable[TaskMemory]) -> Iterator[str]:
    """Each memory as one JSON line (ReMe's dump format: every TaskMemory field)."""
    for memory in memories:
        yield json.dumps(memory.model_dump(), ensure_ascii=False) + "\n"


def parse_jsonl(lines: Iterable[str | bytes], *, source: str, field: str) -> list[MemoryRecordIn]:
    """Validate every non-blank line; the first bad one raises :class:`FileProblem` naming line and key."""
    records: list[MemoryRecordIn] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise FileProblem(f"{source} line {number}: not valid JSON ({err.msg})", field=field) from err
        if not isinstance(value, dict):
            raise FileProblem(f"{source} line {number}: each line must be a JSON object with at least 'content'",
                              field=field)
        try:
            records.append(MemoryRecordIn.model_validate(value))
        except ValidationError as err:
            first = err.errors()[0]
            key = ".".join(str(part) for part in first.get("loc", ())) or "(line)"
            raise FileProblem(f"{source} line {number}: field {key!r}: {first.get('msg')}", field=field) from err
    return records


def resolve_io_dir(path: str | None, io_root: Path | None, *, field: str = "path") -> Path:
    """The folder a dump/load names, checked against ``io_root`` when the service restricts file access."""
    if not path or not path.strip():
        raise FileProblem("dump and load need path: the folder that holds <workspace_id>.jsonl", field=field)
    if "\x00" in path:  # no file system takes it; Path.resolve and open would raise ValueError (a 500)
        raise FileProblem(f"path {path[:200]!r} holds a NUL character; send a folder path", field=field)
    folder = Path(path).expanduser()
    if io_root is not None:
        root = io_root.resolve()
        try:
            folder = (root / folder).resolve() if not folder.is_absolute() else folder.resolve()
        except OSError as err:  # a name longer than the file system allows, a symlink loop
            raise FileProblem(f"path {path[:200]!r} cannot be used: {err.strerror}", field=field) from None
        if folder != root and root not in folder.parents:
            raise FileProblem(f"path {path!r} is outside this service's io_root {root}; use a folder inside it",
                              field=field)
    return folder


def dump_path(folder: Path, workspace_id: str) -> Path:
    """Where ReMe's dump/load put a workspace: ``<folder>/<workspace_id>.jsonl``."""
    return folder / f"{workspace_id}.jsonl"
