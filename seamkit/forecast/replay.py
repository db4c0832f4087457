"""The discrete-event replay: torch's own action order per rank, timed with measured costs.

Pipe schedules. `torch_order` builds the torch.distributed.pipelining schedule class the e2e
arm runs (placement.SCHEDULE_CLASSES) on stand-in stages, with no process group, and reads the
order every rank executes from it: `pipeline_order` (rank -> [_Action]) of the multi-stage
classes, and the same attribute of GPipe and 1F1B, which torch 2.13 fills from their
`_get_pipeline_order`. Nothing here writes a schedule's order down. Only compute actions are
kept: F, B (input and weight gradient at once), I (input gradient), W (weight gradient);
OVERLAP_F_B (DualPipeV) runs its sub-actions one after another, as the runtime does without a
custom function; None (an idle slot of torch's step grid), REDUCE_GRAD and UNSHARD/RESHARD cost
nothing here. One repair: torch 2.13's Schedule1F1B order numbers the last rank's forwards
1..M instead of 0..M-1 (it counts up before its first forward when there is no warm-up); where
a stage's actions of one type are not exactly the micro-batches 0..M-1, they are renumbered in
the order they appear, which is the order the 1F1B runtime runs them (`relabelled` says when).

`replay` then walks each rank's list in order: an action starts when its rank is free and its
inputs have arrived (F(v, i) needs F(v-1, i); B or I (v, i) needs the input gradient of
(v+1, i); W needs its own I), and a message across ranks arrives a link time after its producer
ends (sends are asynchronous and never hold the rank up; no contention). Two stages on one rank
hand over for free, as the V schedules do. Makespan, busy time per rank and the bubble (the idle
share of all ranks' time) come out.

The runtime's own cost (`with_runtime`): every compute action of every schedule costs its
measured compute plus `action_s` (the runtime's work around it) plus `p2p_op_s` for each
point-to-point op it issues or waits on (`p2p_ops`: a forward receives its input and sends its
output, a B or I receives its output's gradient and sends its input's, each only across ranks;
W none), both as runtime.py measures them; they hold the rank, not the link.

Local stages. `replay_local` runs the local arm's bounded queue the same way, step by step:
each rank receives, runs its segments, sends after its last segment's forward and then waits
until at most `queue` of its sends are still untaken (the Wire's commit), as a `stages` placement's
chain link does (seams.wire.ChainLink, placement.QUEUE).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

from torch.distributed.pipelining import schedules

from seamkit.config import SeamkitError
from seamkit.seams.placement import SCHEDULE_CLASSES, schedule_owner
from seamkit.torch_internals import ComputationType as T

F, B, I, W = T.FORWARD, T.FULL_BACKWARD, T.BACKWARD_INPUT, T.BACKWARD_WEIGHT
COMPUTE = (F, B, I, W)


class ReplayError(SeamkitError):
    """A schedule order the replay cannot run to the end (an action waits on one that never comes)."""


def _stand_in(stage_index: int, num_stages: int, ranks: int, rank: int):
    """What the schedule constructors read of a PipelineStage; no module, no process group."""
    return SimpleNamespace(stage_index=stage_index, num_stages=num_stages, group_size=ranks, group_rank=rank,
                           is_first=stage_index == 0, is_last=stage_index == num_stages - 1, submod=None)


def _compute_actions(actions) -> list:
    out = []
    for a in actions:
        if a is None:
            continue
        if a.computation_type == T.OVERLAP_F_B:
            out.extend(s for s in a.sub_actions or () if s.computation_type in COMPUTE)
        elif a.computation_type in COMPUTE:
            out.append(a)
    return out


FAMILIES = {"forward": (F,), "input gradient": (B, I), "weight gradient": (B, W)}  # each: every micro-batch once


def _relabel(order: dict, micro_batches: int) -> tuple[dict, list]:
    """Renumber a stage's forwards in order of appearance where they are not exactly 0..M-1 (torch
    2.13's 1F1B last rank); any other family that misses or repeats a micro-batch is an error."""
    seen: dict = {}
    for r in order:
        for a in order[r]:
            for fam, kinds in FAMILIES.items():
                if a.computation_type in kinds:
                    seen.setdefault((a.stage_index, fam), []).append(a.microbatch_index)
    bad = {k for k, mbs in seen.items() if sorted(mbs) != list(range(micro_batches))}
    wrong = sorted(f"stage {s} {fam}" for s, fam in bad if fam != "forward")
    if wrong:
        raise ReplayError(f"schedule order does not run every micro-batch 0..{micro_batches - 1} once: {', '.join(wrong)}")
    if not bad:
        return order, []
    count: dict = {}
    fixed = {}
    for r in order:
        fixed[r] = []
        for a in order[r]:
            if (a.stage_index, "forward") in bad and a.computation_type == F:
                i = count.get(a.stage_index, 0)
                count[a.stage_index] = i + 1
                a = a._replace(microbatch_index=i)
            fixed[r].append(a)
    return fixed, sorted(f"{s}F" for s, _ in bad)


