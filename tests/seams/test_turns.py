"""seams.turns: an arm's ranks pause together, the turn lasts until the arm's last rank stopped
computing, and waiting ranks sleep until the study gives their arm its next turn or halts.
Ranks are threads here; the arms of a study taking turns on processes: tests/seams/test_study.py."""

import multiprocessing.synchronize
import threading
import time

from seamkit.loop import Clock
from seamkit.seams import turns as T


class Gather:
    """`all_gather_object` of `world` threads: each gets every rank's value once all have given one."""

    def __init__(self, world):
        self.world, self.values, self.cond = world, {}, threading.Condition()

    def of(self, rank):
        def gather(x):
            with self.cond:
                self.values[rank] = x
                self.cond.notify_all()
                self.cond.wait_for(lambda: len(self.values) == self.world, timeout=30)
                return [self.values[r] for r in range(self.world)]
        return gather


def _turns(table, rank, emit, gather, slice_s=1.0):
    return T.ArmTurns(table.shared("local"), rank, slice_s, 10, emit, gather)


def test_the_turn_goes_on_only_once_every_rank_has_paused():
    """Planted fault this catches: rank 0 handing the turn back as soon as it paused itself (the
    other ranks still computing while another arm trains)."""
    table, sent, gather = T.table(["e2e", "local"]), [], Gather(3)
    table.give("local")
    ranks = [_turns(table, r, sent.append, gather.of(r)) for r in range(3)]
    for t in ranks:
        t.first()
        t.start(0.0, 0)
    threads = [threading.Thread(target=ranks[r].pause, args=(Clock(), 4, time.monotonic())) for r in (0, 2)]
    for th in threads:
        th.start()
    time.sleep(0.3)
    assert sent == []  # ranks 0 and 2 paused, rank 1 still computes
    last = threading.Thread(target=ranks[1].pause, args=(Clock(), 4, time.monotonic()))
    last.start()
    deadline = time.monotonic() + 10
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent == [{"kind": "_turn", "done": False}]  # once, from rank 0
    table.give("local")
    for th in [*threads, last]:
        th.join(10)
        assert not th.is_alive()


def test_a_rank_that_stopped_before_the_last_one_counts_the_difference():
    """Rank 0 pauses at its step boundary while a downstream rank still works through the steps
    in flight: its clock counts up to when the last rank stopped, not the wait for the next turn,
    and its slice ends there. Planted faults this catches: the difference not counted (rank 0
    spends its budget while the last rank runs on), or the whole wait counted."""
    table = T.table(["e2e", "local"])
    table.give("local")
    stopped = time.monotonic()
    rt = _turns(table, 0, lambda e: None, lambda x: [x, x + 0.25, x + 0.1])  # the last rank: 0.25 s later
    rt.first()
    clock = Clock()
    rt.start(clock.elapsed(), 0)
    before = clock.elapsed()
    threading.Timer(0.6, lambda: table.give("local")).start()
    rt.pause(clock, 4, stopped)
    counted = clock.elapsed() - before
    assert 0.25 <= counted < 0.5  # the 0.25 s the arm still computed; not the 0.6 s wait
    (s,) = rt.slices
    assert s["steps"] == 4 and s["seconds"] >= before + 0.25 and s["wall_end"] == stopped + 0.25
    # a checkpoint's pause counts the difference too, and neither waits nor ends the slice
    before = clock.elapsed()
    rt.pause(clock, 6, time.monotonic(), hand_on=False)
    assert 0.25 <= clock.elapsed() - before < 0.45 and len(rt.slices) == 1


def test_a_slice_is_due_after_its_seconds_and_at_least_one_step():
    """Planted fault this catches: a turn handed on before its arm took a step (two arms whose
    steps outlast a slice would never train)."""
    table = T.table(["e2e", "local"])
    rt = _turns(table, 0, lambda e: None, lambda x: [x], slice_s=0.05)
    clock = Clock()
    rt.start(clock.elapsed(), 3)
    time.sleep(0.1)
    assert not rt.due(clock, 3) and rt.due(clock, 4)
    alone = T.ArmTurns(None, 0, 0.05, 10, lambda e: None, lambda x: [x])  # no study: no turns
    alone.start(0.0, 0)
    assert not alone.due(clock, 4)


def test_a_paused_rank_sleeps_until_the_study_wakes_it(monkeypatch):
    """A paused rank sleeps on the table's condition (no polling beside the arm that trains) and
    wakes when the study gives its arm the turn or halts. Planted fault this catches: give()
    without notify_all (the rank sleeps on, here for 60 s)."""
    monkeypatch.setattr(T, "WAKE_S", 60.0)
    calls = []
    real = multiprocessing.synchronize.Condition.wait
    monkeypatch.setattr(multiprocessing.synchronize.Condition, "wait",
                        lambda self, timeout=None: calls.append(1) or real(self, timeout))
    for end in ("give", "stop"):
        table = T.table(["e2e", "local"])
        rt = _turns(table, 0, lambda e: None, lambda x: [x])
        waiter = threading.Thread(target=rt.first)
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive() and len(calls) <= 1  # asleep, not polling
        table.give("local") if end == "give" else table.stop()
        waiter.join(timeout=10)
        assert not waiter.is_alive(), end
        assert rt.halted == (end == "stop")
        calls.clear()
