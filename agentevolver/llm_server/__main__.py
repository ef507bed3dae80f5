"""Start the local LLM server: ``python -m agentevolver.llm_server --model smollm2-135m-instruct --port 8010``.

Loads the model (a built-in name or a local HF folder, via ``agentevolver.models.resolve_model_path``)
before it listens, so ``GET /healthz`` answering ``OK`` means requests can be served. SIGTERM or Ctrl-C
stops it gracefully (running requests get ``--shutdown-timeout`` seconds, then their rows are aborted) and
the process exits with status 0. A bad argument or model exits with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import errno
import logging
import signal
import socket
import sys
import time
from pathlib import Path

from agentevolver.errors import AgentEvolverError

logger = logging.getLogger("agentevolver.llm_server")

_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agentevolver.llm_server", description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", required=True,
                        help="built-in model name (smollm2-135m-instruct, tiny-test) or a local HF model folder")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument("--served-model-name", default=None,
                        help="name clients send as 'model' (default: the --model value as given)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="prompt + completion tokens per request (default: the model's max_position_embeddings)")
    parser.add_argument("--max-concurrency", type=int, default=16,
                        help="most sequences decoded together in one batch; more requests wait for the next batch")
    parser.add_argument("--batch-wait-ms", type=float, default=20.0,
                        help="how long the first request of a batch waits for others to join it")
    parser.add_argument("--turn-cache-mb", type=float, default=1024,
                        help="MiB of finished replies' keys/values kept so that a conversation's next request "
                             "prefills only its new tokens (docs/cpu_generator.md, turn cache); 0 turns it off")
    parser.add_argument("--dtype", choices=_DTYPES, default="float32",
                        help="weights dtype; auto: bfloat16 where the CPU has bf16 units, else float32")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads for the model; 0 = torch's default (one per core). 1 is several "
                             "times faster when other busy processes (training) share the cores; see "
                             "docs/llm_server.md")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the sampling stream for requests without their own 'seed'")
    parser.add_argument("--chat-template", type=Path, default=None,
                        help="jinja chat template file replacing the tokenizer's own")
    parser.add_argument("--tool-call-parser", default="hermes",
                        help="parser that turns tool calls in a reply into message.tool_calls when a request has "
                             "'tools' (agentevolver.module.tools.parsing registry name, or 'none')")
    parser.add_argument("--api-key-env", default=None,
                        help="NAME of an env var holding the API key clients must send (default: no key)")
    parser.add_argument("--shutdown-timeout", type=float, default=5.0,
                        help="seconds running requests may take to finish after SIGTERM before they are aborted")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, load the model, serve until SIGTERM/Ctrl-C; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        _check_args(args)
        _check_port_free(args.host, args.port)
        started = time.perf_counter()
        from agentevolver.models import resolve_model_path

        folder = resolve_model_path(args.model)  # before torch is imported: a wrong name fails in a second
        from agentevolver.llm_server.app import create_app
        from agentevolver.llm_server.engine import Engine

        if args.threads:
            import torch

            torch.set_num_threads(args.threads)

        template = args.chat_template.read_text(encoding="utf-8") if args.chat_template else None
        engine = Engine.load(
            folder, served_name=args.served_model_name or args.model, max_model_len=args.max_model_len,
            max_batch_size=args.max_concurrency, batch_wait_s=args.batch_wait_ms / 1000, dtype=args.dtype,
            seed=args.seed, chat_template=template, turn_cache_mb=args.turn_cache_mb,
        )
        parser = None if args.tool_call_parser.lower() == "none" else args.tool_call_parser
        app = create_app(engine, api_key_env=args.api_key_env, tool_call_parser=parser)
    except (AgentEvolverError, ValueError, KeyError, OSError) as err:
        sys.stderr.write(f"agentevolver.llm_server: error: {_message(err)}\n")
        return 2

    import uvicorn

    logger.info("model %r loaded in %.1f s; serving on http://%s:%d/v1", engine.served_name,
                time.perf_counter() - started, args.host, args.port)
    # uvicorn re-raises the signal that stopped it once shutdown is done; a no-op handler turns that into a
    # normal return, so a supervisor sees exit status 0 for a requested, clean stop.
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=args.shutdown_timeout)
    return 0


def _check_args(args: argparse.Namespace) -> None:
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535; got {args.port}")
    if args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1; got {args.max_concurrency}")
    if args.batch_wait_ms < 0:
        raise ValueError(f"--batch-wait-ms must be >= 0; got {args.batch_wait_ms}")
    if args.turn_cache_mb < 0:
        raise ValueError(f"--turn-cache-mb must be >= 0 (0 turns the turn cache off); got {args.turn_cache_mb}")
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 1, or 0 for torch's default; got {args.threads}")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout must be >= 0; got {args.shutdown_timeout}")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise ValueError("--served-model-name is empty; leave it out to serve under the --model value")
    if args.chat_template is not None and not args.chat_template.is_file():
        raise ValueError(f"--chat-template {args.chat_template} is not a file")


def _check_port_free(host: str, port: int) -> None:
    """Fail before the model load, not after it, when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} on {host} is already in use: pass another --port, or stop the "
                                 "process holding it") from None
            raise ValueError(f"cannot bind {host}:{port}: {err.strerror}; check --host") from None


def _message(err: BaseException) -> str:
    if isinstance(err, KeyError) and err.args:  # KeyError's str() quotes its message
        return str(err.args[0])
    return str(err)


if __name__ == "__main__":
    sys.exit(main())
