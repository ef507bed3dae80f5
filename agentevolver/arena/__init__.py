"""The arena: checkpoints, endpoints and scripted players play rounds of a game; Elo ranks them.

``python -m agentevolver.arena --player NAME=SPEC ...`` (docs/env_games.md) plays every pair on every task in
both seat orders (:mod:`.tournament`) through the environment service, appends each game to a results file
(:mod:`.results`; a later run adds to it), and rates the whole file: sequential Elo with K = 32 and bootstrap
intervals (:mod:`.elo`), a table and a plot (:mod:`.report`).
"""
