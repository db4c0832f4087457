"""How a pipeline run is cut: stages, schedules, which rank holds which segment, what must cross.

The local arm trains the config's seams (`seams.seams`, as the one-process local arm does), on
any number of stages: its segments are grouped into S contiguous runs, one per rank, balanced by
block count (`group_segments`), so every stage boundary is a seam and a seam inside a rank
never reaches the wire. Only the seams between ranks are crossings. The e2e arm runs a
torch.distributed.pipelining schedule over V virtual stages: V = S for GPipe and 1F1B, V = 2S
for the multi-stage schedules, which hold two segments on every rank, placed round-robin
("loop": rank r holds r and r+S) or in a V ("v": rank r holds r and 2S-1-r, so the two middle
segments sit on the last rank and hand over without a message). A boundary between two
segments on different ranks is a crossing: every micro-batch sends its h_BTC forward across it
and its gradient back. The analytic e2e traffic is therefore crossings x batch x seq x dim x
wire bytes, twice; `wire.measured_bytes` compares the counted messages with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seamkit.config import PIPELINE_SCHEDULES, ConfigError, RunConfig
from seamkit.seams.cuts import parse_seams, segments

WIRE_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
# schedule -> (torch.distributed.pipelining class name, placement of the virtual stages)
SCHEDULE_CLASSES = {
    "gpipe": ("ScheduleGPipe", "single"),
    "1f1b": ("Schedule1F1B", "single"),
    "interleaved1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "interleavedzb": ("ScheduleInterleavedZeroBubble", "loop"),
    "zbv": ("ScheduleZBVZeroBubble", "v"),
    "dualpipev": ("ScheduleDualPipeV", "v"),
}
assert set(SCHEDULE_CLASSES) == set(PIPELINE_SCHEDULES)
# local objectives whose read-out a segment owns, so a segment on any rank can learn from it
OWN_READOUT = ("aux_head", "aux_block", "own_head")


@dataclass
class Plan:
    """How a run is cut into stages; the same on every rank."""
    stages: int  # ranks S
    seams: list[int]  # local: block indices a seam follows (the config's seams)
    segs: list[list[int]]  # local: blocks of each segment (len(seams) + 1 of them)
    local_held: list[list[int]]  # local: the segments each rank holds, contiguous, ascending
    schedule: str  # e2e: a key of SCHEDULE_CLASSES
    micro_batches: int  # e2e: micro-batches M per step
    e2e_segs: list[list[int]]  # e2e: blocks of each virtual stage (V of them)
    owner: list[int]  # e2e: rank holding each virtual stage
    queue: int  # local: sends a stage may have in flight, in steps
    wire_dtype: str  # what crosses a seam

    @property
    def virtual(self) -> int:
        return len(self.e2e_segs)

    def crossings(self) -> list[int]:
        """Virtual boundaries v -> v+1 whose two segments sit on different ranks."""
        return [v for v in range(self.virtual - 1) if self.owner[v] != self.owner[v + 1]]

    def held_by(self, rank: int) -> list[int]:
        return [v for v, r in enumerate(self.owner) if r == rank]

    @property
    def local_owner(self) -> list[int]:
        """local: the rank holding each segment."""
        return [r for r, held in enumerate(self.local_held) for _ in held]

    def local_crossings(self) -> list[int]:
        """local: seams k (between segments k and k+1) whose two segments sit on different ranks."""
        owner = self.local_owner
        return [k for k in range(len(owner) - 1) if owner[k] != owner[k + 1]]


def placement(schedule: str, S: int) -> list[int]:
    style = SCHEDULE_CLASSES[schedule][1]
    if style == "single":
        return list(range(S))
    if style == "loop":
        return [v % S for v in range(2 * S)]
    return list(range(S)) + list(reversed(range(S)))  # "v"


def group_segments(segs: list[list[int]], stages: int) -> list[list[int]]:
    """Segments k of `segs` grouped into `stages` contiguous non-empty runs, one per rank.

    Balanced by block count: the rank with the most blocks holds as few as any grouping allows.
    Ties break toward an even spread of the blocks: of the groupings that reach that least
    maximum, the one whose rank boundaries (the block each rank ends on) lie nearest, summed,
    to those of `parse_seams` spreading S-1 seams evenly, then the one whose boundaries come
    first. With a seam after every block this is the even spread itself."""
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
                cand = (d + abs(ends[b - 1] - target[j - 1]), cuts + [b])
                best[j][b] = min(best[j][b], cand)
    cuts = [0] + best[stages][N][1]
    return [list(range(cuts[j], cuts[j + 1])) for j in range(stages)]


def local_seams(cfg: RunConfig, stages: int) -> tuple[list[int], list[list[int]]]:
    """The local arm's seams (the config's) and the segments each of the S ranks holds.

    Every stage boundary must be a seam, so S ranks need at least S segments: fewer is refused
    in one line, since adding seams a user did not name would train other cuts."""
    n = cfg.model.n_blocks
    if not 1 <= stages <= n:
        raise ConfigError(f"seams.stages={stages}: a model of {n} blocks runs on 1..{n} stages")
    seams = parse_seams(cfg.seams.seams, n)
    N = len(seams) + 1
    if N < stages:
        raise ConfigError(f"seams.seams={cfg.seams.seams!r} cuts the model into {N} segment(s), fewer than the "
                          f"{stages} stages (every stage boundary must be a seam): name at least {stages - 1} "
                          f"seam(s), leave seams.seams=all, or run on at most {N} stage(s)")
    return seams, group_segments(segments(seams, n), stages)


def stage_seams(cfg: RunConfig, stages: int) -> list[int]:
    """The local arm's seams on `stages` stages (the config's; refused as `local_seams` refuses)."""
    return local_seams(cfg, stages)[0]


# seams.pipeline_schedule=auto: the fastest pipeline schedule bench/placement.py measured on CPU
# (bench/results/placement.json, cpu preset, 2 devices, one thread a rank, 3 interleaved rounds):
# stages -> (schedule, micro-batches per stage). Other stage counts take the nearest measured one;
# a model with too few blocks for two segments a rank takes 1f1b. A study with seams.placement=best
# measures every schedule itself (seams.calibration) and needs none of this.
FASTEST_ON_CPU = {2: ("dualpipev", 2)}
PER_STAGE = 2  # micro-batches per stage of a schedule named explicitly


def resolve_schedule(schedule: str, stages: int, n_blocks: int, batch: int) -> tuple[str, int]:
    """The schedule a run uses and its default micro-batches per stage. auto: FASTEST_ON_CPU at the
    nearest measured stage count (ties: the larger), else 1f1b where that one cannot run here."""
    if schedule != "auto":
        return schedule, PER_STAGE
    name, per_stage = FASTEST_ON_CPU[min(FASTEST_ON_CPU, key=lambda s: (abs(s - stages), -s))]
    try:
        if stages < 2 or len(placement(name, stages)) > n_blocks:
            raise ConfigError("no room")
        check_schedule(name, stages, default_micro_batches(name, stages, batch, per_stage))
    except ConfigError:
        return "1f1b", PER_STAGE
    return name, per_stage


def default_micro_batches(schedule: str, stages: int, batch: int, per_stage: int = 2) -> int:
    """seams.micro_batches=0: per_stage x S, or the largest divisor of the batch below that which
    the schedule accepts (else the largest divisor below)."""
    divisors = [d for d in range(1, min(per_stage * stages, batch) + 1) if batch % d == 0]
    for d in reversed(divisors):
        try:
            check_schedule(schedule, stages, d)
            return d
        except ConfigError:
            continue
    return divisors[-1]


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


def make_plan(cfg: RunConfig, stages: int, queue: int = 2, wire_dtype: str | None = None, local: bool = True) -> Plan:
    """Validate a pipeline run before any process starts; errors a user can act on. `local`: the
    local arm runs on these stages too, so its objective must be one stages can train (an e2e
    placement alone, data parallel or a pipe schedule, trains no local objective)."""
    n, batch = cfg.model.n_blocks, cfg.data.batch
    seams, held = local_seams(cfg, stages)
    schedule, per_stage = resolve_schedule(cfg.seams.pipeline_schedule, stages, n, batch)
    owner = placement(schedule, stages)
    if len(owner) > n:
        raise ConfigError(f"schedule {schedule} puts {len(owner) // stages} segments on each of {stages} ranks: "
                          f"{len(owner)} segments, but the model has {n} blocks")
    m = cfg.seams.micro_batches or default_micro_batches(schedule, stages, batch, per_stage)
    if batch % m:
        raise ConfigError(f"seams.micro_batches={m} does not divide data.batch={batch}")
    if stages > 1:
        check_schedule(schedule, stages, m)
    if queue < 1:
        raise ConfigError(f"queue={queue}: a local stage needs room for at least 1 step in flight")
    if local and seams and cfg.seams.objective not in OWN_READOUT:
        raise ConfigError(f"seams.objective={cfg.seams.objective}: pipeline stages train own_head, aux_block "
                          f"or aux_head only (detached_head and shared_head need the last stage's head on every stage each step)")
    wire = wire_dtype or ("float64" if cfg.train.dtype == "float64" else "float32")
    if wire not in WIRE_DTYPES:
        raise ConfigError(f"wire dtype must be one of {sorted(WIRE_DTYPES)}, got {wire!r}")
    e2e_segs = segments(parse_seams(str(len(owner) - 1), n), n)
    return Plan(stages=stages, seams=seams, segs=segments(seams, n), local_held=held, schedule=schedule, micro_batches=m,
                e2e_segs=e2e_segs, owner=owner, queue=queue, wire_dtype=wire)


def describe(cfg: RunConfig, plan: Plan, device: str) -> dict:
    """What a run of `plan` executes on `device` ("cpu" or "cuda"), rank by rank, without running
    it: backend, device, autocast, segments, the P2P traffic each step must carry."""
    gpu = device == "cuda"
    bf16 = gpu and cfg.train.dtype in ("float32", "bfloat16")  # model.autocast's rule
    wire = WIRE_DTYPES[plan.wire_dtype]
    act = cfg.data.batch * cfg.model.seq * cfg.model.dim * torch.empty((), dtype=wire).element_size()
    return {
        "backend": "nccl" if gpu else "gloo",
        "devices_needed": plan.stages if gpu else 0,
        "autocast": "bfloat16" if bf16 else None,
        "wire_dtype": plan.wire_dtype,
        "clocks": "torch.cuda.synchronize before every reading and after every timed wait" if gpu else "perf_counter",
        "ranks": [{"rank": r, "device": f"cuda:{r}" if gpu else "cpu",
                   "e2e_segments": [plan.e2e_segs[v] for v in plan.held_by(r)],
                   "local_segments": [plan.segs[k] for k in plan.local_held[r]]} for r in range(plan.stages)],
        "e2e": {"schedule": plan.schedule, "class": SCHEDULE_CLASSES[plan.schedule][0],
                "micro_batches": plan.micro_batches, "crossings": plan.crossings(),
                "bytes_per_step": 2 * len(plan.crossings()) * act},
        "local": {"seams": plan.seams, "crossings": plan.local_crossings(),
                  "bytes_per_step": len(plan.local_crossings()) * act, "queue": plan.queue},
    }


def arm_objective(arm: str, cfg: RunConfig) -> str | None:
    """What an arm's segments learn from locally: local's objective, the delayed arm's aux heads
    where its local loss is mixed in, none for e2e."""
    if arm == "local":
        return cfg.seams.objective
    if arm == "delayed" and cfg.seams.local_weight > 0:
        return "aux_head"
    return None
