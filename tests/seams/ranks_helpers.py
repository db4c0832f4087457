"""Runs of arms on 2 ranks for the placement tests (tests/seams/test_stages.py, test_schedules.py,
test_ddp.py, tests/test_torch_internals.py). Process groups are slow to start on a small
machine, so each group of cases runs in turn on one pair of ranks started once
(`launch.run_ranks`), every case through `arm.run_arm` as the study runs an arm, with its planted
fault (`ranks.FAULT_ENV`) set in the ranks for that case alone. What each rank's loop reported
(`RankLoop.result`: traffic, timers, per-rank status) and its share of the weights come back
beside rank 0's ArmResult.

The e2e placements' cases (`E2E_CASES`: every pipe schedule, dp, their faults) are one group
that test_schedules.py, test_ddp.py and tests/test_torch_internals.py read (`e2e_runs`).
"""

from __future__ import annotations

import io
import os

import torch
import torch.distributed as dist

from seamkit import config as C
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader
from seamkit.loop import evaluate_model, held_out
from seamkit.model import GPT, param_dtype
from seamkit.optim import lr_at, make_optimizer, step_at
from seamkit.seams import ranks as RK
from seamkit.seams.arm import ArmSpec, run_arm
from seamkit.seams.launch import run_ranks
from seamkit.seams.placement import layout
from seamkit.seams.stages import ChainStep
from seamkit.seams.words import GO, STOP

WORLD = 2
CPU = torch.device("cpu")
_RUNS: dict = {}  # group name -> (its folder, its cases' outcomes), once per test process
E2E_STEPS = 3
# case -> (placement, overrides, the planted fault)
E2E_CASES = {
    **{f"pipe_{s}": (f"pipe:{s}:{m}", {}, None) for s, m in (("gpipe", 2), ("1f1b", 2), ("interleaved1f1b", 4),
                                                             ("interleavedzb", 4), ("zbv", 4), ("dualpipev", 4))},
    "pipe_nan": ("pipe:gpipe:2", {"train.max_steps": 100}, "0:1:nan:e2e"),  # the first stage: not the loss's rank
    "pipe_nan_zbv": ("pipe:zbv:4", {"train.max_steps": 100}, "1:1:nan@1:e2e"),  # rank 1's second stage: virtual 2
    "pipe_slow": ("pipe:gpipe:2", {}, "0:*:slow:e2e"),  # rank 0 SLOW_S slower every step
    "dp": ("dp", {"train.dtype": "float64"}, None),
    "dp_muon": ("dp", {"train.dtype": "float64", "train.optimizer": "muon"}, None),
    "pipe_muon": ("pipe:gpipe:2", {"train.optimizer": "muon"}, None),
    "dp_nan": ("dp", {"train.dtype": "float64", "train.max_steps": 100}, "1:1:nan:e2e"),
}


def tiny(steps: int, **kw) -> C.RunConfig:
    """tiny bounded by steps, one thread a rank (the same kernels as this process), the LR by step
    (a one-process twin sees the LR the ranks used, whatever their clocks), a seam after every block."""
    return C.override(C.tiny(), {"seams.seams": "all", "train.max_steps": steps, "train.budget_seconds": 600.0,
                                 "train.threads": 1, "train.lr_schedule": "steps", **kw})


def spec(arm: str, cfg: C.RunConfig, placement: str, checkpoint) -> ArmSpec:
    return ArmSpec(arm, cfg, C.parse_placement(placement), WORLD, str(checkpoint), own_process=False)


def _run_case(rank: int, world: int, store, name: str, s: ArmSpec, fault: str | None) -> dict:
    os.environ.pop(RK.FAULT_ENV, None)
    if fault:
        os.environ[RK.FAULT_ENV] = fault
    seen = []
    result = RK.RankLoop.result

    def keep(loop, run):
        out = result(loop, run)
        seen.append((out, _as_bytes(loop.final["weights"])))
        return out
    RK.RankLoop.result = keep
    try:
        arm = run_arm(s, rank, world, faults=dist.PrefixStore(f"faults/{name}", store))
    finally:
        RK.RankLoop.result = result
        os.environ.pop(RK.FAULT_ENV, None)
    return {"rank": seen[0][0], "weights": seen[0][1], "result": arm}


