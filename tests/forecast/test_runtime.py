"""What torch's pipelining runtime and ranks sharing the host cost, measured on two gloo ranks."""

from __future__ import annotations

from seamkit.config import preset
from seamkit.forecast.runtime import measure_runtime


def test_the_runtime_figures_are_measured_on_two_ranks():
    """Seconds of a P2P op, an action's overhead, a wake-up and DDP's all-reduce; the sharing
    factors, ratios of like compute (about 1 to 1.5 on two quiet cores; the lower bound leaves
    room for a machine whose load moves the medians of 20 turns). Planted faults these bounds
    catch: a pipe_factor whose timing inside the pipe missed the backwards (about 0.5, 0.45 at the
    cpu preset), one that counted the waits too (far above 1); a dp_sync_s of the whole step, or
    of nothing."""
    cfg = preset("tiny")
    rt = measure_runtime(cfg, rows=1, repeats=4, threads=1, dp_rows=cfg.data.batch // 2, turns=20)
    assert rt["action_s"] >= 0 and rt["p2p_op_s"] > 0 and rt["wake_s"] >= 0 and rt["how"]
    assert rt["p2p_op_s"] == (rt["send_op_s"] + rt["recv_op_s"]) / 2
    assert 0.6 < rt["shared_factor"] < 3 and 0.6 < rt["pipe_factor"] < 3, rt
    assert len(rt["shared_factor_ranks"]) == len(rt["pipe_factor_ranks"]) == 2
    assert rt["dp_rows"] == cfg.data.batch // 2 and 0 < rt["dp_sync_s"] < 1, rt
    assert "medians of 20 turns" in rt["how"] and rt["rows"] == 1
