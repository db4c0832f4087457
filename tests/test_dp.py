"""The e2e arm placed data-parallel (seamkit.seams.pipeline.dp): 2 gloo ranks on CPU, tiny preset,
float64, one thread a rank. The ranks are started here (torch.multiprocessing, a file rendezvous
under tmp_path); one run is shared by the checks that read a complete run.
"""

import datetime
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seamkit import config as C
from seamkit import optim as OPT
from seamkit.config import ConfigError
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader
from seamkit.loop import held_out
from seamkit.model import GPT, lm_loss
from seamkit.seams import arm as T
from seamkit.seams.pipeline.dp import DPRun
from seamkit.seams.pipeline.launch import fault_store
from seamkit.seams.pipeline.plan import make_plan

STEPS, N = 3, 2


def tiny(**kw) -> C.RunConfig:
    # float64 (the tight bound against the whole-batch step); the LR by step, so the one-process
    # twin (lr_at(step)) sees the LR the ranks used, whatever their clocks
    return C.override(C.tiny(), {"train.max_steps": STEPS, "train.budget_seconds": 600.0, "train.threads": 1,
                                 "train.lr_schedule": "steps", "train.dtype": "float64", **kw})


def _rank(rank: int, cfg: C.RunConfig, d: str) -> None:
    torch.set_num_threads(1)
    init = f"file://{d}/rendezvous"
    corpus = load_corpus(cfg.data)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=N,
                            timeout=datetime.timedelta(seconds=30))
    r = DPRun(cfg, make_plan(cfg, N), corpus, rank, torch.device("cpu"), lambda e: None, fault_store(init, N, 30))
    res = r.result(r.train())
    torch.save({"result": res, "state": r.state()}, f"{d}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def run_dp(cfg: C.RunConfig, d) -> list[dict]:
    load_corpus(cfg.data)  # fill the cache once, not once a rank
    mp.start_processes(_rank, args=(cfg, str(d)), nprocs=N, join=True, start_method="spawn")
    return [torch.load(d / f"rank{k}.pt") for k in range(N)]


@pytest.fixture(scope="module")
def dp(tmp_path_factory):
    cfg = tiny()
    return cfg, run_dp(cfg, tmp_path_factory.mktemp("dp"))


def _reference(cfg, micro_batches: int) -> tuple[dict, float, float]:
    """One process's e2e arm (seams.arm) for STEPS steps: the whole batch in one backward
    (micro_batches 0: `train_step`), or cut into micro-batches whose losses / M accumulate.
    Returns the weights, the last training loss and the held-out loss."""
    corpus = load_corpus(cfg.data)
    a = T.build_arm("e2e", cfg, corpus)
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    for step in range(STEPS):
        x_BT, y_BT = loader.next()
        lr = OPT.lr_at(step, cfg.train)
        if micro_batches == 0:
            loss = T.train_step(a, x_BT, y_BT, lr, cfg.train.grad_clip)[0]
            continue
        total = torch.zeros((), dtype=torch.float64)
        for x, y in zip(x_BT.chunk(micro_batches), y_BT.chunk(micro_batches)):
            mb = lm_loss(a.model(x), y) / micro_batches
            mb.backward()
            total += mb.detach()
        torch.nn.utils.clip_grad_norm_(a.model.parameters(), cfg.train.grad_clip)
        for g in a.opt.param_groups:
            g["lr"] = lr
        a.opt.step()
        a.opt.zero_grad(set_to_none=True)
        loss = total.item()
    return a.model.state_dict(), loss, T.evaluate(a, held_out(corpus, cfg))


def test_dp_equals_one_process_on_the_same_global_batch(dp):
    """Bitwise equal to one process accumulating N micro-batches of b rows: each rank's gradient
    is its b rows' mean, the hook halves it (exact: N = 2) and gloo adds the two halves, which is
    what accumulating loss/2 of each half computes; the loss is (l0 + l1) / 2 = l0/2 + l1/2 exactly.
    Against the study's whole-batch step (`train_step`) the gradients are the same means summed in
    another order (the matmuls' reductions run over B rows at once, not b and b), a few float64
    ulps (eps 2.2e-16) apart. Losses: 1e-14 relative (measured 1.6e-16). Weights: Adam divides
    each coordinate by its own sqrt(v), so on a coordinate whose gradient is itself round-off-sized
    a few ulps can move the update by a fraction of lr; 1e-13 is 2e-10 of one warm-up step
    (lr_at(0) = 5e-4); measured 1.2e-15."""
    cfg, ranks = dp
    got = ranks[0]["state"]["stage"]
    for k in range(1, N):  # every replica holds the same weights
        assert all(torch.equal(got[n], ranks[k]["state"]["stage"][n]) for n in got)
    r0 = ranks[0]["result"]
    assert r0["status"] == "complete" and r0["steps"] == STEPS
    assert ranks[1]["result"]["final_loss"] is None and ranks[1]["result"]["points"] == []
    assert len(r0["points"]) == cfg.train.curve_points

    want, loss, final = _reference(cfg, N)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert r0["loss"] == loss and r0["final_loss"] == final
    assert all(r["result"]["loss"] == loss for r in ranks)  # every rank knows the mean

    whole, loss_whole, final_whole = _reference(cfg, 0)
    assert r0["loss"] == pytest.approx(loss_whole, rel=1e-14)
    assert r0["final_loss"] == pytest.approx(final_whole, rel=1e-14)
    diffs = [(got[n] - whole[n]).abs().max().item() for n in whole]
    assert max(diffs) > 0  # another computation: the exact check above tells them apart
    assert max(diffs) < 1e-13


def test_measured_allreduce_bytes_equal_the_parameter_bytes(dp):
    cfg, ranks = dp
    analytic = sum(p.numel() for p in GPT(cfg.model).parameters()) * 8  # float64 gradients, once a step
    for r in ranks:
        ar = r["result"]["allreduce"]
        assert ar["steps"] == STEPS and ar["analytic_bytes_per_step"] == analytic
        assert ar["bytes_per_step"] == analytic and ar["bytes"] == STEPS * analytic
        assert ar["calls"] >= STEPS and ar["seconds"] > 0


def test_a_nan_on_rank_1_fails_the_arm_on_both_ranks_at_that_step(tmp_path, monkeypatch):
    monkeypatch.setenv("SEAMKIT_DIST_FAULT", "1:1:nan")
    ranks = [r["result"] for r in run_dp(tiny(), tmp_path)]
    for r in ranks:
        assert r["status"] == "failed" and r["failed_step"] == 1 and r["steps"] == 1
        assert r["final_loss"] is None and math.isfinite(r["loss"])  # the last completed step's
    assert [r["failed_here"] for r in ranks] == [False, True]


def test_a_batch_the_ranks_cannot_split_is_one_line():
    cfg = tiny(**{"data.batch": 5, "seams.pipeline_schedule": "gpipe"})
    with pytest.raises(ConfigError) as e:
        DPRun(cfg, make_plan(cfg, N), None, 0, torch.device("cpu"), lambda e: None)
    msg = str(e.value)
    assert "\n" not in msg and "data.batch=5" in msg and f"{N} data-parallel ranks" in msg
