"""Each multi-rank candidate's own sharing factor: its ranks' own work, alone and all at once."""

from __future__ import annotations

import pytest
import torch

from seamkit.config import override, preset
from seamkit.forecast import shares as shares_module
from seamkit.forecast.candidates import candidates, needs_share
from seamkit.forecast.shares import (
    PipeWork,
    measure_shares,
    pace_factor,
    rank_segments,
    share_key,
)
from seamkit.seams.launch import run_ranks
from seamkit.torch_internals import BACKWARDS, timed_stage_backwards


def test_the_pace_of_ranks_computing_at_once_is_the_slowest_rank_s_each_turn():
    # rank 1 is twice as slow alone; turn by turn the slower of the two ratios sets the pace:
    # 1.5, 1.4 and 1.2, median 1.4 (the mean of the ranks' own median ratios would be 1.2)
    alone = [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    both = [[1.5, 1.1, 1.2], [2.2, 2.8, 2.4]]
    assert pace_factor(alone, both) == pytest.approx(1.4)
    assert pace_factor(alone, [[1.0] * 3, [2.0] * 3]) == 1.0


def test_each_rank_s_share_of_a_candidate_is_the_segments_it_holds():
    cfg = override(preset("cpu"), {"seams.arms": "e2e,local,delayed"})
    by = {(c.arm, c.name): c for c in candidates(cfg, 2, cores=2) if c.reason is None}
    held = {k: [rank_segments(c, r) for r in (0, 1)] for k, c in by.items() if c.name != "single"}
    assert held[("e2e", "dp")] == [[("whole:8", False)], [("whole:8", False)]]
    assert held[("e2e", "pipe:1f1b:4")] == [[("first:4", False)], [("last:4", True)]]
    assert held[("e2e", "pipe:zbv:4")] == [[("first:2", False), ("last:2", True)],
                                           [("middle:2", True), ("middle:2", True)]]
    first, second = held[("local", "stages")]
    assert [k for k, _ in first] == ["first:1"] + ["middle:1"] * 3 and not any(g for _, g in first + second)
    assert [g for _, g in held[("delayed", "stages")][1]] == [True] * 4  # its gradients go back, late


def test_measure_shares_runs_each_device_count_s_candidates_on_ranks_of_their_threads(monkeypatch):
    """One set of ranks per device count, of the candidates' threads, every candidate of ranks
    computing at once and none other. Planted faults this catches: every N's candidates on one set
    of ranks (the world of the first); `single` measured as if its process were ranks; the
    threads left at the launcher's."""
    cfg = override(preset("tiny"), {"seams.arms": "e2e,local,delayed"})
    cands = [c for n in (1, 2, 4) for c in candidates(cfg, n) if c.reason is None]
    started = []

    def ranks(fn, world, cfg, cs, repeats, threads, label):
        started.append((world, [share_key(c) for c in cs], threads))
        return [{share_key(c): 1.25 for c in cs}] * world
    monkeypatch.setattr(shares_module, "run_ranks", ranks)
    got = measure_shares(cfg, cands, repeats=2)
    want = {n: [share_key(c) for c in cands if c.devices == n and needs_share(c)] for n in (2, 4)}
    assert started == [(2, want[2], 1), (4, want[4], 1)] and set(got) == {"2", "4"}
    assert all(got[str(n)] == dict.fromkeys(want[n], 1.25) for n in (2, 4))
    assert "local:stages" in want[2] and not any(k.endswith(":single") for k in want[2] + want[4])


def _pipe_work_rank(rank: int, world: int, events, store, cfg, pipes, multi) -> dict:
    """Each pipe's inside (its torch schedule, both ranks at once) and alone (its actions run
    directly) on this rank: the parameters each leaves a gradient on and the autograd passes of
    each kind it makes; then what `measure_shares`'s ranks return for `multi`."""
    torch.set_num_threads(1)  # a rank's share of the two cores, as the candidates run them
    mine = {}
    for c in pipes:
        work = PipeWork(cfg, c, rank)
        for way, fn in (("alone", work.alone), ("inside", work.inside)):
            calls = dict.fromkeys(BACKWARDS, 0)

            def counting(fn, calls=calls):
                name = next(n for n in BACKWARDS if fn.__name__ == n)

                def run(*args, **kw):
                    calls[name] += 1
                    return fn(*args, **kw)
                return run
            torch.distributed.barrier()
            with timed_stage_backwards(counting):
                seconds = fn()
            grads = sorted(n for n, p in work.model.named_parameters()
                           if p.grad is not None and p.grad.abs().sum() > 0)
            mine[f"{c.name}/{way}"] = {"grads": grads, "calls": calls, "seconds": seconds}
            work.model.zero_grad(set_to_none=True)
    mine["factors"] = shares_module._rank(rank, world, events, store, cfg, multi, 2, 1)
    return mine


def test_a_pipe_s_sharing_factor_times_the_same_compute_inside_its_schedule_and_alone():
    """shares.py's pipe work: one step of the candidate's own torch schedule on two ranks, and the
    same forwards and backwards run directly, must touch the same weights with the same autograd
    passes (B, or I then W), or the factor would compare different work; and the ranks give every
    multi-rank candidate a factor. Planted faults this catches: the last stage's loss handed to
    stage_backward as a tuple (its backward does nothing alone); the I/W split ignored alone (B in
    place of I and W); a rank's second stage skipped."""
    cfg = override(preset("tiny"), {"seams.arms": "e2e,local,delayed"})
    ok = [c for c in candidates(cfg, 2, cores=2) if c.reason is None]
    pipes = [c for c in ok if c.schedule in ("1f1b", "interleavedzb", "zbv")]
    multi = [c for c in ok if c.name in ("dp", "pipe:zbv:4", "stages")]
    assert len(pipes) == 3 and len(multi) == 4  # dp, a pipe of two stages a rank, the local and delayed stages
    ranks = run_ranks(_pipe_work_rank, 2, cfg, pipes, multi, label="test pipe work")
    for c in pipes:
        for rank, got in enumerate(ranks):
            alone, inside = got[f"{c.name}/alone"], got[f"{c.name}/inside"]
            assert inside["grads"] and alone["grads"] == inside["grads"], (c.name, rank)
            assert alone["calls"] == inside["calls"], (c.name, rank)
            assert alone["seconds"] > 0 and inside["seconds"] > 0
        split = any(got[f"{c.name}/inside"]["calls"]["stage_backward_weight"] for got in ranks)
        assert split == (c.schedule != "1f1b"), c.name
        assert any("head" in n for n in ranks[c.owner[-1]][f"{c.name}/alone"]["grads"])
    factors = ranks[0]["factors"]
    assert set(factors) == {share_key(c) for c in multi} and all(f > 0 for f in factors.values())
