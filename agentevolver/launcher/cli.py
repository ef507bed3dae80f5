"""``python launcher.py --conf PRESET.yaml [--with-env [NAMES]] [--with-memory] [--with-logview] [--with-llm]
[--with NAME ...] [--dry-run] [-- OVERRIDES ...]``: start the companion services a run needs, record the
run, train, and stop everything it started.

Exit status: the training run's; 2 for a bad config or command line (nothing was started); 3 when a
service could not be started or did not become healthy; 128 + N when stopped by signal N (130 = Ctrl-C).

The reference AgentEvolver launcher's flags (``agentevolver.config.reference_keys.REFERENCE_FLAGS``) are
known too, so they never end as "unrecognized arguments": ``--with-appworld`` / ``--with-bfcl`` /
``--with-reme`` start the same service as ``--with-env appworld`` / ``--with-env bfcl`` / ``--with-memory``
(with a warning that names our flag); the others are refused in one message that says what to do instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from rich.console import Console

from agentevolver.config.reference_check import check_inputs
from agentevolver.config.reference_keys import REFERENCE_FLAGS, FlagRule
from agentevolver.console import VERBOSE_ENV
from agentevolver.errors import ConfigError
from agentevolver.launcher.launch import launch, say, stderr_console
from agentevolver.launcher.plan import BUILT_IN_SERVICES, DEFAULT_TARGET, build_plan, print_plan
from agentevolver.paths import CONFIG_DIR

__all__ = ["main"]

#: Exit status for a bad config or command line.
USAGE_ERROR = 2


PIPED_PLAN_WIDTH = 10_000  # columns for a --dry-run plan written to a pipe: wider than any command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launcher.py",
        description="Start companion services, record the run, train with agentevolver.main_ppo, stop what "
                    "was started. Hydra overrides go after `--`, e.g. `-- trainer.total_training_steps=2`.",
        epilog="Services are described in the config's launcher.services section (docs/launcher.md). The reference "
               "AgentEvolver launcher's flags (--with-appworld, --with-bfcl, --with-reme, ...) are understood: "
               "docs/launcher.md, 'Reference launcher flags'.",
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
    parser.add_argument("--verbose", action="store_true",
                        help="show every line the training prints (default: the progress bar, the step table, "
                             "validation lines and warnings; the rest goes to <run dir>/console.log)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (services, ports, commands, record folder) and start nothing")
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help="training module run with --config-path/--config-name (default: %(default)s)")
    for rule in REFERENCE_FLAGS:  # hidden: the reference launcher's flags, handled by _reference_flags
        parser.add_argument(*rule.flags, action=_ReferenceFlag, rule=rule, dest="reference_flags")
    return parser


class _ReferenceFlag(argparse.Action):
    """Records a reference launcher flag as typed; :func:`_reference_flags` maps or refuses it."""

    def __init__(self, option_strings: list[str], dest: str, rule: FlagRule, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=1 if rule.takes_value else 0, default=[],
                         help=argparse.SUPPRESS)
        self.rule = rule

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), (option_string or "", self.rule)])


def _reference_flags(args: argparse.Namespace, overrides: list[str], console: Console) -> bool:
    """Apply the reference flags that have an exact counterpart (warning once each); refuse the others,
    together with any reference key in the config or overrides, in one message. Returns False on refusal."""
    used: list[tuple[str, FlagRule]] = args.reference_flags
    refused = [f"{flag}: not an option here; {rule.note}" for flag, rule in used if rule.replacement is None]
    if refused:
        lines = [f"reference AgentEvolver launcher flags ({len(refused)} to change; docs/launcher.md):",
                 *(f"  {line}" for line in refused)]
        try:
            check_inputs(args.conf if args.conf.is_file() else None, overrides)
        except ConfigError as err:
            lines.append(str(err))
        say(console, "\n".join(lines), "error")
        return False
    envs: list[str] = []
    for flag, rule in dict.fromkeys(used):
        say(console, f"{flag} is the reference launcher's flag: read as {rule.replacement} ({rule.note})",
            "warning")
        if rule.env is not None:
            envs.append(rule.env)
        if rule.service is not None:  # a built-in service's short flag, e.g. --with-memory
            setattr(args, f"with_{rule.service}", True)
    if envs:
        given = [name for name in (args.with_env or "").split(",") if name.strip()]
        args.with_env = ",".join(dict.fromkeys([*given, *envs]))
    return True


def main(argv: list[str] | None = None, *, console: Console | None = None) -> int:
    """Run the launcher; returns the exit status."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    ours, overrides = (args_in[: args_in.index("--")], args_in[args_in.index("--") + 1 :]) if "--" in args_in \
        else (args_in, [])
    args = _parser().parse_args(ours)
    console = console or stderr_console()
    if not _reference_flags(args, overrides, console):
        return USAGE_ERROR
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
        # Piped (a file, a test, CI): no terminal width to fold to, so every command stays on one copyable line.
        width = None if sys.stdout.isatty() else PIPED_PLAN_WIDTH
        print_plan(plan, Console(highlight=False, soft_wrap=True, width=width), settings.launcher.probe_timeout_s)
        return 0
    if args.verbose:  # the training process inherits it: agentevolver.console shows every line
        os.environ[VERBOSE_ENV] = "1"
    return launch(plan, cfg, settings, command_line=[sys.argv[0] if argv is None else "launcher.py", *args_in],
                  console=console)
