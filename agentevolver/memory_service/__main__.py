"""Start the memory service: ``python -m agentevolver.memory_service --port 8001 [--data-dir DIR]``.

Loads the embedder and opens the store before binding the port, so ``GET /healthz`` answers ``OK`` only
once requests can be served. Settings come from ``--config FILE`` (YAML, every key in
docs/memory_service.md) with the flags below on top. Binds 127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from agentevolver.errors import AgentEvolverError

logger = logging.getLogger("agentevolver.memory_service")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agentevolver.memory_service", description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=None, help="YAML settings file (flags below override it)")
    p.add_argument("--host", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, help="port (default 8001)")
    p.add_argument("--data-dir", type=Path, help="folder of the persistent store (default $AGENTEVOLVER_CACHE_DIR/memory)")
    llm = p.add_argument_group("LLM (summariser, and reranker/rewriter when enabled)")
    llm.add_argument("--llm-base-url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8010/v1")
    llm.add_argument("--llm-model", help="model name sent to that endpoint")
    llm.add_argument("--llm-api-key-env", help="NAME of the env var holding its API key")
    emb = p.add_argument_group("embedding")
    emb.add_argument("--embedding-backend", choices=["sentence_transformers", "openai"])
    emb.add_argument("--embedding-model", help="'all-MiniLM-L6-v2' (shipped), a model folder, or the endpoint's model")
    emb.add_argument("--embedding-base-url", help="openai backend: base URL of the embeddings endpoint")
    emb.add_argument("--embedding-api-key-env", help="openai backend: NAME of the env var holding its API key")
    knobs = p.add_argument_group("pipeline")
    knobs.add_argument("--success-threshold", type=float, help="score >= this is a success (default 1.0)")
    knobs.add_argument("--validation-threshold", type=float, help="keep experiences the LLM scores >= this (0.5)")
    knobs.add_argument("--top-k", type=int, help="experiences retrieved when a request sends no top_k (3)")
    knobs.add_argument("--enable-llm-rerank", action="store_true", default=None, help="LLM reorders recalled ones")
    knobs.add_argument("--enable-llm-rewrite", action="store_true", default=None, help="LLM rewrites the answer")
    p.add_argument("--auth-token-env", help="NAME of an env var holding a bearer token clients must send")
    p.add_argument("--io-root", type=Path, help="restrict /vector_store dump/load paths to this folder")
    p.add_argument("--log-level", default="info")
    return p


_FLAG_KEYS = {
    "host": "host", "port": "port", "data_dir": "data_dir",
    "embedding_backend": "embedding.backend", "embedding_model": "embedding.model",
    "embedding_base_url": "embedding.base_url", "embedding_api_key_env": "embedding.api_key_env",
    "success_threshold": "summary.success_threshold", "validation_threshold": "summary.validation_threshold",
    "top_k": "retrieve.top_k", "enable_llm_rerank": "retrieve.enable_llm_rerank",
    "enable_llm_rewrite": "retrieve.enable_llm_rewrite", "auth_token_env": "auth_token_env", "io_root": "io_root",
}


def main(argv: list[str] | None = None) -> int:
    """Parse flags, open the service, serve until interrupted; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides: dict[str, Any] = {
        key: (str(value) if isinstance(value, Path) else value)
        for flag, key in _FLAG_KEYS.items() if (value := getattr(args, flag)) is not None
    }
    llm_endpoint: dict[str, Any] | None = None
    if args.llm_base_url or args.llm_model:
        if not (args.llm_base_url and args.llm_model):
            sys.stderr.write("memory_service: error: --llm-base-url and --llm-model go together\n")
            return 2
        llm_endpoint = {"base_url": args.llm_base_url, "model": args.llm_model}
        if args.llm_api_key_env:
            llm_endpoint["api_key_env"] = args.llm_api_key_env
    try:
        from agentevolver.memory_service.app import create_app
        from agentevolver.memory_service.service import MemoryService
        from agentevolver.memory_service.settings import load_settings

        settings = load_settings(args.config, overrides, llm_endpoint)
        service = MemoryService.open(settings)
        app = create_app(service)
    except (AgentEvolverError, ValueError) as err:
        sys.stderr.write(f"memory_service: error: {err}\n")
        return 2

    import uvicorn

    logger.info("serving the memory service on http://%s:%d (data in %s)", settings.host, settings.port,
                settings.data_dir)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level, timeout_graceful_shutdown=30,
                timeout_keep_alive=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
