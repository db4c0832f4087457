"""One arm of the seams study on one rank, on any placement: built, trained for its budget,
evaluated, checkpointed, its result assembled on rank 0. One process is a world of one rank.

The reference's method (docs/reference.md): every arm starts from the same weights
(`torch.manual_seed(train.seed)` right before `GPT(...)`), reads the same batches in the same
order (`RowLoader` with the same seed), and trains with AdamW for `train.budget_seconds` of
training clock or `train.max_steps` steps, whichever comes first. The LR schedule
(`optim.scheduled_lr`) follows the share of the budget spent by default, so each arm anneals
exactly when its own budget ends. Evaluation, checkpoints, snapshots, turns and callbacks run off
the clock.

What an arm's step is depends on its placement: the segment chain for `single` and `stages`
(`stages.ChainStep`, every point of the seam policy), a torch schedule for `pipe`
(`schedules.PipeStep`), DDP for `dp` (`ddp.DDPStep`); `ranks.RankLoop` drives any of them.

Checkpoints. Every rank's state (`RankLoop.state`) is gathered on rank 0 and joined into one
checkpoint: the ranks' weights as one GPT (what `prune-check` and the held-out views read; one
process's GPT optimizer at the top level, as a one-process checkpoint has it) and each rank's
state without its weights in `extra["ranks"]`, from which a resumed arm goes on on the same
placement. Held-out loss: the mean LM loss over `loop.held_out` (the val split,
`train.eval_tokens` tokens in whole batches), with its standard error over the batches. Memory
(`memory.Baseline`): each rank's peak and its growth over the RSS (or CUDA allocation) its
training started from; RSS is the arm's own only in a process of its own (`own_process`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from seamkit import checkpoint
from seamkit.accel import deterministic
from seamkit.config import Placement, RunConfig
from seamkit.data.load import load_corpus
from seamkit.data.rows import epochs, repeat_warning
from seamkit.loop import held_out
from seamkit.model import GPT, param_dtype, resolve_device
from seamkit.seams.placement import Layout, layout
from seamkit.seams.policy import policy
from seamkit.seams.ranks import RankLoop
from seamkit.seams.result import ArmResult, from_ranks
from seamkit.seams.resume import ResumeError, load_arm
from seamkit.seams.snapshots import Snapshots, merge_ranks
from seamkit.seams.stages import ChainStep
from seamkit.seams.turns import ArmTurns
from seamkit.seams.wire import summary, wire_dtype



def step_class(kind: str) -> type:
    """The step a placement kind runs. The pipe's and dp's are imported here, not at the top:
    torch.distributed.pipelining and DDP take seconds to import, which every rank of a single or
    stages arm would pay for nothing."""
    if kind == "pipe":
        from seamkit.seams.schedules import PipeStep
        return PipeStep
    if kind == "dp":
        from seamkit.seams.ddp import DDPStep
        return DDPStep
    return ChainStep


@dataclasses.dataclass(frozen=True)
class ArmSpec:
    """What one arm's run needs, the same on every rank (plain and picklable)."""
    arm: str
    cfg: RunConfig
    placement: Placement
    devices: int  # the study's hardware budget
    checkpoint: str | None = None  # where the arm's checkpoint goes (and a resumed arm comes from)
    snapshots: str | None = None  # a folder: the weights on the study's doubling grid of steps
    resume: bool = False  # go on from `checkpoint` where it exists
    own_process: bool = True  # nothing else runs in this process: its RSS is the arm's

    @property
    def layout(self) -> Layout:
        return layout(self.cfg, self.arm, self.placement, self.devices)


def checkpoint_path(out_path, arm: str, repeat: int = 0) -> Path:
    """Where the seams study leaves an arm's checkpoint: <dir>/checkpoints/<stem>_<arm>.pt
    (repeat k > 0 of a repeated study: <stem>_<arm>_r<k>.pt)."""
    out_path = Path(out_path)
    suffix = f"_r{repeat}" if repeat else ""
    return out_path.parent / "checkpoints" / f"{out_path.stem}_{arm}{suffix}.pt"


def device_of(cfg: RunConfig, local_rank: int) -> torch.device:
    device = resolve_device(cfg.train.device)
    if device.type == "cuda":  # one GPU per rank
        if cfg.train.deterministic:
            deterministic(device)
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    return device


