"""Where each arm of the seams study runs within one hardware budget.

The study's unit is a budget of N devices (`seams.devices`; auto: the free cores on CPU, every
visible GPU on CUDA). Each arm runs on one placement that fits it:

- `single`: one process using the whole budget (N torch threads on CPU; one GPU);
- `dp`: e2e data parallel over N ranks (DDP, gloo or NCCL), the same global batch;
- `pipe:SCHEDULE:M`: e2e on a torch.distributed.pipelining schedule over N stages, M micro-batches;
- `stages`: local over N ranks, each holding a contiguous run of its segments, messages forward only.

Local training pays only where its segments sit on separate devices (one module per device is
where every published speed-up of local or decoupled training comes from); on one device it saves
memory, not time. So the comparison is fair only when both arms get the same hardware and each
its fastest placement there: `seams.placement=best` (the default) measures every candidate on
this machine (`calibration`) and gives each arm its fastest; `e2e=dp,local=stages` names them.
The maths does not depend on the placement (tests hold each placement to one process), so only
speed and memory do.
"""

from __future__ import annotations

import dataclasses

import torch

from seamkit.config import (
    KINDS,
    PIPELINE_SCHEDULES,
    ConfigError,
    Placement,
    RunConfig,
    override,
    parse_choice,
    parse_placement,
    study_arms,
)
from seamkit.seams.pipeline.plan import (
    default_micro_batches,
    make_plan,
    resolve_schedule,
)
from seamkit.threads import resolve_threads

# the placement syntax (Placement, parse_placement, parse_choice, KINDS) lives in seamkit.config,
# which validates it when a config is built; it is part of this module's surface too
__all__ = ["KINDS", "Placement", "arm_config", "candidates", "check", "parse_choice", "parse_placement", "plan_for",
           "resolve_devices"]

def resolve_devices(cfg: RunConfig) -> int:
    """`seams.devices` as a count: itself when > 0; auto (0): every visible GPU on CUDA, else the
    cores other processes leave free ($SEAMKIT_THREADS where set, as `train.threads=0`)."""
    if cfg.seams.devices > 0:
        return cfg.seams.devices
    if cfg.train.device != "cpu" and torch.cuda.is_available():
        return torch.cuda.device_count()
    return resolve_threads(0, quiet=True)


def arm_config(cfg: RunConfig, placement: Placement, devices: int) -> RunConfig:
    """The config an arm runs under on `placement`: threads per process (train.threads where set,
    else an even share of the budget's cores on CPU), and a pipe placement's schedule."""
    threads = cfg.train.threads or max(1, devices // placement.ranks(devices))
    over = {"train.threads": threads}
    if placement.kind == "pipe":
        over.update({"seams.pipeline_schedule": placement.schedule, "seams.micro_batches": placement.micro_batches})
    return override(cfg, over)


def plan_for(cfg: RunConfig, placement: Placement, devices: int):
    """The pipeline plan of a multi-process placement (validated before any process starts)."""
    return make_plan(arm_config(cfg, placement, devices), devices, local=placement.kind == "stages")


def candidates(cfg: RunConfig, devices: int) -> dict[str, list[Placement]]:
    """Every placement each arm can run on within `devices`: one process always; on N > 1 data
    parallel where N divides the batch, each pipeline schedule at its default micro-batches where the
    model has room for it, local stages where there are segments for every stage."""
    out = {a: [Placement("single")] for a in study_arms(cfg.seams.arms)}
    if devices < 2:
        return out
    if cfg.data.batch % devices == 0:
        out["e2e"].append(Placement("dp"))
    for schedule in PIPELINE_SCHEDULES:
        _, per_stage = resolve_schedule(schedule, devices, cfg.model.n_blocks, cfg.data.batch)
        p = Placement("pipe", schedule, default_micro_batches(schedule, devices, cfg.data.batch, per_stage))
        if _fits(cfg, p, devices):
            out["e2e"].append(p)
    for a in out:
        if a != "e2e" and "stages" in KINDS[a] and _fits(cfg, Placement("stages"), devices):
            out[a].append(Placement("stages"))
    return out


def _fits(cfg: RunConfig, p: Placement, devices: int) -> bool:
    try:
        plan_for(cfg, p, devices)
        return True
    except ConfigError:
        return False


def check(cfg: RunConfig, devices: int) -> dict[str, Placement]:
    """The placements `seams.placement` names, each checked against the budget (one line on a bad one)."""
    named = parse_choice(cfg.seams.placement)
    for arm, p in named.items():
        if p.kind == "single":
            continue
        if devices < 2:
            raise ConfigError(f"seams.placement: {arm}={p} needs at least 2 devices; seams.devices is {devices}")
        if p.kind == "dp" and cfg.data.batch % devices:
            raise ConfigError(f"seams.placement: {arm}=dp splits data.batch={cfg.data.batch} over {devices} ranks; "
                              f"it must divide evenly")
        if p.kind == "pipe" and not p.micro_batches:
            _, per_stage = resolve_schedule(p.schedule, devices, cfg.model.n_blocks, cfg.data.batch)
            named[arm] = p = dataclasses.replace(
                p, micro_batches=default_micro_batches(p.schedule, devices, cfg.data.batch, per_stage))
        plan_for(cfg, p, devices)  # a plan that cannot run says why
    return named

