"""One arm of the seams study on several processes (data parallel or pipeline stages).

The study hands out turns to its arms (`seams.processes`), one process each. An arm placed on N
ranks is driven from that process, its coordinator: it starts the ranks (`launch.launch_arm`),
relays their events to the study, and relays the turns (`seams.turns.RankTurns`): it hands the
turn back only once every rank has paused, and leaves the go file of the next turn when the study
gives it one. When the ranks end it builds the arm's `ArmResult` from them, joins the ranks'
snapshots into one-process snapshots and their weights into a one-process checkpoint (the format
`prune-check` reads), so the study treats the arm as it treats a one-process arm.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Callable

import torch

from seamkit import checkpoint
from seamkit import config as C
from seamkit.config import RunConfig
from seamkit.data.load import load_corpus
from seamkit.data.rows import epochs
from seamkit.model import GPT
from seamkit.seams.pipeline.assemble import arm_result, arm_wire
from seamkit.seams.pipeline.launch import launch_arm
from seamkit.seams.pipeline.stage import SNAPSHOTS_ENV
from seamkit.seams.placement import Placement, arm_config, plan_for
from seamkit.seams.result import ArmResult
from seamkit.seams.snapshots import merge_ranks
from seamkit.seams.turns import TURNS_ENV, give_turn, halt


class Relay:
    """The coordinator's side of a multi-process arm's turns and events (see the module docstring).

    `go`/`release`: the study's turn for this arm (a multiprocessing Event; `release()` hands it
    back), or None when the arm runs alone. `send(event)`: an event for the study.
    """

    def __init__(self, arm: str, world: int, folder: Path, go, release: Callable[[], None],
                 send: Callable[[dict], None], stop: Callable[[], bool]):
        self.arm, self.world, self.folder, self.go, self.release, self.send, self.stop = \
            arm, world, folder, go, release, send, stop
        self.waiting = 0  # the turn the ranks wait for (None: they hold one)
        self.paused: dict[int, set] = {}  # turn -> the ranks that paused for it
        self.trained: set[int] = set()  # ranks whose training ended
        self.halted = self.ready = False

    def event(self, e: dict) -> None:
        if e["kind"] in ("_paused", "_trained"):
            if e["kind"] == "_paused":
                self.paused.setdefault(e["turn"], set()).add(e["rank"])
            else:  # a rank whose training ended pauses no more: it stays paused for every turn
                self.trained.add(e["rank"])
            for turn, ranks in sorted(self.paused.items()):
                if len(ranks | self.trained) == self.world:  # no rank computes: the turn may go on
                    del self.paused[turn]
                    self.waiting = turn
                    self.release()
            return
        if e["kind"] == "start" and not self.ready:
            self.ready = True
            self.send({"kind": "_ready", "arm": self.arm})
        self.send(e)

    def tick(self, procs) -> None:
        if self.stop() and not self.halted:  # the study stops: nobody waits, rank 0 ends the arm
            self.halted = True
            halt(self.folder)
            if procs and procs[0].poll() is None:
                os.kill(procs[0].pid, signal.SIGINT)
        if self.waiting is not None and (self.go is None or self.go.is_set()):
            give_turn(self.folder, self.waiting)
            self.waiting = None


def run_placed(arm: str, cfg: RunConfig, placement: Placement, devices: int, send: Callable[[dict], None],
               go=None, release: Callable[[], None] = lambda: None, stop: Callable[[], bool] = lambda: False,
               checkpoint_path=None, snapshot_dir=None, timeout_s: float = 120.0) -> ArmResult:
    """Train `arm` on `placement` over `devices` ranks; returns its ArmResult (with `slices` and,
    where `snapshot_dir` is given, `snapshots` in the one-process format). Raises DistError when
    a rank dies. `go`/`release`: the study's turns (None: the arm runs alone)."""
    pcfg = arm_config(cfg, placement, devices)
    plan = plan_for(cfg, placement, devices)
    rundir = Path(tempfile.mkdtemp(prefix="seamkit-dist-"))
    try:
        (rundir / "config.json").write_text(C.dumps(pcfg))
        turns = rundir / f"turns-{arm}"
        turns.mkdir()
        shares = rundir / f"snapshots-{arm}"
        env = {TURNS_ENV: str(turns)} if go is not None else {}
        if snapshot_dir is not None:
            env[SNAPSHOTS_ENV] = str(shares)
        relay = Relay(arm, plan.stages, turns, go, release, send, stop)
        got = launch_arm(arm, plan, rundir, relay.event, pcfg.train.threads, timeout_s, str(rundir / "state"),
                          kind=placement.kind, env=env, tick=relay.tick)
        ranks = got["parts"][arm]
        result = arm_result(arm, pcfg, plan, ranks, placement.kind)
        result.placement, result.wire = placement.name, arm_wire(arm, placement.kind, pcfg, plan, ranks)
        result.epochs = epochs(result.tokens, load_corpus(cfg.data))
        result.slices = ranks[0].get("slices") or []
        if snapshot_dir is not None:
            result.snapshots = merge_ranks(snapshot_dir, arm, [r.get("snapshots") or [] for r in ranks])
        if checkpoint_path is not None:
            ref = _checkpoint(arm, cfg, placement, rundir / "state", len(ranks), result, checkpoint_path)
            result.checkpoint, result.checkpoint_path = ref, str(checkpoint_path)
        send({"kind": "end", "arm": arm, "status": result.status, "result": result})
        return result
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


def _checkpoint(arm: str, cfg: RunConfig, placement: Placement, state_dir: Path, world: int, result: ArmResult,
                path) -> str:
    """The ranks' weights as one GPT, in the one-process checkpoint format, under the study's
    config (no optimizer state: a multi-process arm that stopped early starts again on resume)."""
    weights = {}
    for rank in range(world):
        weights.update(torch.load(state_dir / f"{arm}-rank{rank}.pt", map_location="cpu", weights_only=True)["stage"])
    model = GPT(cfg.model)
    model.load_state_dict(weights)  # strict: every rank's share together is the whole GPT
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    extra = {"arm": arm, "status": result.status, "resume": None, "placement": placement.name,
             "objective": result.objective, "segments": result.segments}
    ckpt_id = checkpoint.save(path, model, None, cfg, step=result.steps, extra=extra)
    return checkpoint.ref(path, ckpt_id)
