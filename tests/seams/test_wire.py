"""seams.wire: what crosses a seam, counted message by message, measured against the analytic
bytes; the runs on real ranks are test_stages.py and test_schedules.py."""

import torch

from seamkit import config as C
from seamkit.seams import wire as W
from seamkit.seams.placement import layout


def test_a_tally_counts_bytes_and_messages_by_direction_kind_and_boundary():
    """Planted fault this catches: bytes counted as elements (a float32 message 4x short)."""
    t = W.Tally()
    t.add("sent", "activation", 1, torch.zeros(2, 3))
    t.add("sent", "activation", 1, torch.zeros(2, 3))
    t.add("received", "gradient", 0, torch.zeros(5, dtype=torch.bfloat16))
    t.add("sent", "control", 1, torch.zeros(1, dtype=torch.long))
    assert sorted(t.counts(), key=str) == sorted([
        {"direction": "sent", "kind": "activation", "seam": 1, "bytes": 48, "messages": 2},
        {"direction": "received", "kind": "gradient", "seam": 0, "bytes": 10, "messages": 1},
        {"direction": "sent", "kind": "control", "seam": 1, "bytes": 8, "messages": 1}], key=str)


def _pipe_ranks(act: int, steps: int, m: int) -> list[dict]:
    """What two pipe ranks count over one crossing (boundary 0) in `steps` steps of m micro-batches."""
    def row(direction, kind, n, size):
        return {"direction": direction, "kind": kind, "seam": 0, "bytes": n * size, "messages": n}
    n, size = steps * m, act // m
    return [{"rank": 0, "wire_steps": steps, "traffic": [row("sent", "activation", n, size),
                                                         row("received", "gradient", n, size)]},
            {"rank": 1, "wire_steps": steps, "traffic": [row("received", "activation", n, size),
                                                         row("sent", "gradient", n, size)]}]


def test_the_bytes_check_agrees_and_can_fail():
    """The counts of a 2-stage e2e pipe agree with the analytic bytes; one message 4 bytes short
    on one side makes sent differ from received and the measurement disagree; a local arm whose
    gradient crossed disagrees too."""
    act, steps, m = 4096, 3, 2
    ranks = _pipe_ranks(act, steps, m)
    good = W.measured_bytes("e2e", ranks, [0], [0, 1], act, m)
    assert good["agrees"] and good["sent_equals_received"] and good["per_step"] == good["analytic_per_step"] == 2 * act
    assert good["gradient_messages_received"] == steps * m and good["crossings"] == 1
    short = [dict(r) for r in ranks]
    short[1]["traffic"] = [{**c, "bytes": c["bytes"] - 4} if c["kind"] == "gradient" else c
                           for c in ranks[1]["traffic"]]
    bad = W.measured_bytes("e2e", short, [0], [0, 1], act, m)
    assert not bad["agrees"] and not bad["sent_equals_received"]
    assert not W.measured_bytes("local", ranks, [0], [0, 1], act, 1)["agrees"]


def test_expected_gradients_start_when_the_sender_first_backpropagates():
    """Crossing k of a chain carries one gradient a step from step d*(S-2-k) on (its sender,
    segment k+1, backpropagates then). Planted fault this catches: counting from the receiver's
    first backward, d*(S-1-k)."""
    cfg = C.override(C.tiny(), {"seams.seams": "all"})
    lay = layout(cfg, "delayed", C.Placement("stages"), 2)
    assert lay.crossings() == [1]
    assert W.expected_gradients(lay, 2, 8) == {1: 6} and W.expected_gradients(lay, 0, 8) == {1: 8}
    assert W.expected_gradients(lay, 9, 8) == {1: 0}


def test_a_timer_counts_a_block_inside_a_block_once(monkeypatch):
    """The clock is read when the outermost block starts and ends, nowhere else. Planted fault
    this catches: a nested block adding its own span (counted twice)."""
    ticks = iter(range(100))
    monkeypatch.setattr(W, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: float(next(ticks)))}))
    timer = W.Timer(torch.device("cpu"))
    with timer:
        with timer:
            pass
    assert timer.s == 1.0 and next(ticks) == 2
    assert W.per_step(10, 4) == 2.5 and W.per_step(12, 4) == 3 and W.per_step(5, 0) == 0
