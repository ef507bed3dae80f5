"""Elo ratings of an arena's games, with bootstrap confidence intervals.

Every game is broken into pairwise results between seats held by different players (a two-seat game is one
pair): the seat with the higher score scored 1 against the other, equal scores 0.5. Ratings start at
``initial`` and move by ``k * (S - E)`` after each pairwise result, ``E = 1 / (1 + 10 ** ((R_b - R_a) / 400))``,
in the order the games were played (K = 32, as the reference arena). Sequential Elo depends on that order, so
the interval is a bootstrap over games: resample the games with replacement, in a random order, rate them
again, and take the percentiles of each player's rating.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

__all__ = ["Rating", "expected", "pairwise", "rate", "rate_with_intervals"]


@dataclass(frozen=True)
class Rating:
    """One player's rating, its bootstrap interval and its record."""

    player: str
    elo: float
    low: float
    high: float
    games: int
    wins: int
    draws: int
    losses: int


def expected(rating_a: float, rating_b: float) -> float:
    """The score ``a`` is expected to make against ``b``."""
    return 1.0 / (1.0 + 10.0 ** ((rating_b - rating_a) / 400.0))


def pairwise(players: Mapping[str, str], scores: Mapping[str, float]) -> list[tuple[str, str, float]]:
    """``(player_a, player_b, score of a)`` for every pair of seats held by different players."""
    out = []
    for seat_a, seat_b in combinations(sorted(players), 2):
        a, b = players[seat_a], players[seat_b]
        if a == b:
            continue
        diff = scores.get(seat_a, 0.0) - scores.get(seat_b, 0.0)
        out.append((a, b, 1.0 if diff > 0 else 0.0 if diff < 0 else 0.5))
    return out


def rate(games: Sequence[tuple[Mapping[str, str], Mapping[str, float]]], *, k: float = 32.0,
         initial: float = 1000.0) -> dict[str, float]:
    """Sequential Elo over ``games`` (``(seat -> player, seat -> score)`` each), in order."""
    ratings: dict[str, float] = {}
    for players, scores in games:
        for a, b, score in pairwise(players, scores):
            ra, rb = ratings.setdefault(a, initial), ratings.setdefault(b, initial)
            delta = k * (score - expected(ra, rb))
            ratings[a], ratings[b] = ra + delta, rb - delta
    return ratings


def rate_with_intervals(games: Sequence[tuple[Mapping[str, str], Mapping[str, float]]], *, k: float = 32.0,
                        initial: float = 1000.0, samples: int = 1000, level: float = 0.95,
                        seed: int = 0) -> list[Rating]:
    """Ratings in the games' order, each with a bootstrap interval (module docstring), best first."""
    point = rate(games, k=k, initial=initial)
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {player: [] for player in point}
    for _ in range(samples if games else 0):
        resampled = [games[rng.randrange(len(games))] for _ in games]
        ratings = rate(resampled, k=k, initial=initial)
        for player in draws:
            draws[player].append(ratings.get(player, initial))
    tail = (1.0 - level) / 2.0
    record = {player: [0, 0, 0] for player in point}
    for players, scores in games:
        for a, b, score in pairwise(players, scores):
            index = 0 if score == 1.0 else 1 if score == 0.5 else 2
            record[a][index] += 1
            record[b][2 - index] += 1
    out = []
    for player, elo in point.items():
        values = sorted(draws[player]) or [elo]
        low = values[int(tail * (len(values) - 1))]
        high = values[int((1.0 - tail) * (len(values) - 1))]
        wins, draws_, losses = record[player]
        out.append(Rating(player, elo, low, high, wins + draws_ + losses, wins, draws_, losses))
    return sorted(out, key=lambda rating: rating.elo, reverse=True)
