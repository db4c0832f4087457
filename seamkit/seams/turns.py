"""How an arm takes turns with the other arms of the study, on one process or on many.

The arms of a study train in turns of `seams.slice_seconds` of their own training clock: only the
arm holding the turn trains, the others wait with their clocks paused, so whatever else the
machine does lands on every arm alike (`seams.processes` hands the turns out).

- `Turns`: a one-process arm's side, a gate its budget loop calls before every step (it waits on
  a multiprocessing Event and hands the turn back through a queue).
- `RankTurns`: one rank's side of an arm that runs on several processes (data parallel, pipeline
  stages). All its ranks pause at the same step boundary: rank 0 decides (`due`) and says so in
  the message its run sends every step anyway, then each rank reports a `_paused` event and
  waits, clock paused, until the arm's coordinator leaves `go-<n>` in the turns folder (or
  `halt`, when the study stops). The arm's turn lasts until its last rank stopped computing:
  ranks downstream of rank 0 still work through the steps in flight (local and delayed stages
  keep up to `queue` of them) after rank 0 has paused. Each rank reports when it stopped, the
  coordinator writes the latest of those times into `go-<n>`, and every rank counts the time from
  its own stop to that one as training time. So every rank's clock, and rank 0's budget and slice
  decisions with it, count the whole turn the arm held the machine for; otherwise rank 0 would
  spend its budget while the last stage ran on past it, by up to `queue` steps a turn. A paused
  rank sleeps on a pipe the coordinator writes to, not polling, so the arm holding the turn
  trains beside no wake-ups of the others. The coordinator hands the turn back only once every
  rank has paused, so no rank of one arm computes during another arm's turn. A periodic
  checkpoint is a pause too: every rank leaves its state at that boundary, and the coordinator
  joins the states into the arm's checkpoint before it lets the ranks go on (in the same turn,
  unless it ended).

Both record each turn's steps, seconds and tokens/s (`slices`): the study's spread of speeds.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from pathlib import Path
from typing import Callable

from seamkit.loop import Clock

TURNS_ENV = "SEAMKIT_TURNS"  # a rank's turns folder; unset: the arm runs alone, without turns
WAKE_S = 1.0  # a paused rank looks for its go file at least this often, woken or not


class _Slices:
    def __init__(self, tokens_per_step: int):
        self.per_step = tokens_per_step
        self.t0, self.steps0, self.wall0 = 0.0, 0, 0.0
        self.slices: list[dict] = []  # wall_start/wall_end: time.monotonic(), one clock for every process

    def _start(self, t: float, steps: int) -> None:
        self.t0, self.steps0, self.wall0 = t, steps, time.monotonic()

    def _record(self, steps: int, t: float, wall_end: float | None = None) -> None:
        if steps > self.steps0 and t > self.t0:
            self.slices.append({"steps": steps - self.steps0, "seconds": t - self.t0,
                                "tokens_per_s": (steps - self.steps0) * self.per_step / (t - self.t0),
                                "wall_start": self.wall0,
                                "wall_end": time.monotonic() if wall_end is None else wall_end})


class Turns(_Slices):
    """A one-process arm's side of the turns: `gate(clock, steps)` for `loop.budget_loop`.

    Before a step, it waits for the turn (clock paused) when it does not hold it, and hands the
    turn on once the current slice has run `slice_s` training seconds.
    """

    def __init__(self, arm: str, go, q, slice_s: float, tokens_per_step: int, stop: Callable[[], bool]):
        super().__init__(tokens_per_step)
        self.arm, self.go, self.q, self.slice_s, self.stop = arm, go, q, slice_s, stop
        self.held = False

    def acquire(self) -> None:
        while not self.go.wait(0.1):
            if self.stop():
                return  # the loop sees stop() next and ends the arm as interrupted
        self.held = True

    def release(self, done: bool = False) -> None:
        self.held = False
        self.go.clear()
        self.q.put({"kind": "_turn", "arm": self.arm, "done": done})

    def __call__(self, clock: Clock, steps: int) -> None:
        if self.held and clock.elapsed() - self.t0 < self.slice_s:
            return
        with clock.paused():
            if self.held:
                self._record(steps, clock.elapsed())
                self.release()
            self.acquire()
        self._start(clock.elapsed(), steps)

    def finish(self, steps: int, elapsed_s: float) -> None:
        """Close the last slice (the loop has ended)."""
        if self.held:
            self._record(steps, elapsed_s)


class RankTurns(_Slices):
    """One rank's side of a multi-process arm's turns (see the module docstring). Without a
    folder every call is a no-op: the arm runs alone."""

    def __init__(self, folder, rank: int, slice_s: float, tokens_per_step: int, emit: Callable[[dict], None]):
        super().__init__(tokens_per_step)
        self.folder = Path(folder) if folder else None
        self.rank, self.slice_s, self.emit, self.n = rank, slice_s, emit, 0
        self.wake = None
        if self.folder is not None:  # a paused rank sleeps on this pipe: no wake-ups beside the arm training
            path = self.folder / f"wake-{rank}"
            if not path.exists():
                os.mkfifo(path)
            self.wake = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # read-write: opening never blocks

    @classmethod
    def from_env(cls, rank: int, slice_s: float, tokens_per_step: int, emit) -> "RankTurns":
        return cls(os.environ.get(TURNS_ENV), rank, slice_s, tokens_per_step, emit)

    def first(self) -> None:
        """Wait for the arm's first turn (before its clock starts)."""
        if self.folder is not None:
            self._wait(0)

    def due(self, clock: Clock, steps: int) -> bool:
        """Rank 0, after `steps` steps: this turn's slice is used up (a turn runs at least one step)."""
        return self.folder is not None and steps > self.steps0 and clock.elapsed() - self.t0 >= self.slice_s

    def pause(self, clock: Clock, steps: int, hand_on: bool = True, saved: bool = False,
              stopped_at: float | None = None) -> None:
        """Every rank, at the step boundary rank 0 named: hand the turn on and wait for the next.
        `saved`: every rank left its state for a checkpoint first; `hand_on=False`: a pause only
        for the coordinator to join those states, after which the same turn goes on.
        `stopped_at`: when this rank's computing stopped (time.monotonic(); default now). The time
        from there to the arm's last rank stopping counts on this rank's clock (module docstring)."""
        if self.folder is None:
            return
        stopped_at = time.monotonic() if stopped_at is None else stopped_at
        with clock.paused():
            self.n += 1
            self.emit({"kind": "_paused", "turn": self.n, "rank": self.rank, "hand_on": hand_on, "saved": saved,
                       "stopped_at": stopped_at})
            last = self._wait(self.n)
        if last is not None:
            clock.count(max(0.0, last - stopped_at))
        if hand_on:
            self._record(steps, clock.elapsed(), wall_end=max(stopped_at, last or 0.0))
            self._start(clock.elapsed(), steps)

    def finish(self, steps: int, elapsed_s: float) -> None:
        """The rank's training has ended: its last slice, and a `_trained` event, so the
        coordinator no longer waits for this rank to pause (a stage that stopped on a failure
        while its upstream still runs)."""
        if self.folder is not None:
            self._record(steps, elapsed_s)
            self.emit({"kind": "_trained", "rank": self.rank})

    def _wait(self, n: int) -> float | None:
        """Until `go-n` or `halt` is in the folder: asleep on the wake pipe, which the coordinator
        writes to after leaving either (and at least every WAKE_S, should a byte go astray).
        Returns when the arm's last rank stopped computing before this turn, as `go-n` says (None:
        halted, the first turn, or a coordinator that did not say)."""
        go, halt = self.folder / f"go-{n}", self.folder / "halt"
        while not (go.exists() or halt.exists()):
            if select.select([self.wake], [], [], WAKE_S)[0]:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake, 4096)
        try:
            text = go.read_text().strip()
        except OSError:
            return None
        return float(text) if text else None


def _wake_all(folder) -> None:
    """A byte to every paused rank's wake pipe (one not yet made looks at the files first)."""
    for path in Path(folder).glob("wake-*"):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader any more: that rank has gone
            continue
        try:
            with contextlib.suppress(BlockingIOError):  # a full pipe wakes its reader anyway
                os.write(fd, b"x")
        finally:
            os.close(fd)


def give_turn(folder, n: int, last_stopped: float | None = None) -> None:
    """The coordinator's side: turn `n` of a multi-process arm may start. `last_stopped`: when
    the arm's last rank stopped computing at the pause before it (time.monotonic()), written into
    the go file whole (renamed into place) for every rank to count up to."""
    go = Path(folder, f"go-{n}")
    tmp = go.with_name(f".{go.name}.tmp")
    tmp.write_text("" if last_stopped is None else repr(float(last_stopped)))
    os.replace(tmp, go)
    _wake_all(folder)


def halt(folder) -> None:
    """The coordinator's side: no rank of the arm waits for a turn any more (the study stops)."""
    Path(folder, "halt").touch()
    _wake_all(folder)
