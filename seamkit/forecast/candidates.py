"""Which placements each arm has at N devices, and why one cannot be forecast.

Every candidate is one of `seams.placement.options` (the one definition of placements and their
feasibility, which the study and its calibration read too), its fields read off the `Layout`:
the rows of one compute action, the segments (a pipe's virtual stages) and the rank holding each,
the micro-batches, the torch threads of each process. On top of the placement's own reasons, the
forecast adds its own: a local objective it does not time (it times the aux_head objective only)
and, on a CPU, more ranks x threads than the cores it may give them (the replay gives every rank
a device of its own). `predict.forecast` adds two more that depend on the cost table: no costs
measured with a candidate's threads, and sharing factors measured with fewer ranks on fewer cores.

A candidate names its segments by `seg_key` ("first:2": the first segment, two blocks), so that
the cost table measures each shape once: every block of the GPT has the same shape, and a
segment's cost depends only on its role (the embedding on the first, the final norm, LM head and
loss on the last; "whole" has both) and its number of blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from seamkit.config import Placement, RunConfig
from seamkit.seams.placement import default_micro_batches, options, threads_for


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
    owner: list[int] = field(default_factory=list)  # rank of each (virtual) stage (dp: [0], every rank's)
    schedule: str | None = None  # pipe: a key of placement.SCHEDULE_CLASSES
    micro_batches: int = 1
    reason: str | None = None  # why it is not forecast; None when it is
    threads: int | None = None  # CPU: torch threads of each of its processes; None on an accelerator
    blocks: list[list[int]] = field(default_factory=list)  # the GPT's blocks of each (virtual) stage

    def held_by(self, rank: int) -> list[int]:
        """The (virtual) stages this rank holds: dp every rank the one segment."""
        return [0] if self.name == "dp" else [v for v, r in enumerate(self.owner) if r == rank]


def share_key(c: Candidate) -> str:
    """The candidate's key in runtime.candidate_factors[str(c.devices)]."""
    return f"{c.arm}:{c.name}"


def needs_share(c: Candidate) -> bool:
    """Whether c runs several ranks computing at once on the host (not `single`)."""
    return c.devices > 1 and c.name != "single"


def table_threads(cfg: RunConfig) -> int:
    """Torch threads a cost table's own entries are measured with: those of one rank of a
    multi-rank placement, which `placement.threads_for` gives train.threads or one core."""
    return threads_for(cfg, 1, 1)


def _candidate(cfg: RunConfig, n: int, arm: str, p, lay, why: str | None, cpu: bool) -> Candidate:
    """One of `placement.options`: its layout's fields, or its name and why it cannot run."""
    if lay is None:
        if p.kind == "pipe":  # named as it would run: at the schedule's default micro-batches
            p = Placement("pipe", p.schedule, default_micro_batches(p.schedule, n, cfg.data.batch))
        ranks = p.ranks(n)
        return Candidate(arm, p.name, ranks, cfg.data.batch, schedule=p.schedule, micro_batches=p.micro_batches or 1,
                         reason=why, threads=threads_for(cfg, ranks, n) if cpu else None)
    return Candidate(arm, lay.placement.name, lay.ranks, lay.rows, seg_keys(lay.segs), list(lay.owner),
                     lay.placement.schedule, lay.micro_batches, None, lay.threads if cpu else None,
                     [list(s) for s in lay.segs])


def candidates(cfg: RunConfig, n: int, cores: int | None = None, cpu: bool = True) -> list[Candidate]:
    """Every placement of the config's arms at n devices (`placement.options`; at one device,
    `single` alone), with the forecast's own reasons on top (module docstring). cpu: the costs
    are a CPU's, so each candidate carries its processes' threads (None on an accelerator).
    cores (CPU only): a candidate needing more (ranks x threads) is not forecast."""
    out = []
    for arm, p, lay, why in options(cfg, n):
        if n == 1 and p.kind != "single":
            continue  # a placement of ranks: none at one device
        c = _candidate(cfg, n, arm, p, lay, why, cpu)
        if c.reason is None and arm == "local" and len(c.segments) > 1 and cfg.seams.objective != "aux_head":
            c.reason = f"seams.objective={cfg.seams.objective}: the forecast measures the aux_head objective only"
        if c.reason is None and cpu and cores is not None and c.devices * c.threads > cores:
            c.reason = (f"oversubscribed: {c.devices} rank(s) x {c.threads} thread(s) on {cores} cores; the "
                        f"replay gives every rank a device of its own")
        out.append(c)
    return out


def needed(cfg: RunConfig, devices: list[int], threads: int | None = None, cpu: bool = True) -> dict:
    """What a cost table must hold for these device counts: {"segments": {(seg_key, rows)},
    "local": {(seg_key, rows)}} (local: aux head and detached backward too), measured with
    `threads` (CPU: default `table_threads`), and "by_threads": {T: {"segments", "local"}}, what
    the candidates whose processes run T != threads threads (`single` at N > 1) need measured
    with T."""
    threads = (threads or table_threads(cfg)) if cpu else None
    seg, local, by_threads = set(), set(), {}
    for n in devices:
        for c in candidates(cfg, n, cpu=cpu):
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
    return {"segments": keys if c.arm == "e2e" else set(), "local": set() if c.arm == "e2e" else keys}
