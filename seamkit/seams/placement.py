"""Where each arm runs within one hardware budget: the one definition of placements, their
feasibility and their layouts, read by the study, its calibration and the forecast alike.

The study's unit is a budget of N devices (`seams.devices`; auto: the free cores on CPU, every
visible GPU on CUDA). Each arm runs on one placement of a kind it supports (`config.KINDS`):
`single` (one process with the whole budget), `dp` (e2e data parallel over N ranks), `pipe`
(e2e on a torch.distributed.pipelining schedule over N ranks) or `stages` (the arm's segment
chain over N ranks). Local training pays only where its segments sit on separate devices; on
one device it saves memory, not time. So the comparison is fair only when every arm gets the
same hardware and each its fastest placement there: `seams.placement=best` measures every
candidate here (`calibration`); `e2e=dp,local=stages` names them. The maths does not depend on
the placement (the tests hold each to one process); only speed and memory do.

A `Layout` says what a placement runs: its ranks, the segments (pipe: virtual stages) and the
rank holding each, the micro-batches, the rows of one compute action and the torch threads of
each process. `layout` builds it or says in one line why it cannot run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from seamkit.config import KINDS, PIPELINE_SCHEDULES, ConfigError, Placement, RunConfig, parse_seams, segments
from seamkit.seams.objectives import PRIVATE
from seamkit.threads import resolve_threads, usable_cores

# schedule -> (torch.distributed.pipelining class name, where its virtual stages sit)
SCHEDULE_CLASSES = {
    "gpipe": ("ScheduleGPipe", "single"),
    "1f1b": ("Schedule1F1B", "single"),
    "interleaved1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "interleavedzb": ("ScheduleInterleavedZeroBubble", "loop"),
    "zbv": ("ScheduleZBVZeroBubble", "v"),
    "dualpipev": ("ScheduleDualPipeV", "v"),
}
assert set(SCHEDULE_CLASSES) == set(PIPELINE_SCHEDULES)
PER_STAGE = 2  # a pipe's default micro-batches per stage
QUEUE = 2  # steps of activation sends a stage may have in flight


@dataclass(frozen=True)
class Layout:
    arm: str
    placement: Placement  # a pipe's micro-batches resolved
    ranks: int
    segs: list  # blocks of each segment (pipe: of each virtual stage)
    owner: list  # the rank holding each segment (dp: every rank holds the one segment; [0])
    micro_batches: int  # pipe: M; 1 otherwise
    rows: int  # rows of one compute action: the batch, batch / N (dp) or batch / M (pipe)
    threads: int  # torch threads of each process

    @property
    def kind(self) -> str:
        return self.placement.kind

    def held_by(self, rank: int) -> list[int]:
        return [0] if self.kind == "dp" else [v for v, r in enumerate(self.owner) if r == rank]

    def crossings(self) -> list[int]:
        """Boundaries v -> v+1 whose two segments sit on different ranks (messages cross there)."""
        return [v for v in range(len(self.segs) - 1) if self.owner[v] != self.owner[v + 1]]

    @property
    def loss_rank(self) -> int:
        """The rank holding the LM head: it reports the loss curve and the held-out loss."""
        return 0 if self.kind == "dp" else self.owner[-1]


def arm_segments(cfg: RunConfig, arm: str) -> list[list[int]]:
    """An arm's segments: e2e backpropagates through one (a gradient crossing a seam at once is
    no cut), local and delayed are cut at the config's seams."""
    return [list(range(cfg.model.n_blocks))] if arm == "e2e" else cfg.seam_segments


