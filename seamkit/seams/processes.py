"""The study's arms side by side, each on processes of its own, taking turns.

Every arm runs on its placement's ranks, started by the one launcher (`launch.spawn`; one
process for `single`), so its peak RSS is its own. This process (`run_arms`) starts them all,
lets them build their models and data side by side, then hands out turns (`turns.TurnTable`):
only the arm holding the turn trains, for `seams.slice_seconds` of its own training clock
(interleaved) or for its whole run (sequential, in the order of the arms); the others wait with
their clocks paused. Whatever else the machine does therefore lands on every arm alike.

    this process                  e2e ranks                       local ranks
    spawn every arm --------->    build, "_ready"                 build, "_ready"
    give(e2e) -------------->     train one slice, "_turn"
    give(local) ------------------------------------------------> train one slice, "_turn"
    ...                           (last slice) evaluate, checkpoint, "_return", "_turn" done

An arm holds the turn through its evaluation and checkpoint too, so nothing it does competes
with another arm's training. Events (the loop's, `seamkit.loop`) reach the callback here.
Faults: `stop()` (Ctrl-C or SIGTERM here) halts the table, so every arm stops between steps and
reports `interrupted` (an arm whose ranks the signal ended at once, before they could, returns
nothing); a non-finite loss ends that arm `failed` and hands the turn on; a rank that dies
stops the study with one line naming it.
"""

from __future__ import annotations

import queue
import time
from typing import Callable

import torch.distributed as dist

from seamkit.seams.arm import ArmSpec, run_arm
from seamkit.seams.launch import DistError, events_queue, own_error, spawn, take
from seamkit.seams.turns import table as turn_table

STOP_WAIT_S = 60.0  # how long stopped arms may take to end before they are terminated


def arm_rank(rank: int, world: int, events, store, spec: ArmSpec, turns: tuple):
    """One rank of an arm under the launcher: `seams.arm.run_arm` with the study's turns, its
    halt flag as the stop, and the run's store for a failed local stage."""
    halt = turns[2]
    faults = dist.PrefixStore("faults", store) if store is not None else None
    return run_arm(spec, rank, world, emit=events.put, turns=turns, stop=halt.is_set, faults=faults)


def run_arms(specs: dict[str, ArmSpec], callback: Callable[[dict], None] | None = None,
             stop: Callable[[], bool] = lambda: False) -> tuple[dict, bool]:
    """Every arm of `specs` on its processes, taking turns (module docstring). Returns ({arm: its
    ArmResult}, interrupted here); an arm that never reported is missing from the results."""
    arms = list(specs)
    turns, events = turn_table(arms), events_queue()
    groups, values = {}, {a: {} for a in arms}
    ready, done, interrupted = set(), set(), False

    def hand_on(prev: str | None) -> None:
        """The turn goes round: to the next arm after `prev` that still trains."""
        start = arms.index(prev) + 1 if prev in arms else 0
        nxt = next((a for a in arms[start:] + arms[:start] if a not in done), None)
        if nxt is not None:
            turns.give(nxt)

    def handle(e: dict) -> None:
        nonlocal interrupted
        if e["kind"] in ("_return", "_error"):
            take(e, groups[e["group"]], values[e["group"]], None)
            own_error(groups[e["group"]])
        elif e["kind"] == "_ready":
            ready.add(e["arm"])
            if ready == set(arms):
                hand_on(None)
        elif e["kind"] == "_turn":
            if e["done"]:
                done.add(e["arm"])
            hand_on(e["arm"])
        elif callback is not None:
            try:
                callback(e)
            except KeyboardInterrupt:
                interrupted = True
                turns.stop()

    try:
        for arm, spec in specs.items():
            groups[arm] = spawn(arm_rank, spec.layout.ranks, (spec, turns.shared(arm)), events, arm)
        while len(done) < len(arms) or not all(g.done() for g in groups.values()):
            if stop() and not interrupted:
                interrupted = True
                turns.stop()
            try:
                handle(events.get(timeout=0.2))
            except queue.Empty:
                dead = [a for a, g in groups.items() if g.failed() and a not in done]
                if dead and interrupted:  # ranks the signal reached before they could stop between steps:
                    done.update(dead)  # their peers cannot finish a step without them
                    for a in dead:
                        groups[a].stop()
                elif dead:
                    time.sleep(0.2)  # let a rank that failed first say why
                    _drain(events, handle)
                    raise DistError(groups[dead[0]].death())
            except KeyboardInterrupt:
                interrupted = True
                turns.stop()
        _drain(events, handle)
        return {a: values[a][0] for a in arms if values[a].get(0) is not None}, interrupted
    finally:  # also on an error here: the arms stop, then their processes go
        _end(turns, groups, events)


def _end(turns, groups: dict, events) -> None:
    """Stop every arm, give their processes STOP_WAIT_S to end, then terminate the rest."""
    turns.stop()
    deadline = time.monotonic() + STOP_WAIT_S
    while not all(g.done() for g in groups.values()) and time.monotonic() < deadline:
        try:
            events.get(timeout=0.1)  # keep reading: a full queue would block their exit
        except queue.Empty:
            pass
    for g in groups.values():
        g.stop()


def _drain(events, handle) -> None:
    while True:
        try:
            handle(events.get_nowait())
        except queue.Empty:
            return
