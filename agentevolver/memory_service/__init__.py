"""Experience memory HTTP service (Self-Navigating), speaking ReMe 0.2's task-memory API.

Start it with ``python -m agentevolver.memory_service --port 8001 [--data-dir DIR]``; see
docs/memory_service.md. Modules, in the order a request meets them: :mod:`.app` (routes, errors),
:mod:`.service` (the operations), :mod:`.summarizer` / :mod:`.retriever` (ReMe's two pipelines),
:mod:`.prompts` (what the LLM is asked), :mod:`.embedding` and :mod:`.store` (registries of embedders and
vector stores), :mod:`.jsonl_io` (import/export), :mod:`.settings` (configuration), :mod:`.models` (the wire
format, shared with :mod:`agentevolver.client.memory_client`).

Importing this package is cheap: torch, sentence-transformers and faiss load only when a service opens.
"""
