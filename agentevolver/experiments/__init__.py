"""Experiments: ablations of the self-evolving mechanisms, arms x seeds, each a normal launcher run.

``python -m agentevolver.experiments ablation --conf examples/ablation/quickstart.yaml --arms grpo,sa --seeds 3``

* :mod:`~agentevolver.experiments.spec` - the ablation file: training preset, arms (named Hydra overrides),
  seeds, shared services.
* :mod:`~agentevolver.experiments.plan` - every run's launcher command, composed and checked up front.
* :mod:`~agentevolver.experiments.state` - which runs are done (resume), their attempts and wall time.
* :mod:`~agentevolver.experiments.runner` - the shared services launch, the runs one by one, Ctrl-C.
* :mod:`~agentevolver.experiments.hold` - the services launch's target: waits while the runs reuse them.
* :mod:`~agentevolver.experiments.report` - README.md table, curves.png, commands.sh, summary.json.

The entry point is :func:`agentevolver.experiments.cli.main`. This package imports nothing itself, so the
services holder (``python -m agentevolver.experiments.hold``) starts without the runner's imports.

See docs/experiments.md.
"""
