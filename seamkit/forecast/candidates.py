"""Which placements each arm has at N devices, cut as the pipeline package cuts them, and why
one cannot be forecast.

A candidate names its segments by `seg_key` ("first:2": the first segment, two blocks), so
that the cost table measures each shape once: every block of the GPT has the same shape, and a
segment's cost depends only on its role (the embedding on the first, the final norm, LM head
and loss on the last; "whole" has both) and its number of blocks.

Threads (CPU). Each candidate carries the torch threads each of its processes runs, as
placement.arm_config sets them: train.threads where set, else the cores of N ranks shared out,
so a rank of a multi-rank candidate keeps the cost table's threads and the one process of
`single` at N runs N times that. Its costs must be measured with that many threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from seamkit.config import ConfigError, RunConfig, study_arms
from seamkit.seams.cuts import parse_seams, segments
from seamkit.seams.pipeline.plan import (
    PER_STAGE,
    SCHEDULE_CLASSES,
    check_schedule,
    default_micro_batches,
    local_seams,
    placement,
)

E2E, LOCAL, DELAYED = "e2e", "local", "delayed"


def seg_key(blocks: int, first: bool, last: bool) -> str:
    role = "whole" if first and last else "first" if first else "last" if last else "middle"
    return f"{role}:{blocks}"


def seg_blocks(seg: str, n_blocks: int) -> tuple[list[int], bool, bool]:
    """Blocks, first, last of a segment of this seg_key cut from a GPT of n_blocks blocks: every
    block has the same shape, so any run of that many blocks in its role."""
    role, k = seg.split(":")
    k = int(k)
    first, last = role in ("first", "whole"), role in ("last", "whole")
    start = 0 if first else n_blocks - k if last else 1
    return list(range(start, start + k)), first, last


def seg_keys(segs: list[list[int]]) -> list[str]:
    return [seg_key(len(s), v == 0, v == len(segs) - 1) for v, s in enumerate(segs)]


@dataclass
class Candidate:
    arm: str  # "e2e", "local" or "delayed"
    name: str  # "single", "dp", "pipe:SCHEDULE:M" or "stages"
    devices: int  # ranks it runs on
    rows: int  # rows of one compute action: the batch, batch/N (dp) or batch/M (pipe)
    segments: list[str] = field(default_factory=list)  # seg_key of each (virtual) stage
    owner: list[int] = field(default_factory=list)  # rank of each (virtual) stage: pipe, stages
    schedule: str | None = None  # pipe: a key of plan.SCHEDULE_CLASSES
    micro_batches: int = 1
    reason: str | None = None  # why it is not forecast; None when it is
    threads: int | None = None  # CPU: torch threads of each of its processes; None on an accelerator


def _reason(e: ConfigError) -> str:
    return str(e)


def single_threads(cfg: RunConfig, n: int, threads: int) -> int:
    """Torch threads of the one process of `single` at n devices, `threads` a rank: train.threads
    where set (every process runs that many), else the n ranks' cores, n x threads."""
    return threads if cfg.train.threads else n * threads


def _stages(cfg: RunConfig, arm: str, n: int, segs: list[str], reason: str | None) -> Candidate:
    """The stages candidate of the local or delayed arm: the segments grouped onto n ranks as
    plan.local_seams groups them."""
    c = Candidate(arm, "stages", n, cfg.data.batch, segs, reason=reason)
    try:
        _, held = local_seams(cfg, n)
        c.owner = [r for r, ks in enumerate(held) for _ in ks]
    except ConfigError as e:
        c.reason = c.reason or _reason(e)
    return c


