"""Rank 0's word for each step boundary of a multi-process arm, and Ctrl-C on a rank.

Rank 0 decides (`ranks.RankLoop.decide`) and every rank obeys at the same step boundary: the
word travels down a chain with the activations (`stages`), or is summed into the step's
all_reduce where the other ranks add 0 (`schedules`, `ddp`), so GO must be 0.
"""

from __future__ import annotations

import time

GO, STOP, INTERRUPT, PAUSE, FAILED = 0, 1, 2, 3, 4
SAVE = 8  # added to GO or PAUSE: every rank leaves its state at this boundary first (a periodic checkpoint)


def kind(word: int) -> int:
    """The word without its SAVE flag."""
    return word & ~SAVE


_SIGINT = {"at": None}


def on_sigint(signum, frame) -> None:
    """First Ctrl-C: stop between steps. Another one a second later: stop now. Under a terminal
    and a launcher, a rank can receive Ctrl-C twice within milliseconds; those count as one."""
    now = time.monotonic()
    if _SIGINT["at"] is None:
        _SIGINT["at"] = now
    elif now - _SIGINT["at"] > 1.0:
        raise KeyboardInterrupt


def stop_requested() -> bool:
    return _SIGINT["at"] is not None


def clear() -> None:
    """Forget a Ctrl-C (a process that runs another arm after one that stopped)."""
    _SIGINT["at"] = None
