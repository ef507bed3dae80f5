"""The arena (``python -m agentevolver.arena``): Elo by hand, and a scripted tournament with a known order played
through the real env service, its results kept and added to by a later run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_service_fixture import env_service
from hypothesis import given
from hypothesis import strategies as st

from agentevolver.arena.elo import expected, rate, rate_with_intervals
from agentevolver.arena.players import parse_spec

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_elo_by_hand() -> None:
    # equal ratings: E = 0.5, the winner gains K * 0.5 = 16
    assert rate([({"X": "a", "O": "b"}, {"X": 1.0, "O": 0.0})]) == {"a": 1016.0, "b": 984.0}
    # then b beats a: E_b = 1 / (1 + 10 ** (32 / 400)) = 0.45402..., b gains 32 * (1 - E_b) = 17.47...
    second = rate([({"X": "a", "O": "b"}, {"X": 1.0, "O": 0.0}), ({"X": "b", "O": "a"}, {"X": 1.0, "O": 0.0})])
    assert second["b"] == pytest.approx(984 + 32 * (1 - expected(984, 1016)))
    assert second["b"] == pytest.approx(1001.47, abs=0.01)
    # a draw between equals moves nothing; a seat pair held by one player is not a result
    assert rate([({"X": "a", "O": "b"}, {"X": 0.5, "O": 0.5})]) == {"a": 1000.0, "b": 1000.0}
    assert rate([({"X": "a", "O": "a"}, {"X": 1.0, "O": 0.0})]) == {}


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("abc"), st.sampled_from([0.0, 0.5, 1.0])),
                max_size=30))
def test_elo_is_zero_sum(results: list[tuple[str, str, float]]) -> None:
    games = [({"X": a, "O": b}, {"X": s, "O": 1.0 - s}) for a, b, s in results]
    ratings = rate(games)
    assert sum(ratings.values()) == pytest.approx(1000.0 * len(ratings))


def test_intervals_hold_the_point_rating() -> None:
    games = [({"X": "a", "O": "b"}, {"X": 1.0, "O": 0.0})] * 6 + [({"X": "b", "O": "a"}, {"X": 0.0, "O": 1.0})] * 6
    best, worst = rate_with_intervals(games, samples=200)
    assert best.player == "a" and best.low <= best.elo <= best.high and best.wins == 12 and worst.losses == 12


def test_a_bad_player_spec_names_the_option() -> None:
    with pytest.raises(ValueError, match="--player"):
        parse_spec("x=chess:engine")
    done = subprocess.run([sys.executable, "-m", "agentevolver.arena", "--player", "a=scripted:random"],
                          cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "--player" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("game", tmp_path=tmp_path_factory.mktemp("arena")) as running:
        yield running.url


def _arena(service: str, results: Path, tasks: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentevolver.arena", "--env-url", service, "--split", "val", "--tasks", str(tasks),
         "--player", "perfect=scripted:perfect", "--player", "random=scripted:random",
         "--player", "never=scripted:pass", "--results", str(results), "--bootstrap", "300"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False)


def _ranking(report: str) -> list[str]:
    rows = [line.split("|") for line in report.splitlines() if line.startswith("| ") and line[2].isdigit()]
    return [row[2].strip() for row in rows]


def test_a_scripted_tournament_ranks_the_known_order_and_keeps_its_results(service: str, tmp_path: Path) -> None:
    results = tmp_path / "arena" / "results.jsonl"
    first = _arena(service, results, tasks=4)
    assert first.returncode == 0, first.stderr[-4000:]
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(lines) == 3 * 4 * 2  # 3 pairs x 4 tasks x both seat orders
    for pair in ({"perfect", "random"}, {"perfect", "never"}, {"random", "never"}):  # seats assigned fairly
        games = [g for g in lines if set(g["players"].values()) == pair]
        assert sorted(g["players"]["X"] for g in games) == sorted(list(pair) * 4)
    report = (tmp_path / "arena" / "arena.md").read_text()
    assert _ranking(report) == ["perfect", "random", "never"], report
    assert (tmp_path / "arena" / "arena.png").stat().st_size > 0
    # perfect never loses; "never" (always an illegal PASS) never wins
    assert all(g["scores"][seat] >= 0.5 for g in lines for seat, who in g["players"].items() if who == "perfect")
    assert all(g["scores"][seat] == 0.0 for g in lines for seat, who in g["players"].items() if who == "never")

    second = _arena(service, results, tasks=1)  # a later run adds to the file; ratings use all of it
    assert second.returncode == 0, second.stderr[-4000:]
    assert len(results.read_text().splitlines()) == 24 + 6
    report = (tmp_path / "arena" / "arena.md").read_text()
    assert "over 30 games" in report and _ranking(report) == ["perfect", "random", "never"]


def test_a_checkpoint_plays_through_transformers(service: str, tmp_path: Path) -> None:
    """``hf:`` loads a checkpoint (here the built-in tiny-test) and plays its seats from their conversations."""
    results = tmp_path / "results.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "agentevolver.arena", "--env-url", service, "--tasks", "1", "--max-tokens", "6",
         "--create-params", '{"on_illegal": "random"}', "--player", "tiny=hf:tiny-test",
         "--player", "random=scripted:random", "--results", str(results), "--bootstrap", "50"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    games = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(games) == 2 and all(g["specs"]["tiny"] == "hf:tiny-test" for g in games)
    for game in games:
        seat = next(s for s, who in game["players"].items() if who == "tiny")
        assert any(move["seat"] == seat for move in game["game"]["moves"])  # it moved (legal or replaced)
