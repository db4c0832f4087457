"""How the arms of a study take turns, whatever their placement.

The arms train in turns of `seams.slice_seconds` of their own training clock: only the arm
holding the turn trains, the others wait with their clocks paused, so whatever else the machine
does lands on every arm alike. The study (`seams.run`) holds a `TurnTable`; each rank of each arm
holds an `ArmTurns` over the same shared values.

- Rank 0 of an arm decides when its slice is used up (`due`) and says so in the word its ranks
  hear every step (`seams.words.PAUSE`); every rank then pauses at that step boundary (`pause`).
- The arm's turn lasts until its last rank stopped computing: ranks downstream of rank 0 still
  work through the steps in flight (stages keep up to `placement.QUEUE` of them) after rank 0
  paused. The ranks exchange when they stopped (`gather`, one small collective) and each counts
  the time from its own stop to the latest as training time. So every rank's clock, and rank 0's
  budget and slice decisions with it, count the whole turn the arm held the machine for.
- Rank 0 then hands the turn back, and every rank sleeps on a shared condition (no polling
  beside the arm that trains) until the table grants this arm its next turn, or the study halts.
A periodic checkpoint is a pause too, without handing the turn on.

Both sides record each turn's steps, seconds and tokens/s (`slices`): the study's spread of speeds.
"""

from __future__ import annotations

import time
from typing import Callable

from seamkit.loop import Clock
from seamkit.seams.launch import context

WAKE_S = 1.0  # a waiting rank looks at the halt flag at least this often


class TurnTable:
    """The study's side: each arm's count of turns granted, one condition every rank sleeps on, and
    the halt flag. Handed to the ranks through `shared(arm)` (picklable for spawned processes)."""

    def __init__(self, ctx, arms):
        self.cond, self.halt = ctx.Condition(), ctx.Event()
        self.granted = {a: ctx.Value("i", 0, lock=False) for a in arms}

    def shared(self, arm: str) -> tuple:
        return self.cond, self.granted[arm], self.halt

    def give(self, arm: str) -> None:
        with self.cond:
            self.granted[arm].value += 1
            self.cond.notify_all()

    def stop(self) -> None:
        self.halt.set()
        with self.cond:
            self.cond.notify_all()


class ArmTurns:
    """One rank's side (module docstring). `shared` None: the arm runs alone, without turns, and
    every call is a no-op but the slice records."""

    def __init__(self, shared: tuple | None, rank: int, slice_s: float, tokens_per_step: int,
                 emit: Callable[[dict], None], gather: Callable[[float], list[float]]):
        self.shared, self.rank, self.slice_s, self.per_step = shared, rank, slice_s, tokens_per_step
        self.emit, self.gather = emit, gather
        self.held = 0  # turns this arm has been granted so far
        self.t0, self.steps0, self.wall0 = 0.0, 0, 0.0
        self.slices: list[dict] = []  # wall_start/wall_end: time.monotonic(), one clock for every process

    @property
    def halted(self) -> bool:
        return self.shared is not None and self.shared[2].is_set()

    def first(self) -> None:
        """Wait for the arm's first turn (before its clock starts)."""
        self._wait()

    def start(self, t: float, steps: int) -> None:
        self.t0, self.steps0, self.wall0 = t, steps, time.monotonic()

    def due(self, clock: Clock, steps: int) -> bool:
        """Rank 0, after `steps` steps: this turn's slice is used up (a turn runs at least one step)."""
        return (self.shared is not None and steps > self.steps0 and clock.elapsed() - self.t0 >= self.slice_s
                and clock.settled() - self.t0 >= self.slice_s)  # the host's clock first, then a reading

    def pause(self, clock: Clock, steps: int, stopped_at: float, hand_on: bool = True) -> None:
        """Every rank, at the step boundary rank 0 named: count the arm's last rank's stop, then
        hand the turn on and wait for the next (`hand_on`), or go on (a checkpoint's pause)."""
        with clock.paused():
            last = max(self.gather(stopped_at))
        clock.count(max(0.0, last - stopped_at))
        if not hand_on or self.shared is None:
            return
        self._record(steps, clock.settled(), wall_end=last)
        with clock.paused():
            if self.rank == 0:
                self.emit({"kind": "_turn", "done": False})
            self._wait()
        self.start(clock.elapsed(), steps)

    def finish(self, steps: int, elapsed_s: float) -> None:
        """The rank's training has ended: its last slice."""
        self._record(steps, elapsed_s)

    def hand_back(self) -> None:
        """Rank 0, once the arm has evaluated and checkpointed too: the turn goes on for good."""
        if self.shared is not None and self.rank == 0:
            self.emit({"kind": "_turn", "done": True})

    def _record(self, steps: int, t: float, wall_end: float | None = None) -> None:
        if steps > self.steps0 and t > self.t0:
            self.slices.append({"steps": steps - self.steps0, "seconds": t - self.t0,
                                "tokens_per_s": (steps - self.steps0) * self.per_step / (t - self.t0),
                                "wall_start": self.wall0,
                                "wall_end": time.monotonic() if wall_end is None else wall_end})

    def _wait(self) -> None:
        """Until the table grants this arm its next turn, or the study halts."""
        if self.shared is None:
            return
        cond, granted, halt = self.shared
        want = self.held + 1
        with cond:
            while granted.value < want and not halt.is_set():
                cond.wait(WAKE_S)
        self.held = max(self.held, min(want, granted.value))


def table(arms) -> TurnTable:
    """A TurnTable for the launcher's ranks."""
    return TurnTable(context(), arms)
