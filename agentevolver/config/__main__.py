"""``python -m agentevolver.config [--config-name NAME] [--config-dir DIR] [--section S] [overrides ...]``.

Composes and validates a config exactly as the trainer will, then prints it as YAML. Use it to check a
preset or an override before launching a run; a bad value exits with status 2 and a message naming the key.
``python -m agentevolver.config migrate OLD.yaml [-o NEW.yaml]`` rewrites a reference AgentEvolver config
(:mod:`agentevolver.config.migrate`).
"""

from __future__ import annotations

import argparse
import sys

from omegaconf import OmegaConf

from agentevolver.config.loader import ROOT_CONFIG_NAME, load_config
from agentevolver.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["migrate"]:
        from agentevolver.config.migrate import main as migrate

        return migrate(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m agentevolver.config",
        description="Compose, validate and print an AgentEvolver config.",
    )
    parser.add_argument("--config-name", default=ROOT_CONFIG_NAME, help="config file name without .yaml")
    parser.add_argument("--config-dir", default=None, help="folder holding it (default: the project's config/)")
    parser.add_argument("--section", default=None, help="print only this top-level section")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. task_manager.n=4")
    args = parser.parse_args(argv)
    try:
        # The entry point checks plug-in names too (the config package itself imports no mechanism).
        from agentevolver.module.agent_flow.plugins import plugin_name_errors

        cfg, _settings = load_config(args.overrides, config_name=args.config_name, config_dir=args.config_dir,
                                     checks=(plugin_name_errors,))
        node = cfg
        if args.section is not None:
            if args.section not in cfg:
                raise ConfigError(f"--section {args.section!r}: no such top-level section")
            node = cfg[args.section]
        sys.stdout.write(OmegaConf.to_yaml(node, resolve=True))
    except ConfigError as err:
        sys.stderr.write(f"config error: {err}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
