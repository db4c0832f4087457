"""Ctrl-C and SIGTERM over a run's whole life, in every phase.

A study (or a train run) is its own for SIGINT and SIGTERM from its first line to its last,
whatever this process inherited (a command started with `&` from a script starts with SIGINT
ignored; a scheduler ends a job with SIGTERM). `Interrupts` is what its phases poll:

- a phase with steps to stop between (training, the calibration's candidate runs: `urgent=False`)
  only notes the first signal; its loops see `interrupts()` turn True and stop at a step
  boundary, so the checkpoint they leave can be resumed;
- a phase with nothing to keep (loading, checks, measuring costs, evaluating: `urgent=True`)
  is abandoned at once: the first signal raises KeyboardInterrupt there;
- writing state is never torn: the phase `saving` (`urgent=False` too) only notes the signal;
- a second signal more than a second after the first always raises KeyboardInterrupt (a
  terminal can deliver one Ctrl-C twice within milliseconds: those count as one).

The run then writes an interrupted report naming the phase (`phase`) and the signal (`name`),
which `--resume` continues.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}  # what a shell reports for a process the signal ended


class Interrupts:
    """The signals a run got, and the phase it is in (module docstring)."""

    def __init__(self):
        self.got: int | None = None
        self.at = 0.0
        self.phase = "starting"
        self.urgent = True
        self.interrupted_in: str | None = None

    def __call__(self) -> bool:
        return self.got is not None

    @property
    def name(self) -> str | None:
        return signal.Signals(self.got).name if self.got is not None else None

    def enter(self, phase: str, urgent: bool = True) -> None:
        """The run is now in `phase`; a signal already noted interrupts an urgent one at once."""
        self.phase, self.urgent = phase, urgent
        if urgent and self.got is not None:
            self.interrupted_in = self.interrupted_in or phase
            raise KeyboardInterrupt

    def handler(self, signum, frame) -> None:
        now = time.monotonic()
        if self.got is None:
            self.got, self.at = signum, now
            self.interrupted_in = self.phase
            if self.urgent:
                raise KeyboardInterrupt
        elif now - self.at > 1.0:
            raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts():
    """SIGINT and SIGTERM routed to a fresh `Interrupts` for the block (main thread only: elsewhere
    the signals stay where they are, and the object only reports what it was told)."""
    it = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield it
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, it.handler)
    try:
        yield it
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
