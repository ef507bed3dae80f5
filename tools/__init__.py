"""Development tools the tests run, kept out of the runtime package (``agentevolver``): nothing in training
imports them.

* :mod:`.gpu_kernel_check`: our own tensor code on a CUDA device with torch, transformers and numpy alone
  (``bash scripts/gpu_check.sh --kernels`` = ``python -m tools.gpu_kernel_check`` from the repository root);
* :mod:`.adv_oracle`: the ADCA-GRPO maths as a per-sample loop, the oracle the tests and the kernel check hold
  the vectorised stage to, and ``bench/advantage.py``'s baseline.

Imported from the repository root (``python -m``; pytest puts the root on ``sys.path``, ``pyproject.toml``).
"""