def candidates(cfg: RunConfig, n: int, cores: int | None = None, threads: int | None = None) -> list[Candidate]:
    """Every candidate of the config's arms at n devices (e2e, local, and delayed where seams.arms
    names it: single, and stages grouped as the local arm's). threads (CPU only: None on an accelerator): a
    rank's torch threads, the cost table's; `single` gets `single_threads`. `cores` (CPU only): a
    candidate needing more cores than that (ranks x threads) is not forecast, since the replay
    gives every rank a device of its own."""
    nb, batch = cfg.model.n_blocks, cfg.data.batch
    whole = seg_key(nb, True, True)
    out = [Candidate(E2E, "single", 1, batch, [whole])]
    if n > 1:
        dp = Candidate(E2E, "dp", n, batch // n, [whole])
        if batch % n:
            dp.reason = f"data.batch={batch} does not split over {n} ranks"
        out.append(dp)
        for schedule in SCHEDULE_CLASSES:
            owner = placement(schedule, n)
            m = cfg.seams.micro_batches or default_micro_batches(schedule, n, batch, PER_STAGE)
            c = Candidate(E2E, f"pipe:{schedule}:{m}", n, batch // m, owner=owner, schedule=schedule, micro_batches=m)
            if len(owner) > nb:
                c.reason = f"{len(owner)} virtual stages but the model has {nb} blocks"
            elif batch % m:
                c.reason = f"{m} micro-batches do not divide data.batch={batch}"
            else:
                try:
                    check_schedule(schedule, n, m)
                except ConfigError as e:
                    c.reason = _reason(e)
            if c.reason is None:
                c.segments = seg_keys(segments(parse_seams(str(len(owner) - 1), nb), nb))
            out.append(c)
    # local (and delayed): the config's seams whatever n is; stages groups the segments into n runs
    local_segs, why = seg_keys(segments(parse_seams(cfg.seams.seams, nb), nb)), None
    if len(local_segs) > 1 and cfg.seams.objective != "aux_head":  # costs.py times an AuxHead only
        why = f"seams.objective={cfg.seams.objective}: the forecast measures the aux_head objective only"
    # delayed learns from the gradients coming back, with AuxHeads (make_aux_heads) where local_weight > 0
    arms = [(LOCAL, why)] + ([(DELAYED, None)] if DELAYED in study_arms(cfg.seams.arms) else [])
    for arm, reason in arms:
        out.append(Candidate(arm, "single", 1, batch, local_segs, owner=[0] * len(local_segs), reason=reason))
        if n > 1:
            out.append(_stages(cfg, arm, n, local_segs, reason))
    if threads is not None:
        for c in out:
            c.threads = single_threads(cfg, n, threads) if c.name == "single" else threads
    if cores is not None:
        for c in out:
            if c.reason is None and c.devices * (c.threads or 1) > cores:
                c.reason = (f"oversubscribed: {c.devices} rank(s) x {c.threads or 1} thread(s) on {cores} cores; the "
                            f"replay gives every rank a device of its own")
    return out


def needed(cfg: RunConfig, devices: list[int], threads: int | None = None) -> dict:
    """What a cost table must hold for these device counts: {"segments": {(seg_key, rows)},
    "local": {(seg_key, rows)}} (local: aux head and detached backward too), measured with
    `threads` (CPU; None on an accelerator), and "by_threads": {T: {"segments", "local"}}, what
    the candidates whose processes run T != threads threads (`single` at N > 1) need measured with T."""
    seg, local, by_threads = set(), set(), {}
    for n in devices:
        for c in candidates(cfg, n, threads=threads):
            if c.reason is not None:
                continue
            if c.threads == threads:
                at = {"segments": seg, "local": local}
            else:
                at = by_threads.setdefault(c.threads, {"segments": set(), "local": set()})
            for kind, keys in reads(c).items():
                at[kind] |= keys
    return {"segments": seg, "local": local, "by_threads": by_threads}


def reads(c: Candidate) -> dict:
    """The cost-table entries one candidate's forecast reads, {"segments": {(seg_key, rows)},
    "local": {(seg_key, rows)}}, measured with c.threads (the local and delayed arms' entries
    carry the aux head and detached backward too)."""
    keys = {(k, c.rows) for k in c.segments}
    return {"segments": keys if c.arm == E2E else set(), "local": set() if c.arm == E2E else keys}
