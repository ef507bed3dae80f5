"""``python -m agentevolver.launcher``: same as ``python launcher.py``."""

import sys

from agentevolver.launcher.cli import main

sys.exit(main())
