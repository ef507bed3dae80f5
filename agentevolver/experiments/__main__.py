"""``python -m agentevolver.experiments ablation --conf ABLATION.yaml ...`` (see agentevolver.experiments.cli)."""

import sys

from agentevolver.experiments.cli import main

sys.exit(main())
