"""``python -m agentevolver.logview --root <folder> [--host 127.0.0.1] [--port 8002]``: serve the viewer.

The launcher starts this with ``--with-logview``; it can also run on its own next to (or after) a run.
It binds to 127.0.0.1 unless told otherwise: the pages show everything the agent saw and did, with no login.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

__all__ = ["build_parser", "main"]

logger = logging.getLogger("agentevolver.logview")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agentevolver.logview", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True,
                        help="a run folder (trainer.default_local_dir or a rollout job's --run-dir) or a folder "
                             "of runs; it may not exist yet")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8002, help="port (default 8002)")
    parser.add_argument("--tokenizer", default=None,
                        help="model folder or built-in name whose tokenizer decodes token ids (default: the "
                             "run's latest checkpoint, if it saved one; else ids are shown)")
    parser.add_argument("--max-depth", type=int, default=4, help="how many folders below --root to look for runs")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if not 0 < args.port < 65536:
        parser.error(f"--port must be between 1 and 65535; got {args.port}")
    if args.max_depth < 0:
        parser.error(f"--max-depth must be >= 0; got {args.max_depth}")
    root = Path(args.root).expanduser().resolve()
    if root.exists() and not root.is_dir():
        parser.error(f"--root {root} is a file; give the run folder (the one holding rollouts/)")
    if not root.exists():
        logger.warning("--root %s does not exist yet; the pages will say so until a run creates it", root)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s: anyone who can reach it can read the trajectories (there is no login)",
                       args.host)

    import uvicorn

    from agentevolver.logview.app import create_app

    app = create_app(root, tokenizer=args.tokenizer, max_depth=args.max_depth)
    logger.info("trajectory viewer for %s on http://%s:%d", root, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
