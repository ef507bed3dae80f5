"""The ``game`` config section: games with several seats, some played by the policy being trained.

Defined and documented in config/agentevolver.yaml (docs/env_games.md); this model checks it once at start-up,
with errors that name the key. ``trained_seats`` non-empty = every episode of the run is a game
(:mod:`agentevolver.module.agent_flow.game`), not the agent flow.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["PLAYER_KINDS", "GameConfig", "parse_player"]

#: ``<kind>:<name>`` player specs: scripted players (``random``, ``first``, ``pass`` or a bot the game offers,
#: e.g. tic-tac-toe's ``perfect``) and OpenAI-compatible endpoints named under ``llm.endpoints``.
PLAYER_KINDS = ("scripted", "endpoint")
_SPEC = re.compile(r"^(scripted|endpoint):([A-Za-z0-9_.\-]+)$")


def parse_player(spec: str) -> tuple[str, str]:
    """``"scripted:random"`` -> ``("scripted", "random")``; a malformed spec raises ValueError saying the form."""
    found = _SPEC.match(spec)
    if found is None:
        raise ValueError(f"player {spec!r} must be 'scripted:<name>' (random, first, pass, or a bot the game "
                         "offers such as perfect) or 'endpoint:<name of an llm.endpoints entry>'")
    return found.group(1), found.group(2)


class GameConfig(BaseModel):
    """``game`` (see config/agentevolver.yaml for each key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trained_seats: list[str] = Field(default_factory=list)
    opponents: dict[str, str] = Field(default_factory=dict)
    max_moves: int = Field(default=30, ge=1)
    opponent_temperature: float = Field(default=0.0, ge=0.0)
    opponent_max_tokens: int = Field(default=16, ge=1)
    seed: int = 0

    @field_validator("opponents")
    @classmethod
    def _specs(cls, value: dict[str, str]) -> dict[str, str]:
        for seat, spec in value.items():
            try:
                parse_player(spec)
            except ValueError as err:
                raise ValueError(f"opponents.{seat}: {err}") from err
        return value

    @model_validator(mode="after")
    def _seats_disjoint(self) -> GameConfig:
        if len(set(self.trained_seats)) != len(self.trained_seats):
            raise ValueError(f"trained_seats lists a seat twice: {self.trained_seats}")
        both = sorted(set(self.trained_seats) & set(self.opponents))
        if both:
            raise ValueError(f"seat(s) {both} are both trained (game.trained_seats) and given an opponent "
                             "(game.opponents); a seat has one player")
        return self

    @property
    def enabled(self) -> bool:
        """True when the run's episodes are games (some seat is trained)."""
        return bool(self.trained_seats)
