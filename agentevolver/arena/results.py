"""The arena's results file: one JSON line per game, appended, so a later run adds to the earlier ones.

Each line: ``time`` (UTC ISO), ``env_type``, ``task_id``, ``players`` (seat -> player name), ``specs`` (player
name -> how it was played), ``scores`` (seat -> score), ``game`` (the whole game record: moves, seats'
failures, final board; what the viewer shows). Ratings are always computed from the whole file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["append_game", "read_games"]


def append_game(path: Path, *, env_type: str, task_id: str, players: Mapping[str, str], specs: Mapping[str, str],
                scores: Mapping[str, float], game: Mapping[str, Any]) -> None:
    """Append one game (a line written in one call, so an interrupted run leaves whole lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "env_type": env_type, "task_id": task_id,
            "players": dict(players), "specs": dict(specs), "scores": dict(scores), "game": dict(game)}
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, ensure_ascii=False) + "\n")


def read_games(path: Path) -> Iterator[dict[str, Any]]:
    """Every game in the file, in the order played; a line that is not JSON is an error naming its number."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON line ({err}); remove or repair it") from err
