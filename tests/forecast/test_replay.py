"""The replay: torch's orders replayed give the textbook bubbles, the order is torch's whatever the
hash seed, the runtime's overhead and a waiting rank's wake-up are charged where they fall."""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from typing import NamedTuple

import pytest

from seamkit.forecast import replay, torch_order
from seamkit.forecast.replay import p2p_ops, resume_at, with_runtime
from seamkit.seams.placement import schedule_owner
from seamkit.torch_internals import ComputationType

F, B, W = ComputationType.FORWARD, ComputationType.FULL_BACKWARD, ComputationType.BACKWARD_WEIGHT


class Act(NamedTuple):
    """What the replay reads of one of torch's actions."""
    stage_index: int
    computation_type: object
    microbatch_index: int


def unit_replay(schedule: str, P: int, M: int, f=1, i=1, w=1):
    """Replay torch's order with exact costs: F = f, I = i, W = w, B = i + w, messages free."""
    cost = {"F": Fraction(f), "I": Fraction(i), "W": Fraction(w), "B": Fraction(i + w)}
    order = torch_order(schedule, P, M)
    return replay(order.actions, schedule_owner(schedule, P), lambda a: cost[a.computation_type.value], lambda v: 0)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("P,M", [(2, 4), (3, 5), (4, 8)])
def test_gpipe_and_1f1b_give_the_textbook_bubble(schedule, P, M):
    r = unit_replay(schedule, P, M, f=1, i=1, w=0)  # unit forward and backward, zero link
    assert r.bubble == Fraction(P - 1, M + P - 1)
    assert r.makespan_s == 2 * (M + P - 1)


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (4, 16)])
def test_zbv_bubble_with_and_without_weight_gradients(P, M):
    # F = I = W: only the warm-up no order can avoid (rank P-1 waits for P-1 forwards), per rank
    # of 6M chunk actions; W = 0 leaves nothing to fill the warm-up and cool-down, and ZB-V's
    # bubble is that of 1F1B over its 2 chunks a rank: (P-1)(F+I) idle per rank
    assert unit_replay("zbv", P, M, 1, 1, 1).bubble == Fraction(P - 1, 6 * M + P - 1)
    no_w = unit_replay("zbv", P, M, 1, 1, 0)
    assert no_w.bubble == Fraction(P - 1, 2 * M + P - 1)
    assert no_w.bubble == unit_replay("interleaved1f1b", P, M, 1, 1, 0).bubble


ORDER_SCHEDULES = (("dualpipev", 2, 4), ("zbv", 2, 4), ("interleavedzb", 2, 4), ("dualpipev", 3, 6))
ORDER_SCRIPT = ("import sys; from seamkit.forecast.replay import torch_order\n"
                "for s, p, m in {schedules}:\n    o = torch_order(s, p, m); print(s, p, m, o.actions, o.relabelled)")


def test_torch_order_does_not_depend_on_the_hash_seed():
    """Each process hashes str (and so ComputationType, a str enum) with its own seed, this one with
    a random one, the child with seed 7. Planted fault this catches: an order built through a set
    of actions (it comes out in another order under another seed)."""
    want = "".join(f"{s} {p} {m} {o.actions} {o.relabelled}\n"
                   for s, p, m in ORDER_SCHEDULES for o in [torch_order(s, p, m)])
    proc = subprocess.run([sys.executable, "-c", ORDER_SCRIPT.format(schedules=ORDER_SCHEDULES)],
                          env={**os.environ, "PYTHONHASHSEED": "7"}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.strip().splitlines()[-1:]
    assert proc.stdout == want


def test_runtime_overhead_adds_each_action_and_each_p2p_op_exactly():
    c, a, p, msg = Fraction(3), Fraction(1, 7), Fraction(1, 11), Fraction(1, 5)
    # one rank, two stages: nothing crosses, so every action pays a and no op
    one = {0: [Act(0, F, 0), Act(1, F, 0), Act(1, B, 0), Act(0, B, 0)]}
    base = replay(one, [0, 0], lambda x: c, lambda v: msg)
    plus = replay(one, [0, 0], with_runtime(lambda x: c, [0, 0], a, p), lambda v: msg)
    assert plus.makespan_s - base.makespan_s == 4 * a
    assert [p2p_ops(x, [0, 0]) for x in one[0]] == [0, 0, 0, 0]
    # two ranks, one micro-batch, a chain: each of the 4 actions sends or receives once across the
    # boundary (F0 sends, F1 receives, B1 sends, B0 receives), W issues nothing
    two = {0: [Act(0, F, 0), Act(0, B, 0)], 1: [Act(1, F, 0), Act(1, B, 0), Act(1, W, 0)]}
    owner = [0, 1]
    assert [p2p_ops(x, owner) for r in (0, 1) for x in two[r]] == [1, 1, 1, 1, 0]
    base = replay(two, owner, lambda x: c, lambda v: msg)
    plus = replay(two, owner, with_runtime(lambda x: c, owner, a, p), lambda v: msg)
    assert base.makespan_s == 4 * c + 2 * msg  # W(1) runs beside B(0): off the critical path
    assert plus.makespan_s - base.makespan_s == 4 * a + 4 * p


def test_a_rank_that_waited_for_another_s_message_resumes_wake_s_after_it():
    """wake_s is charged where a rank sat waiting for a message from another rank, once, and not
    where the message was there before the rank was free. Planted faults this catches: no charge;
    a charge on every message from another rank, waited for or not."""
    c, msg, wake = Fraction(3), Fraction(1, 5), Fraction(1, 13)
    owner = [0, 1]
    # one micro-batch: rank 1 waits for F0's output and rank 0 for B1's gradient, two wakes
    chain = {0: [Act(0, F, 0), Act(0, B, 0)], 1: [Act(1, F, 0), Act(1, B, 0)]}
    assert replay(chain, owner, lambda x: c, lambda v: msg).makespan_s == 4 * c + 2 * msg
    assert replay(chain, owner, lambda x: c, lambda v: msg, wake).makespan_s == 4 * c + 2 * msg + 2 * wake
    # two micro-batches: F(1,1)'s input arrives (2c + msg) while rank 1 still runs F(1,0) (until
    # 2c + msg + wake), so it follows F(1,0) at once
    gpipe = {0: [Act(0, F, 0), Act(0, F, 1)], 1: [Act(1, F, 0), Act(1, F, 1)]}
    spans = replay(gpipe, owner, lambda x: c, lambda v: msg, wake).spans[1]
    assert spans[0][1] == c + msg + wake and spans[1][1] == spans[0][2]
    # one rank: nothing crosses, nothing to wake for
    one = {0: [Act(0, F, 0), Act(1, F, 0), Act(1, B, 0), Act(0, B, 0)]}
    assert replay(one, [0, 0], lambda x: c, lambda v: msg, wake).makespan_s == 4 * c
    # the rule itself: a message there before the rank is free costs nothing, even just before
    assert resume_at(5, Fraction(49, 10), Fraction(1)) == 5 and resume_at(5, Fraction(11, 2), 1) == Fraction(13, 2)
