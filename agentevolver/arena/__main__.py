"""``python -m agentevolver.arena``: play a round and rate every game in the results file (docs/env_games.md).

    python -m agentevolver.arena --env-url http://127.0.0.1:8080 --split val --tasks 8 \\
        --player initial=hf:smollm2-135m-instruct --player trained=hf:run/global_step_8/actor/huggingface \\
        --player perfect=scripted:perfect --results arena/results.jsonl

Without ``--player`` it only rates the file. Exit 2 for bad arguments (the message names the option).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from agentevolver.arena.elo import rate_with_intervals
from agentevolver.arena.players import PlayerFactory, PlayerSpec, parse_spec
from agentevolver.arena.report import plot, table
from agentevolver.arena.results import read_games
from agentevolver.arena.tournament import play_round
from agentevolver.client.env_client import EnvClient, EnvClientSettings
from agentevolver.module.agent_flow.game_loop import GameOutcome

__all__ = ["main"]

logger = logging.getLogger("agentevolver.arena")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agentevolver.arena", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--player", action="append", default=[], metavar="NAME=KIND:TARGET",
                        help="a player: scripted:<name>, endpoint:<base_url>#<model> or hf:<checkpoint folder or "
                             "built-in model>; give two or more to play a round, none to only rate the file")
    parser.add_argument("--env-url", default="http://127.0.0.1:8080", help="the environment service")
    parser.add_argument("--env-type", default="game", help="the game environment (default: game)")
    parser.add_argument("--split", default="val", help="the task split the games are played on (default: val)")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per pair, each played in both seat orders")
    parser.add_argument("--create-params", default="{}", help='JSON /create params, e.g. \'{"on_illegal": "random"}\'')
    parser.add_argument("--max-moves", type=int, default=30, help="moves per game before it is scored as it stands")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of model players")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens a model player may write per move")
    parser.add_argument("--results", type=Path, default=Path("arena/results.jsonl"),
                        help="the results file; games are appended, ratings use all of it")
    parser.add_argument("--out", type=Path, default=None, help="folder of arena.md and arena.png (default: the "
                                                               "results file's folder)")
    parser.add_argument("--k", type=float, default=32.0, help="Elo K factor (default 32)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the intervals")
    parser.add_argument("--seed", type=int, default=0, help="seed of scripted players, sampling and the bootstrap")
    return parser


def _specs(parser: argparse.ArgumentParser, values: list[str]) -> list[PlayerSpec]:
    specs = []
    for value in values:
        try:
            specs.append(parse_spec(value))
        except ValueError as err:
            parser.error(str(err))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        parser.error(f"--player: names must differ; got {names}")
    if len(specs) == 1:
        parser.error("--player: give at least two players to play a round (or none to only rate the results)")
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per env request otherwise
    specs = _specs(parser, args.player)
    try:
        params = json.loads(args.create_params)
    except json.JSONDecodeError as err:
        parser.error(f"--create-params: not JSON ({err})")
    if not isinstance(params, dict) or args.tasks < 1 or args.max_moves < 1 or args.k <= 0:
        parser.error("--create-params must be a JSON object; --tasks, --max-moves and --k must be positive")
    if specs:
        asyncio.run(_play(args, specs, params))
    games = [(game["players"], game["scores"]) for game in read_games(args.results)]
    if not games:
        print(f"no games in {args.results} yet: play a round with two or more --player", file=sys.stderr)
        return 1
    ratings = rate_with_intervals(games, k=args.k, samples=args.bootstrap, seed=args.seed)
    report = table(ratings, games=len(games), k=args.k, level=0.95)
    out = args.out or args.results.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "arena.md").write_text(report)
    plot(ratings, out / "arena.png")
    print(report + f"\ntable: {out / 'arena.md'}  plot: {out / 'arena.png'}  results: {args.results}")
    return 0


async def _play(args: argparse.Namespace, specs: list[PlayerSpec], params: dict) -> None:
    env = EnvClient(EnvClientSettings(env_url=args.env_url))
    try:
        tasks = (await env.aget_env_profile(args.env_type, args.split))[: args.tasks]
        factory = PlayerFactory(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)

        def progress(number: int, total: int, outcome: GameOutcome) -> None:
            logger.info("game %d/%d %s: %s %s", number, total, outcome.task_id, outcome.players,
                        outcome.scores or outcome.error)

        await play_round(env, args.env_type, specs, tasks, factory=factory, results=args.results,
                         max_moves=args.max_moves, params=params, progress=progress)
    finally:
        await env.aclose()


if __name__ == "__main__":
    sys.exit(main())
