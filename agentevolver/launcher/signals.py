"""SIGINT/SIGTERM as flags that a polling loop reads, shared by the launcher and the ablation runner.

Why flags and not an exception from the handler: both loops must stop their children in order (training
first, then services), which a ``KeyboardInterrupt`` raised at an arbitrary line would cut short.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Interrupted", "SignalFlags"]


class Interrupted(Exception):
    """Raised by :meth:`SignalFlags.check` once a signal arrived; carries its number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalFlags:
    """SIGINT/SIGTERM set flags: the first asks for a shutdown; one received while shutting down hurries it."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.count = 0
        self.count_at_shutdown: int | None = None

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        if self.received is None:
            self.received = signum

    def check(self) -> None:
        if self.received is not None:
            raise Interrupted(self.received)

    def shutting_down(self) -> None:
        self.count_at_shutdown = self.count

    def hurry(self) -> bool:
        return self.count_at_shutdown is not None and self.count > self.count_at_shutdown

    @contextmanager
    def installed(self) -> Iterator[SignalFlags]:
        previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