def threads_for(cfg: RunConfig, ranks: int, devices: int) -> int:
    """Torch threads of each of a placement's processes: train.threads where set, else an even
    share of the budget's cores on CPU (one GPU per process on CUDA: one thread)."""
    return cfg.train.threads or max(1, devices // ranks)


def layout(cfg: RunConfig, arm: str, placement: Placement, devices: int) -> Layout:
    """What `placement` runs for `arm` on `devices`; ConfigError (one line) when it cannot run."""
    if placement.kind not in KINDS[arm]:
        raise ConfigError(f"seams.placement: the {arm} arm runs on {', '.join(KINDS[arm])}, not {placement.kind}")
    n, batch = cfg.model.n_blocks, cfg.data.batch
    if placement.kind == "single":
        segs = arm_segments(cfg, arm)
        return Layout(arm, placement, 1, segs, [0] * len(segs), 1, batch, threads_for(cfg, 1, devices))
    if devices < 2:
        raise ConfigError(f"seams.placement: {arm}={placement} needs at least 2 devices; seams.devices is {devices}")
    threads = threads_for(cfg, devices, devices)
    if placement.kind == "dp":
        if batch % devices:
            raise ConfigError(f"data.batch={batch} does not split over {devices} data-parallel ranks: "
                              f"set data.batch to a multiple of {devices}")
        return Layout(arm, placement, devices, [list(range(n))], [0], 1, batch // devices, threads)
    if placement.kind == "pipe":
        owner = schedule_owner(placement.schedule, devices)
        if len(owner) > n:
            raise ConfigError(f"schedule {placement.schedule} puts {len(owner) // devices} segments on each of "
                              f"{devices} ranks: {len(owner)} segments, but the model has {n} blocks")
        m = placement.micro_batches or default_micro_batches(placement.schedule, devices, batch)
        if batch % m:
            raise ConfigError(f"{placement.schedule}: {m} micro-batches do not divide data.batch={batch}")
        check_schedule(placement.schedule, devices, m)
        p = dataclasses.replace(placement, micro_batches=m)
        return Layout(arm, p, devices, segments(parse_seams(str(len(owner) - 1), n), n), owner, m, batch // m, threads)
    segs = arm_segments(cfg, arm)
    if len(segs) < devices:
        raise ConfigError(f"seams.seams={cfg.seams.seams!r} cuts the model into {len(segs)} segment(s), fewer than the "
                          f"{devices} stages (every stage boundary must be a seam): name at least {devices - 1} "
                          f"seam(s), leave seams.seams=all, or run on at most {len(segs)} stage(s)")
    if arm == "local" and len(segs) > 1 and cfg.seams.objective not in PRIVATE:
        raise ConfigError(f"seams.objective={cfg.seams.objective}: stages train own_head, aux_block or aux_head only "
                          f"(detached_head and shared_head need the last stage's head on every stage each step)")
    owner = [r for r, held in enumerate(group_segments(segs, devices)) for _ in held]
    return Layout(arm, placement, devices, segs, owner, 1, batch, threads)


def options(cfg: RunConfig, devices: int) -> list[tuple[str, Placement, Layout | None, str | None]]:
    """Every placement of every arm the config runs, at `devices`: (arm, placement, its layout or
    None, why it cannot run or None). Pipe schedules at their default micro-batches."""
    out = []
    for arm in cfg.seams.arm_names:
        for kind in KINDS[arm]:
            names = [Placement("pipe", s) for s in PIPELINE_SCHEDULES] if kind == "pipe" else [Placement(kind)]
            for p in names:
                try:
                    lay = layout(cfg, arm, p, devices)
                    out.append((arm, lay.placement, lay, None))
                except ConfigError as e:
                    out.append((arm, p, None, str(e)))
    return out


def candidates(cfg: RunConfig, devices: int) -> dict[str, list[Placement]]:
    """The placements each arm can run on within `devices` (what `best` chooses from)."""
    out = {a: [] for a in cfg.seams.arm_names}
    for arm, p, lay, why in options(cfg, devices):
        if why is None:
            out[arm].append(p)
    return out


def chosen(cfg: RunConfig, devices: int) -> dict[str, Placement]:
    """The placements `seams.placement` names, each checked against the budget (a pipe's
    micro-batches resolved); one line on one that cannot run."""
    return {arm: layout(cfg, arm, p, devices).placement for arm, p in cfg.seams.placements.items()}


def resolve_devices(cfg: RunConfig) -> int:
    """`seams.devices` as a count: itself when > 0; auto (0): every visible GPU on CUDA, else the
    cores other processes leave free. On a CPU a device is a core: more than this machine's cores
    is refused, since ranks sharing a core measure each other, not the placement."""
    gpu = cfg.train.device != "cpu" and torch.cuda.is_available()
    if cfg.seams.devices == 0:
        return torch.cuda.device_count() if gpu else resolve_threads(0, quiet=True)
    if not gpu and cfg.seams.devices > usable_cores():
        raise ConfigError(f"seams.devices={cfg.seams.devices}: this machine has {usable_cores()} usable core(s), and on "
                          f"a CPU each device is a core; ask for at most {usable_cores()}")
    if gpu and cfg.seams.devices > torch.cuda.device_count():
        raise ConfigError(f"seams.devices={cfg.seams.devices}: this machine has {torch.cuda.device_count()} GPU(s)")
    return cfg.seams.devices


# ----------------------------------------------------------------------------- layouts of ranks

def schedule_owner(schedule: str, S: int) -> list[int]:
    """The rank of each virtual stage of a pipe schedule on S ranks: one each ("single"), two each
    round-robin ("loop": rank r holds r and r+S) or in a V ("v": r and 2S-1-r, so the two middle
    stages sit on the last rank and hand over without a message)."""
    style = SCHEDULE_CLASSES[schedule][1]
    if style == "single":
        return list(range(S))
    if style == "loop":
        return [v % S for v in range(2 * S)]
    return list(range(S)) + list(reversed(range(S)))


def check_schedule(schedule: str, S: int, M: int) -> None:
    """What each pipelining schedule accepts, as one line a user can act on."""
    if schedule == "1f1b" and M < S:
        raise ConfigError(f"schedule 1f1b needs micro_batches >= stages ({S}), got {M}")
    if schedule == "dualpipev" and M < 2 * S:
        raise ConfigError(f"schedule dualpipev needs micro_batches >= 2 x stages ({2 * S}), got {M}")
    if schedule in ("interleaved1f1b", "interleavedzb") and M % max(1, M // S):
        raise ConfigError(f"schedule {schedule} needs micro_batches to be a multiple of "
                          f"micro_batches // stages ({max(1, M // S)}), got {M}")
    if schedule == "zbv" and M < 2 * S - 1:
        raise ConfigError(f"schedule zbv needs micro_batches >= 2 x stages - 1 ({2 * S - 1}), got {M}")


def default_micro_batches(schedule: str, stages: int, batch: int, per_stage: int = PER_STAGE) -> int:
    """per_stage x S micro-batches, or the largest divisor of the batch below that which the
    schedule accepts (else the largest divisor below)."""
    divisors = [d for d in range(1, min(per_stage * stages, batch) + 1) if batch % d == 0]
    for d in reversed(divisors):
        try:
            check_schedule(schedule, stages, d)
            return d
        except ConfigError:
            continue
    return divisors[-1]


def group_segments(segs: list[list[int]], stages: int) -> list[list[int]]:
    """Segments k of `segs` grouped into `stages` contiguous non-empty runs, one per rank.

    Balanced by block count: the rank with the most blocks holds as few as any grouping allows.
    Ties break toward an even spread of the blocks: of the groupings that reach that least
    maximum, the one whose rank boundaries (the block each rank ends on) lie nearest, summed, to
    those of S-1 seams spread evenly, then the one whose boundaries come first. With a seam after
    every block this is the even spread itself."""
    N, n = len(segs), sum(len(s) for s in segs)
    ends = [segs[k][-1] for k in range(N)]  # the block segment k ends on
    target = parse_seams(str(stages - 1), n) + [n - 1]  # the block rank j ends on, spread evenly
    starts = [0]
    for s in segs:
        starts.append(starts[-1] + len(s))

    def load(a, b):  # blocks of segments a..b-1
        return starts[b] - starts[a]

    def runs(L):  # runs of <= L blocks a greedy cut needs
        count, a = 1, 0
        for b in range(1, N + 1):
            if load(a, b) > L:
                count, a = count + 1, b - 1
        return count
    least = next(L for L in range(max(len(s) for s in segs), n + 1) if runs(L) <= stages)
    # best[j][b]: (distance, boundaries) of segments 0..b-1 in j runs of <= least blocks
    inf = (float("inf"), [])
    best = [[inf] * (N + 1) for _ in range(stages + 1)]
    best[0][0] = (0, [])
    for j in range(1, stages + 1):
        for b in range(j, N + 1):
            for a in range(j - 1, b):
                d, cuts = best[j - 1][a]
                if d == float("inf") or load(a, b) > least:
                    continue
                best[j][b] = min(best[j][b], (d + abs(ends[b - 1] - target[j - 1]), cuts + [b]))
    cuts = [0] + best[stages][N][1]
    return [list(range(cuts[j], cuts[j + 1])) for j in range(stages)]
