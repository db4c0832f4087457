"""The delayed arm on real stages (seamkit.seams.pipeline.delayed): 2 gloo ranks on CPU, tiny preset,
float32, one thread a rank; a seam after every block, so each rank holds two segments and
simulates the seam between them. The ranks are started here once (torch.multiprocessing, a file
rendezvous under tmp_path) and train every case of RUNS in turn; each test reads its cases.
"""

import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seamkit import config as C
from seamkit import optim as OPT
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader
from seamkit.loop import held_out
from seamkit.seams import arm as T
from seamkit.seams.pipeline.delayed import DelayedRun, expected_traffic
from seamkit.seams.pipeline.plan import make_plan
from seamkit.seams.pipeline.stage import SNAPSHOTS_ENV

STEPS, N = 8, 2
FAULT = "SEAMKIT_DIST_FAULT"
# case -> (overrides, the planted fault)
RUNS = {
    "stash": ({"seams.delay": 1, "seams.weight_stashing": True, "seams.local_weight": 0.5}, None),
    "current": ({"seams.delay": 1, "seams.weight_stashing": False, "seams.local_weight": 0.5}, None),
    "d2": ({"seams.delay": 2, "seams.weight_stashing": True, "seams.local_weight": 0.0}, None),
    "d0": ({"seams.delay": 0, "seams.local_weight": 0.0}, None),
    "nan1": ({"seams.delay": 1}, "1:2:nan"),
    "nan0": ({"seams.delay": 1}, "0:3:nan"),
}


def tiny(**kw) -> C.RunConfig:
    # the LR by step, so the one-process twin (lr_at(step)) sees the LR the ranks used whatever their
    # clocks; a clip that binds, so the global norm must be the one process's
    return C.override(C.tiny(), {"seams.seams": "all", "train.max_steps": STEPS, "train.budget_seconds": 600.0,
                                 "train.threads": 1, "train.lr_schedule": "steps", "train.lr": 1e-2,
                                 "train.grad_clip": 0.5, **kw})


def _rank(rank: int, d: str) -> None:
    torch.set_num_threads(1)
    os.environ.pop(SNAPSHOTS_ENV, None)
    init = f"file://{d}/rendezvous"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=N,
                            timeout=datetime.timedelta(seconds=60))
    corpus = load_corpus(tiny().data)
    for name, (ov, planted) in RUNS.items():
        os.environ.pop(FAULT, None)
        if planted:
            os.environ[FAULT] = planted
        cfg = tiny(**ov)
        r = DelayedRun(cfg, make_plan(cfg, N), corpus, rank, torch.device("cpu"), lambda e: None)
        res = r.result(r.train())
        torch.save({"result": res, "state": r.state()}, f"{d}/{name}-rank{rank}.pt")
        dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("delayed")
    load_corpus(tiny().data)  # fill the cache once, not once a rank
    mp.start_processes(_rank, args=(str(d),), nprocs=N, join=True, start_method="spawn")
    return {name: [torch.load(d / f"{name}-rank{k}.pt") for k in range(N)] for name in RUNS}


def _one_process(arm: str, cfg):
    """One process's arm (seams.arm) for STEPS steps on the same batches; its last step's losses
    and its held-out loss."""
    corpus = load_corpus(cfg.data)
    a = T.build_arm(arm, cfg, corpus)
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    for step in range(STEPS):
        x_BT, y_BT = loader.next()
        losses = T.train_step(a, x_BT, y_BT, OPT.lr_at(step, cfg.train), cfg.train.grad_clip)
    return a, losses, T.evaluate(a, held_out(corpus, cfg))


def _weights(ranks) -> dict:
    got = {}
    for r in ranks:
        got.update(r["state"]["stage"])
    return got


