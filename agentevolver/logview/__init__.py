"""Trajectory viewer: a small web app over a run's rollout dumps and metrics (docs/logview.md).

    python -m agentevolver.logview --root checkpoints/agentevolver [--port 8002] [--tokenizer tiny-test]

:func:`create_app` builds the FastAPI app over a root folder (a run, or a folder of runs).
"""

from agentevolver.logview.app import create_app

__all__ = ["create_app"]
