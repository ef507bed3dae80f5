"""Start the environment service: ``python env_service/env_service.py --env codebox,bfcl --port 8080``.

Also ``python -m env_service``. Binds 127.0.0.1 unless ``--host`` says otherwise; with
``--auth-token-env NAME`` every route but ``/healthz`` requires ``Authorization: Bearer $NAME``.
``curl http://127.0.0.1:8080/healthz`` answers ``OK`` once ready; OpenAPI docs at ``/docs``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydantic import ValidationError

from env_service.app import create_app
from env_service.errors import EnvServiceError
from env_service.registry import available_envs, load_envs
from env_service.settings import ServiceSettings

logger = logging.getLogger("env_service")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="env_service", description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True,
                        help=f"comma-separated environments to serve; shipped: {', '.join(available_envs())}")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--max-instances", type=int, default=256, help="live instances at most (429 beyond)")
    parser.add_argument("--call-timeout", type=float, default=120.0, help="seconds one create/step/evaluate may take")
    parser.add_argument("--idle-timeout", type=float, default=3600.0,
                        help="seconds after which an unused instance is released")
    parser.add_argument("--reap-interval", type=float, default=60.0, help="seconds between idle scans")
    parser.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="largest request body accepted")
    parser.add_argument("--auth-token-env", default=None,
                        help="name of an env var holding a bearer token that clients must send")
    parser.add_argument("--isolation", action="append", default=[], metavar="ENV=MODE",
                        help="override an environment's isolation: inline, process or ray (repeatable)")
    parser.add_argument("--threads", type=int, default=32, help="worker threads for inline instances")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (repeatable): how environments outside this repository register")
    parser.add_argument("--log-level", default="info")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, load the environments, serve until interrupted; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        isolation = dict(item.split("=", 1) for item in args.isolation)
        settings = ServiceSettings(
            envs=[name.strip() for name in args.env.split(",") if name.strip()],
            max_instances=args.max_instances, call_timeout_s=args.call_timeout, idle_timeout_s=args.idle_timeout,
            reap_interval_s=args.reap_interval, max_body_bytes=args.max_body_bytes,
            auth_token_env=args.auth_token_env, isolation=isolation, threads=args.threads,
        )
        unknown = sorted(set(settings.isolation) - set(settings.envs))
        if unknown:
            raise ValueError(f"--isolation names environments that are not served: {', '.join(unknown)}")
        for module in args.plugin:
            importlib.import_module(module)
        env_classes = load_envs(settings.envs)
        if "ray" in {settings.isolation.get(n, c.isolation) for n, c in env_classes.items()}:
            import ray

            ray.init(address="local", include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        app = create_app(settings, env_classes)
    except (ValidationError, ValueError, EnvServiceError, ImportError) as err:
        sys.stderr.write(f"env_service: error: {err}\n")
        return 2

    import uvicorn

    logger.info("serving %s on http://%s:%d", ", ".join(settings.envs), args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=30,
                timeout_keep_alive=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