@pytest.mark.parametrize("case", ["stash", "current", "d2"])
def test_stages_train_what_one_process_trains(runs, case):
    """2 ranks, 4 segments, delay d: every GPT weight and every aux head equal the one-process
    delayed arm's after STEPS steps, and so do every training loss of the last step and the
    held-out loss."""
    ranks = runs[case]
    cfg = tiny(**RUNS[case][0])
    a, losses, final = _one_process("delayed", cfg)
    assert [r["result"]["status"] for r in ranks] == ["complete"] * N
    assert [r["result"]["segments"] for r in ranks] == [[[0], [1]], [[2], [3]]]
    got, want = _weights(ranks), a.model.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    heads = {k: h for r in ranks for k, h in r["state"]["heads"].items()}
    if cfg.seams.local_weight > 0:
        assert sorted(heads) == [0, 1, 2]
        for k, h in heads.items():
            for name, t in a.heads[k].state_dict().items():
                assert torch.equal(h[name], t), (k, name)
    else:
        assert heads == {}
    last = ranks[-1]["result"]["points"][-1]
    assert last["step"] == STEPS - 1 and last["segment_losses"] == losses
    assert all(r["result"]["loss"] == losses[-1] for r in ranks)  # every rank knows the LM loss
    assert ranks[-1]["result"]["final_loss"] == final  # evaluated through both ranks


def test_delay_0_is_the_e2e_arm_bit_for_bit(runs):
    """d=0: every output-gradient is handed back within its step, so the stages train what one
    process's plain backprop trains, float32 bit for bit (the segments' computations are e2e's,
    the wire carries float32 as it is, and the clip's norm is clip_grad_norm_'s over the same
    tensor norms in the same order)."""
    ranks = runs["d0"]
    a, losses, final = _one_process("e2e", tiny(**RUNS["d0"][0]))
    got = _weights(ranks)
    for name, t in a.model.state_dict().items():
        assert torch.equal(got[name], t), name
    assert ranks[-1]["result"]["loss"] == losses[-1] and ranks[-1]["result"]["final_loss"] == final


@pytest.mark.parametrize("case", ["stash", "d2", "d0"])
def test_measured_traffic_is_the_analytic_traffic(runs, case):
    """The one crossing (seam 1) carries an activation forward every step and an output-gradient
    back every step once segment 2 has its first (step d): activation bytes a step, and past the
    fill gradient bytes a step, are B x T x C float32 values; what one rank sends the other takes."""
    ranks = [r["result"] for r in runs[case]]
    cfg = tiny(**RUNS[case][0])
    plan, d = make_plan(cfg, N), cfg.seams.delay
    act = cfg.data.batch * cfg.model.seq * cfg.model.dim * 4
    want = expected_traffic(plan, d, STEPS)
    assert want == {1: {"activation": STEPS, "gradient": STEPS - d}}
    sent = {(c["kind"], c["seam"]): c for c in ranks[0]["traffic"] if c["direction"] == "sent"}
    sent |= {(c["kind"], c["seam"]): c for c in ranks[1]["traffic"] if c["direction"] == "sent"}
    got = {(c["kind"], c["seam"]): c for r in ranks for c in r["traffic"] if c["direction"] == "received"}
    for kind in ("activation", "gradient"):
        n = want[1][kind]
        assert sent[(kind, 1)]["messages"] == got[(kind, 1)]["messages"] == n, kind
        assert sent[(kind, 1)]["bytes"] == got[(kind, 1)]["bytes"] == n * act, kind
    assert {k for k, _ in sent} == {"activation", "gradient", "control", "eval", "allreduce"}
    assert all(s == 1 or k == "allreduce" for k, s in sent)  # nothing else crosses, no inner seam on the wire
    assert ranks[0]["delayed"]["gradients_received"] + ranks[0]["delayed"]["gradients_drained"] == STEPS - d
    assert ranks[0]["delayed"]["gradients_drained"] == d  # in flight when the arm ended


@pytest.mark.parametrize("case,step,where", [("nan1", 2, [False, True]), ("nan0", 3, [True, False])])
def test_a_nan_on_one_rank_fails_the_arm_on_both_at_that_step(runs, case, step, where):
    ranks = [r["result"] for r in runs[case]]
    for r in ranks:
        assert r["status"] == "failed" and r["failed_step"] == step and r["steps"] == step
        assert r["final_loss"] is None and r["loss"] is not None  # the last completed step's
    assert [r["failed_here"] for r in ranks] == where
