"""The arena's report: a table (Markdown, printed and written) and a plot of the ratings with their intervals."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentevolver.arena.elo import Rating

__all__ = ["plot", "table"]


def table(ratings: Sequence[Rating], *, games: int, k: float, level: float) -> str:
    """Players best first: Elo, its interval, games and the win/draw/loss record (pairwise results)."""
    lines = [f"Elo (K = {k:g}, start 1000) over {games} games; interval: {level:.0%} bootstrap over games", "",
             "| rank | player | Elo | interval | results | W / D / L |", "|---|---|---|---|---|---|"]
    for rank, rating in enumerate(ratings, 1):
        lines.append(f"| {rank} | {rating.player} | {rating.elo:.0f} | {rating.low:.0f} .. {rating.high:.0f} | "
                     f"{rating.games} | {rating.wins} / {rating.draws} / {rating.losses} |")
    return "\n".join(lines) + "\n"


def plot(ratings: Sequence[Rating], path: Path) -> Path:
    """A horizontal bar per player at its Elo with the interval as an error bar (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = list(reversed(ratings))  # best at the top
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(ordered) + 1.5))
    elos = [r.elo for r in ordered]
    errors = [[r.elo - r.low for r in ordered], [r.high - r.elo for r in ordered]]
    ax.barh([r.player for r in ordered], [e - 1000 for e in elos], left=1000, xerr=errors, capsize=4,
            color="#4c72b0")
    ax.axvline(1000, color="grey", linewidth=0.8)
    ax.set_xlabel("Elo (bars from the starting 1000; whiskers: bootstrap interval)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