def run_arm(spec: ArmSpec, rank: int = 0, world: int = 1, emit: Callable[[dict], None] | None = None,
            turns: tuple | None = None, stop: Callable[[], bool] = lambda: False, faults=None,
            local_rank: int | None = None, corpus=None) -> ArmResult | None:
    """Train `spec`'s arm on this rank (world > 1: inside a process group of `world` ranks, one
    per rank of its placement); returns its ArmResult on rank 0, None elsewhere. `emit`: the loop's
    events (seamkit.loop) with "arm" added; `turns`: a TurnTable's shared values (None: alone);
    `stop()`: True ends the arm as interrupted; `faults`: the store a failed local stage writes to."""
    cfg, lay = spec.cfg, spec.layout
    emit = emit or (lambda e: None)
    torch.set_num_threads(lay.threads)
    device = device_of(cfg, rank if local_rank is None else local_rank)
    corpus = corpus if corpus is not None else load_corpus(cfg.data)
    step = step_class(lay.kind)(cfg, lay, rank, world, device, corpus, wire_dtype(cfg), faults)
    batches = held_out(corpus, cfg, device=device)
    if rank not in (0, lay.loss_rank) or (lay.kind == "dp" and rank != 0):
        batches = [None] * len(batches)  # counted, never evaluated here
    resume = _resume_state(spec, rank, world) if spec.resume else None
    per_step = cfg.data.batch * cfg.model.seq

    def send(event: dict) -> None:
        emit({"arm": spec.arm, **event})

    def gather(obj) -> list | None:
        if world == 1:
            return [obj]
        got = [None] * world if rank == 0 else None
        dist.gather_object(obj, got, dst=0)
        return got

    def floats(x: float) -> list[float]:
        if world == 1:
            return [x]
        got = [None] * world
        dist.all_gather_object(got, x)
        return got
    slice_s = cfg.seams.slice_seconds if cfg.seams.order == "interleaved" else float("inf")
    arm_turns = ArmTurns(turns, rank, slice_s, per_step, send, floats)
    snaps = Snapshots(spec.snapshots, 8 * cfg.seams.token_marks) if spec.snapshots else None
    save = (lambda states, status: _join(spec, lay, states, status)) if spec.checkpoint else None
    loop = RankLoop(cfg, lay, rank, step, corpus, device, send, arm_turns, gather, save, stop, snaps, batches)
    if rank == lay.loss_rank:
        send({"kind": "start", "budget_seconds": cfg.train.budget_seconds, "max_steps": cfg.train.max_steps,
              "tokens_per_step": per_step, "segments": lay.segs if lay.kind in ("single", "stages") else
              [list(range(cfg.model.n_blocks))], "objective": step.chain.policy.objective
              if hasattr(step, "chain") else None})
    if world > 1:
        dist.barrier()  # every rank built before the arm says it is ready
    if rank == 0:
        send({"kind": "_ready"})
    run = loop.train(resume)
    ref = loop.checkpoint(run["status"], loop.final)
    results = gather(loop.result(run))
    if rank != 0:
        return None
    try:
        return _result(spec, lay, corpus, results, ref, send)
    finally:
        arm_turns.hand_back()


def _result(spec: ArmSpec, lay: Layout, corpus, ranks: list[dict], ref: str | None, send) -> ArmResult:
    """Rank 0: the arm's result from its ranks', with its wire, snapshots and checkpoint."""
    cfg = spec.cfg
    result = from_ranks(cfg, lay, ranks)
    result.wire = summary(cfg, lay, ranks)
    result.epochs = epochs(result.tokens, corpus)
    result.repeat_warning = repeat_warning(spec.arm, result.tokens, corpus)
    if result.repeat_warning:
        print(f"seamkit: warning: {result.repeat_warning}", file=sys.stderr)
    if not spec.own_process:
        result.peak_rss_bytes = result.rss_start_bytes = result.rss_growth_bytes = None
    if spec.snapshots is not None:  # an arm stopped early keeps its ranks' shares for the resumed one
        result.snapshots = [] if result.status == "interrupted" else \
            merge_ranks(spec.snapshots, spec.arm, [r.get("snapshots") or [] for r in ranks])
    result.checkpoint, result.checkpoint_path = ref, spec.checkpoint
    send({"kind": "end", "status": result.status, "result": result})
    return result


def _join(spec: ArmSpec, lay: Layout, states: list[dict], status: str) -> str:
    """The ranks' states as one checkpoint (module docstring); its reference."""
    cfg, weights = spec.cfg, {}
    for state in states:
        weights.update(state["weights"])
    with torch.random.fork_rng(devices=[]):  # the GPT's init draws nothing from the RNG the arm trains on
        model = GPT(cfg.model).to(dtype=param_dtype(cfg.train.dtype))
    model.load_state_dict(weights)  # strict: every rank's share together is the whole GPT
    ranks = [{k: v for k, v in s.items() if k != "weights"} for s in states]
    opt = None
    if lay.ranks == 1:  # one process: the GPT's optimizer at the top level, where prune-check reads it
        opt = _Saved(ranks[0]["optimizers"][0])
        ranks[0] = {**ranks[0], "optimizers": [None, *ranks[0]["optimizers"][1:]]}
    loop = states[0]["loop"]
    extra = {"arm": spec.arm, "status": status, "resume": loop, "placement": lay.placement.name, "world": lay.ranks,
             "ranks": ranks, "slices": states[0]["slices"], "objective": policy(spec.arm, cfg.seams).objective,
             "segments": lay.segs}
    Path(spec.checkpoint).parent.mkdir(parents=True, exist_ok=True)
    ckpt_id = checkpoint.save(spec.checkpoint, model, opt, cfg, step=loop["steps"], data_state=states[0]["data"],
                              extra=extra)
    return checkpoint.ref(spec.checkpoint, ckpt_id)


class _Saved:
    """A saved optimizer state where checkpoint.save asks for an optimizer."""

    def __init__(self, state: dict):
        self.state = state

    def state_dict(self) -> dict:
        return self.state


def _resume_state(spec: ArmSpec, rank: int, world: int) -> dict | None:
    """This rank's state in the arm's checkpoint (its weights the checkpoint's GPT, its share
    taken by the step), or None when there is none to go on from."""
    path = Path(spec.checkpoint) if spec.checkpoint else None
    if path is None or not path.exists():
        return None
    ckpt = load_arm(path, spec.cfg, spec.arm)
    extra = ckpt["extra"]
    if extra.get("placement") != spec.layout.placement.name or extra.get("world") != world or not extra.get("ranks"):
        raise ResumeError(f"cannot resume from {path}: it holds arm {extra.get('arm')!r} on "
                          f"{extra.get('placement') or 'single'} over {extra.get('world') or 1} rank(s), "
                          f"this study runs it on {spec.layout.placement.name} over {world}")
    state = dict(extra["ranks"][rank])
    if world == 1:
        state["optimizers"] = [ckpt["optimizer"], *state["optimizers"][1:]]
    return {**state, "weights": ckpt["model"]}
