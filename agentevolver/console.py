"""A quiet console for training runs: what a user acts on stays on screen, everything goes to a log file.

A CPU run of ``python -m agentevolver.main_ppo`` printed ~100 lines for two steps, most of them notices
nobody can act on (verl engines that are not installed, torch.fx deprecation, Ray's token notice, checkpoint
file names, weight-loading bars of every worker). Ray forwards every worker's output through the driver's
``sys.stdout`` / ``sys.stderr`` (looked up at each write), so one filter there sees all of it:

* every line is appended to the run's ``console.log`` (``<trainer.default_local_dir>/console.log``);
* a line is shown unless it matches :data:`NOISE` (each pattern says why it is noise). Unknown lines,
  warnings and errors are shown: the filter removes what is known to be useless, never what is new.

``--verbose`` (``main_ppo`` and the launcher) or ``AGENTEVOLVER_VERBOSE=1`` turns the filter off.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

__all__ = ["NOISE", "VERBOSE_ENV", "QuietStream", "attach", "install", "is_noise", "verbose"]

#: Setting it to 1 (what ``--verbose`` does) shows everything.
VERBOSE_ENV = "AGENTEVOLVER_VERBOSE"

#: Ray's prefix of a forwarded worker line, e.g. ``\x1b[36m(TaskRunner pid=123)\x1b[0m ``.
_RAY_PREFIX = re.compile(r"^(\x1b\[[0-9;]*m)?\((?:[\w.]+ )?pid=\d+[^)]*\)(\x1b\[[0-9;]*m)?\s?")

#: (pattern, why it is noise). Matched with ``re.search`` on the line without Ray's prefix.
NOISE: tuple[tuple[str, str], ...] = (
    (r"engine is not available: ModuleNotFoundError", "verl lists optional engines this run does not use"),
    (r"^\s*warnings\.warn\(", "the source line under a Python warning"),
    (r"Token authentication is enabled for this Ray cluster", "Ray's notice about a local cluster"),
    (r"Started a local Ray instance", "Ray start-up chatter"),
    (r"is_fx_tracing will return true", "a torch.fx deprecation inside verl"),
    (r"Platform override from VERL_PLATFORM", "the platform line every process prints"),
    (r"Disabled critic as algorithm\.adv_estimator", "verl's note that GRPO needs no critic"),
    (r"use_critic = need_critic|use_critic=need_critic\(config\)", "the source line under that note"),
    (r"RayPPOTrainer' is deprecated", "verl's legacy trainer is the one this project extends on purpose"),
    (r"^\s*super\(\).__init__\(\*args, \*\*kwargs\)", "the source line under that warning"),
    (r"'set_vital' is deprecated|torch\.set_vital\(", "a torchdata deprecation"),
    (r"No model-specific Continuous Token builder", "verl's token builder, unused by our agent loop"),
    (r"^ray init kwargs:", "the Ray arguments (in the run record already)"),
    (r"\[validate_config\] All configuration checks passed", "verl's config check passed"),
    (r"^Size of train dataloader", "dataloader sizes (the table shows steps)"),
    (r"^colocated worker base class", "verl internals"),
    (r"^bind role \w+ method \w+ to class", "verl binds the worker methods of the rollout server it hosts"),
    (r"Failed to set NUMA affinity", "no libnuma on this machine; nothing to act on"),
    (r"^Skipping monkey patch for", "verl's fused-kernel note"),
    (r"contains [\d.]+[KMB] parameters$", "model size (in the run record)"),
    (r"^(Before|After) FSDP, memory allocated", "FSDP memory notes"),
    (r"^Total steps: \d+, num_warmup_steps", "the LR schedule (the table shows steps)"),
    (r"^LLMServerManager:", "rollout server names"),
    (r"^Checkpoint tracker file does not exist", "a fresh run has no checkpoint yet"),
    (r"^Using dataset class", "verl internals"),
    (r"^local_global_step_folder:", "each checkpoint's folder"),
    (r"Saved (model|optim|extra_state|hf_model|model config and tokenizer class) to", "checkpoint files"),
    (r"^(Loading weights|Writing model shards):", "weight load/save progress bars of every worker"),
    (r"`torch_dtype` is deprecated", "a transformers deprecation"),
    (r"^'Final validation metrics: None'$", "no final validation was configured"),
    (r"^\s*$", "an empty line (Ray prints one before each progress bar)"),
    (r"^test_gen_batch meta info:", "verl's validation batch settings"),
    (r"^validation generation end$", "verl's validation progress note (our 'validation @ step' line follows)"),
    (r"^\(\"(Initial|Final) validation metrics: \{", "verl's dict of validation metrics (our one-line "
                                                      "'validation @ step' summary shows them)"),
    (r"""^ +["'](?:'val-(?:aux|core)/|np\.(?:float|int)\d*\()""", "the continuation lines of that dict"),
)
_NOISE = re.compile("|".join(f"(?:{pattern})" for pattern, _ in NOISE))


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in {"1", "true", "yes"}