def _as_bytes(weights: dict) -> bytes:
    """Tensors as plain bytes: a tensor put on the launcher's queue travels as a file descriptor
    its rank must still hold when this process reads it, and a rank exits once it has put its
    return value."""
    buf = io.BytesIO()
    torch.save(weights, buf)
    return buf.getvalue()


def weights(outcome: dict) -> dict:
    """A rank's share of the weights from its outcome."""
    return torch.load(io.BytesIO(outcome["weights"]), weights_only=True)


def _wire_probe(rank: int, world: int, cfg: C.RunConfig, steps: int) -> dict:
    """The local arm's ChainStep on 2 stages with bfloat16 on the wire, driven by hand for `steps`
    steps and one held-out pass: what its tally counted."""
    lay = layout(cfg, "local", C.Placement("stages"), world)
    corpus = load_corpus(cfg.data)
    step = ChainStep(cfg, lay, rank, world, CPU, corpus, torch.bfloat16)
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    for _ in range(steps):
        step.control(GO if rank == 0 else None)
        x, y = loader.next()
        step.step(x, y, cfg.train.lr)
    step.control(STOP if rank == 0 else None)
    losses = step.evaluate(held_out(corpus, cfg))
    step.agree_failed(False)
    return {"traffic": step.tally.counts(), "eval_losses": len(losses)}


def cases_rank(rank: int, world: int, events, store, cases: list) -> dict:
    """One rank of a group: every case in turn (`run_ranks`'s fn). A case is (name, ArmSpec,
    planted fault or None), or (name, "wire_probe", cfg, steps)."""
    torch.set_num_threads(1)
    out = {}
    for name, what, *rest in cases:
        if what == "wire_probe":
            out[name] = _wire_probe(rank, world, *rest)
        else:
            out[name] = _run_case(rank, world, store, name, what, rest[0])
        dist.barrier()  # nothing of one case is still on the wire when the next starts
    return out


def group(name: str, folder, cases: list) -> tuple:
    """(folder, {case: [rank 0's outcome, rank 1's]}) of the group's cases, run once per test process."""
    if name not in _RUNS:
        load_corpus(C.tiny().data)  # fill the cache once, not once a rank
        ranks = run_ranks(cases_rank, WORLD, cases, label=name)
        _RUNS[name] = folder, {case: [r[case] for r in ranks] for case in ranks[0]}
    return _RUNS[name]


def e2e_cfg(case: str) -> C.RunConfig:
    return tiny(E2E_STEPS, **E2E_CASES[case][1])


def e2e_runs(tmp_path_factory) -> tuple:
    """The e2e placements' group (`E2E_CASES`); each case's checkpoint is <folder>/<case>.pt."""
    if "e2e" in _RUNS:
        return _RUNS["e2e"]
    d = tmp_path_factory.mktemp("e2e")
    cases = [(name, spec("e2e", e2e_cfg(name), placement, d / f"{name}.pt"), fault)
             for name, (placement, _, fault) in E2E_CASES.items()]
    return group("e2e", d, cases)


def micro_batched(cfg: C.RunConfig, corpus, steps: int, micro_batches: int) -> tuple[dict, float, float]:
    """One process's e2e step with each batch cut into micro-batches whose losses / M accumulate,
    then `clip_grad_norm_` and AdamW at the step's LR: what a pipe schedule (and dp, its micro-batch
    a rank's rows) computes. Returns the weights, the last training loss and the held-out loss."""
    dtype = param_dtype(cfg.train.dtype)
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model).to(dtype)
    opt = make_optimizer(model, cfg.train)
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)
    for step in range(steps):
        x_BT, y_BT = loader.next()
        total = torch.zeros((), dtype=dtype)
        for x, y in zip(x_BT.chunk(micro_batches), y_BT.chunk(micro_batches)):
            mb = model.loss(model.hidden(x), y) / micro_batches
            mb.backward()
            total += mb.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        step_at([opt], lr_at(step, cfg.train))
        opt.zero_grad(set_to_none=True)
    return model.state_dict(), total.item(), evaluate_model(model, held_out(corpus, cfg))[0]
