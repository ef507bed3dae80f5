"""Start everything for a training run: ``python launcher.py --conf examples/quickstart.yaml --with-env``.

Companion services (environment, memory, trajectory viewer, local LLM) come from the config's
``launcher.services``; the run is recorded under ``launcher_record/<experiment>/``; training is
``python -m agentevolver.main_ppo`` on that record; whatever was started is stopped at the end.
``python launcher.py --help`` lists the options; docs/launcher.md explains them.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from agentevolver.launcher import main

if __name__ == "__main__":
    sys.exit(main())