def is_noise(line: str) -> bool:
    """Whether ``line`` (one line, without its newline) is hidden from the console."""
    return bool(_NOISE.search(_RAY_PREFIX.sub("", line)))


class QuietStream(io.TextIOBase):
    """A text stream that writes every line to ``log`` and the non-noise lines to ``shown``.

    Lines are cut at ``\\n`` and ``\\r`` (progress bars redraw with ``\\r``); a partial line waits for its end.
    """

    def __init__(self, shown: TextIO, log: Any, lock: threading.Lock) -> None:
        super().__init__()
        self.shown, self.log, self._lock = shown, log, lock
        self._partial = ""

    def write(self, text: str) -> int:
        with self._lock:
            self.log.write(text)
            self.log.flush()
            pieces = re.split(r"(\r\n|\n|\r)", self._partial + text)
            self._partial = pieces.pop()  # after the last separator: not a whole line yet
            for line, end in zip(pieces[0::2], pieces[1::2], strict=True):
                if not is_noise(line):
                    self.shown.write(line + end)
            self.shown.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self.shown.flush()
            self.log.flush()

    def isatty(self) -> bool:
        return self.shown.isatty()

    def fileno(self) -> int:  # writers that need a real descriptor bypass the filter
        return self.shown.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.shown, "encoding", "utf-8")

    def writable(self) -> bool:
        return True


class _LogFile:
    """The log side of both streams: held in memory until :func:`attach` names the file (so a run that stops
    on a config error writes nothing to disk), then appended to the file."""

    def __init__(self) -> None:
        self.pending: io.StringIO | None = io.StringIO()
        self.file: TextIO | None = None

    def write(self, text: str) -> None:
        if self.file is not None:
            self.file.write(text)
        elif self.pending is not None:
            self.pending.write(text)

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def open(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the life of the process
        if self.pending is not None:
            self.file.write(self.pending.getvalue())
            self.pending = None
        self.file.flush()


def install() -> bool:
    """Route ``sys.stdout`` and ``sys.stderr`` through :class:`QuietStream` (idempotent); False when
    ``--verbose`` / ``AGENTEVOLVER_VERBOSE`` asks for everything (nothing installed). The full output is kept
    in memory until :func:`attach` gives it a file."""
    if verbose():
        return False
    if isinstance(sys.stdout, QuietStream):
        return True
    log, lock = _LogFile(), threading.Lock()
    streams = {id(sys.stdout): QuietStream(sys.stdout, log, lock), id(sys.stderr): QuietStream(sys.stderr, log, lock)}
    sys.stdout, sys.stderr = streams[id(sys.stdout)], streams[id(sys.stderr)]
    # Handlers created before this (Ray's driver logger is set up at `import ray`) hold the old streams.
    loggers = [logging.getLogger(), *(item for item in logging.root.manager.loggerDict.values()
                                      if isinstance(item, logging.Logger))]
    for handler in (handler for item in loggers for handler in item.handlers):
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in streams:
            handler.setStream(streams[id(handler.stream)])
    return True


def attach(log_path: Path) -> Path | None:
    """Write the full output (so far and from now on) to ``log_path``; None when no filter is installed."""
    stream = sys.stdout
    if not isinstance(stream, QuietStream):
        return None
    log_path = log_path.expanduser().resolve()
    with stream._lock:
        stream.log.open(log_path)
    return log_path