@dataclass
class Order:
    actions: dict  # rank -> [_Action] (compute actions, in the order the rank runs them)
    relabelled: list = field(default_factory=list)  # "stage+type" whose micro-batches were renumbered


def torch_order(schedule: str, stages: int, micro_batches: int) -> Order:
    """Every rank's compute actions for `schedule` on `stages` ranks, as torch's class orders them."""
    name, style = SCHEDULE_CLASSES[schedule]
    cls = getattr(schedules, name)
    owner = schedule_owner(schedule, stages)
    V = len(owner)
    if style == "single":
        sched = cls(_stand_in(0, V, stages, 0), n_microbatches=micro_batches)
    else:
        sched = cls([_stand_in(v, V, stages, 0) for v, r in enumerate(owner) if r == 0],
                    n_microbatches=micro_batches)
    raw = sched.pipeline_order
    if not raw:
        raise ReplayError(f"torch's {name} gives no pipeline_order to replay")
    actions = {r: _compute_actions(raw[r]) for r in sorted(raw)}
    actions, relabelled = _relabel(actions, micro_batches)
    return Order(actions, relabelled)


def p2p_ops(a, owner: list[int]) -> int:
    """Point-to-point ops action `a` issues or waits on: one per neighbour stage on another rank."""
    v, kind, V = a.stage_index, a.computation_type, len(owner)
    if kind == W:
        return 0
    before = v > 0 and owner[v - 1] != owner[v]  # F receives from it; B and I send their input gradient to it
    after = v < V - 1 and owner[v + 1] != owner[v]  # F sends to it; B and I receive their output gradient from it
    return int(before) + int(after)


def with_runtime(cost: Callable, owner: list[int], action_s: float, p2p_op_s: float) -> Callable:
    """cost(a) plus the runtime's share of it: action_s, and p2p_op_s for each of its P2P ops."""
    if not action_s and not p2p_op_s:
        return cost  # zero overhead: the very same costs (exact)
    return lambda a: cost(a) + action_s + p2p_op_s * p2p_ops(a, owner)


@dataclass
class Replay:
    makespan_s: float
    busy_s: list  # per rank
    finish_s: list  # per rank: when its last action ends
    spans: dict  # rank -> [(action, start_s, end_s)]

    @property
    def bubble(self) -> float:
        total = len(self.busy_s) * self.makespan_s
        return 1 - sum(self.busy_s) / total if total > 0 else 0.0


def _ready(a, done: dict, owner: list[int], message_s: Callable[[int], float]):
    """(when action a's input is there on its rank, whether it came from another rank), or None:
    not yet. F(v, i) needs F(v-1, i); B or I (v, i) the input gradient of (v+1, i); W its own I."""
    v, i, kind, V = a.stage_index, a.microbatch_index, a.computation_type, len(owner)

    def arrival(key, src: int, boundary: int):
        t = done.get(key)
        if t is None:
            return None
        return (t, False) if owner[src] == owner[v] else (t + message_s(boundary), True)
    if kind == F:
        return (0, False) if v == 0 else arrival(("F", v - 1, i), v - 1, v - 1)
    if ("F", v, i) not in done:
        return None
    if kind == W:
        g = done.get(("G", v, i))
        return None if g is None else (g, False)
    return (done[("F", v, i)], False) if v == V - 1 else arrival(("G", v + 1, i), v + 1, v)


