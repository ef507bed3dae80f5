"""``python launcher.py --conf PRESET.yaml [--with-env [NAMES]] [--with-memory] [--with-logview] [--with-llm]
[--with NAME ...] [--dry-run] [-- OVERRIDES ...]``: start the companion services a run needs, record the
run, train, and stop everything it started.

Exit status: the training run's; 2 for a bad config or command line (nothing was started); 3 when a
service could not be started or did not become healthy; 128 + N when stopped by signal N (130 = Ctrl-C).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from rich.console import Console

from agentevolver.errors import ConfigError
from agentevolver.launcher.launch import launch, say, stderr_console
from agentevolver.launcher.plan import BUILT_IN_SERVICES, DEFAULT_TARGET, build_plan, print_plan
from agentevolver.paths import CONFIG_DIR

__all__ = ["main"]

#: Exit status for a bad config or command line.
USAGE_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launcher.py",
        description="Start companion services, record the run, train with agentevolver.main_ppo, stop what "
                    "was started. Hydra overrides go after `--`, e.g. `-- trainer.total_training_steps=2`.",
        epilog="Services are described in the config's launcher.services section (docs/launcher.md).",
    )
    parser.add_argument("--conf", type=Path, default=CONFIG_DIR / "agentevolver.yaml",
                        help="the run's config file, e.g. examples/quickstart.yaml (default: the root config)")
    parser.add_argument("--with-env", nargs="?", const="", default=None, metavar="NAMES",
                        help="start the environment service, serving NAMES (comma-separated; default: "
                             "env_service.env_type) at env_service.env_url")
    parser.add_argument("--with-memory", action="store_true", help="start the memory service at memory.base_url")
    parser.add_argument("--with-logview", action="store_true", help="start the trajectory viewer over this run")
    parser.add_argument("--with-llm", action="store_true",
                        help="start the local LLM server at llm.endpoints.local.base_url")
    parser.add_argument("--with", dest="extra", action="append", default=[], metavar="NAME",
                        help="start the service launcher.services.NAME (repeatable)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (services, ports, commands, record folder) and start nothing")
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help="training module run with --config-path/--config-name (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None, *, console: Console | None = None) -> int:
    """Run the launcher; returns the exit status."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    ours, overrides = (args_in[: args_in.index("--")], args_in[args_in.index("--") + 1 :]) if "--" in args_in \
        else (args_in, [])
    args = _parser().parse_args(ours)
    console = console or stderr_console()
    selected = [*args.extra]
    flags = {"env": args.with_env is not None, "memory": args.with_memory, "logview": args.with_logview,
             "llm": args.with_llm}
    selected += [name for name in BUILT_IN_SERVICES if flags[name]]
    try:
        plan, cfg, settings = build_plan(args.conf, overrides, selected, args.with_env, args.target)
    except ConfigError as err:
        say(console, f"config error: {err}", "error")
        return USAGE_ERROR
    except KeyboardInterrupt:  # Ctrl-C while the config is composed: nothing was started yet
        return 128 + signal.SIGINT
    if args.dry_run:
        print_plan(plan, Console(highlight=False, soft_wrap=True), settings.launcher.probe_timeout_s)
        return 0
    return launch(plan, cfg, settings, command_line=[sys.argv[0] if argv is None else "launcher.py", *args_in],
                  console=console)
