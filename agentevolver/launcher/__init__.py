"""The launcher: companion services from the config, a run record, the training run, a clean shutdown.

``python launcher.py --conf examples/quickstart.yaml --with-env`` (or ``python -m agentevolver.launcher``).

* :mod:`~agentevolver.launcher.plan` - compose the config, resolve services and the training command.
* :mod:`~agentevolver.launcher.services` - a service's command, address and health probe.
* :mod:`~agentevolver.launcher.processes` - start children in their own sessions, stop exactly those.
* :mod:`~agentevolver.launcher.record` - ``launcher_record/<experiment>/``.
* :mod:`~agentevolver.launcher.launch` - the sequence: record, services, training, shutdown.

See docs/launcher.md.
"""

from agentevolver.launcher.cli import main

__all__ = ["main"]