def replay(order: dict, owner: list[int], cost: Callable, message_s: Callable[[int], float],
           wake_s: float = 0) -> Replay:
    """Run rank-ordered compute actions over virtual stages placed by `owner` (stage -> rank).
    cost(action) -> seconds; message_s(v) -> seconds for one message across boundary v (v | v+1)
    between two ranks; wake_s: seconds a rank that sat waiting for another rank's message takes to
    resume once it has arrived (`runtime.wake_s`), not charged where the message was there first."""
    ranks = sorted(order)
    done: dict = {}  # ("F" | "G", stage, micro-batch) -> time it is available on its own rank
    # int zeros: costs given as Fractions stay exact all the way through (the tests' textbook bubbles)
    free, busy, pos = {r: 0 for r in ranks}, {r: 0 for r in ranks}, {r: 0 for r in ranks}
    spans: dict = {r: [] for r in ranks}
    remaining = sum(len(order[r]) for r in ranks)
    while remaining:
        progress = False
        for r in ranks:
            while pos[r] < len(order[r]):
                a = order[r][pos[r]]
                got = _ready(a, done, owner, message_s)
                if got is None:
                    break
                t, remote = got
                start = resume_at(free[r], t, wake_s) if remote else max(free[r], t)
                end = start + cost(a)
                spans[r].append((str(a), start, end))
                busy[r] += end - start
                free[r] = end
                if a.computation_type != W:  # F: its output; B or I: its input gradient
                    done[("F" if a.computation_type == F else "G", a.stage_index, a.microbatch_index)] = end
                pos[r] += 1
                remaining -= 1
                progress = True
        if not progress:
            stuck = {r: str(order[r][pos[r]]) for r in ranks if pos[r] < len(order[r])}
            raise ReplayError(f"schedule order cannot run to the end: every rank waits ({stuck})")
    finish = [free[r] for r in ranks]
    return Replay(max(finish) if finish else 0, [busy[r] for r in ranks], finish, spans)


# ----------------------------------------------------------------------------- the local arm's stages

@dataclass
class LocalReplay:
    step_s: float  # steady state: seconds between two steps of the last rank
    busy_s: list  # per rank, one step
    steps: int

    @property
    def bubble(self) -> float:
        total = len(self.busy_s) * self.step_s
        return 1 - sum(self.busy_s) / total if total > 0 else 0.0


def resume_at(free: float, there: float, wake_s: float) -> float:
    """When a rank free at `free` goes on with what is there at `there`: at once if it was there
    first, else `wake_s` after it came."""
    return there + wake_s if there > free else free


def replay_local(before_send: list[float], after_send: list[float], message_s: list[float], queue: int,
                 steps: int | None = None, wake_s: float = 0.0) -> LocalReplay:
    """Ranks 0..S-1 each step: receive (rank > 0), `before_send[r]` seconds of compute, send to
    r+1 (`message_s[r]` to arrive), wait until at most `queue` sends are untaken, `after_send[r]`
    more. A rank that sat waiting (for its input, or for a send to be taken) resumes `wake_s`
    after what it waited for. The step time is the steady state of the last rank over the second
    half of the steps."""
    S = len(before_send)
    steps = steps or 4 * S + 16
    recv_done = [[0.0] * steps for _ in range(S)]  # when rank r took step n's input
    sent = [[0.0] * steps for _ in range(S)]
    end = [[0.0] * steps for _ in range(S)]
    for n in range(steps):
        for r in range(S):
            free = end[r][n - 1] if n else 0.0
            got = free if r == 0 else resume_at(free, sent[r - 1][n] + message_s[r - 1], wake_s)
            recv_done[r][n] = got
            sent[r][n] = got + before_send[r]
            resume = sent[r][n]
            if r < S - 1 and n >= queue:
                resume = resume_at(resume, recv_done[r + 1][n - queue], wake_s)  # commit(queue): the oldest send taken
            end[r][n] = resume + after_send[r]
    half = steps // 2
    step_s = (end[S - 1][steps - 1] - end[S - 1][half - 1]) / (steps - half)
    return LocalReplay(step_s, [b + a for b, a in zip(before_send, after_send)], steps)
