"""One arm of the seams study on several processes (data parallel or pipeline stages).

The study hands out turns to its arms (`seams.processes`), one process each. An arm placed on N
ranks is driven from that process, its coordinator: it starts the ranks (`launch.launch_arm`),
relays their events to the study, and relays the turns (`seams.turns.RankTurns`): it hands the
turn back only once every rank has paused, and leaves the go file of the next turn when the study
gives it one. When the ranks end it builds the arm's `ArmResult` from them, joins the ranks'
snapshots into one-process snapshots and their states into a one-process checkpoint (the format
`prune-check` reads, plus every rank's optimizer, data, loop and in-flight state, from which a
resumed arm goes on), so the study treats the arm as it treats a one-process arm.
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
from seamkit.seams.pipeline.stage import RESUME_ENV, SAVES_ENV, SNAPSHOTS_ENV
from seamkit.seams.placement import Placement, arm_config, plan_for
from seamkit.seams.result import ArmResult
from seamkit.seams.resume import ResumeError
from seamkit.seams.snapshots import merge_ranks
from seamkit.seams.turns import TURNS_ENV, give_turn, halt

PAUSED_WAIT_S = 0.1  # how long the coordinator of a paused arm sleeps on the study's turn between looks


class Relay:
    """The coordinator's side of a multi-process arm's turns and events (see the module docstring).

    `go`/`release`: the study's turn for this arm (a multiprocessing Event; `release()` hands it
    back), or None when the arm runs alone. `send(event)`: an event for the study.
    """

    def __init__(self, arm: str, world: int, folder: Path, go, release: Callable[[], None],
                 send: Callable[[dict], None], stop: Callable[[], bool], save: Callable[[], None] = lambda: None):
        self.arm, self.world, self.folder, self.go, self.release, self.send, self.stop, self.save = \
            arm, world, folder, go, release, send, stop, save
        self.waiting = 0  # the turn the ranks wait for (None: they hold one)
        self.paused: dict[int, set] = {}  # turn -> the ranks that paused for it
        self.stopped: dict[int, float] = {}  # turn -> when its last rank stopped computing (time.monotonic())
        self.why: dict[int, tuple[bool, bool]] = {}  # turn -> (hand the turn on, the ranks left their states)
        self.trained: set[int] = set()  # ranks whose training ended
        self.halted = self.ready = False

    def event(self, e: dict) -> None:
        if e["kind"] in ("_paused", "_trained"):
            if e["kind"] == "_paused":
                self.paused.setdefault(e["turn"], set()).add(e["rank"])
                self.why[e["turn"]] = (e.get("hand_on", True), e.get("saved", False))
                if e.get("stopped_at") is not None:
                    self.stopped[e["turn"]] = max(self.stopped.get(e["turn"], e["stopped_at"]), e["stopped_at"])
            else:  # a rank whose training ended pauses no more: it stays paused for every turn
                self.trained.add(e["rank"])
            for turn, ranks in sorted(self.paused.items()):
                if len(ranks | self.trained) == self.world:  # no rank computes: the turn may go on
                    del self.paused[turn]
                    hand_on, saved = self.why.pop(turn)
                    if saved:  # every rank's state is there: the checkpoint, before any rank goes on
                        self.save()
                    if hand_on:
                        self.waiting = turn
                        self.release()
                    else:  # a pause for the checkpoint only: the same turn goes on
                        give_turn(self.folder, turn, self.stopped.pop(turn, None))
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
        if self.waiting is not None and self.go is not None and not self.go.is_set() and not self.halted:
            # every rank is paused: nothing to read from them, so sleep until the study gives the turn
            # rather than poll beside the arm that holds it
            self.go.wait(PAUSED_WAIT_S)
        if self.waiting is not None and (self.go is None or self.go.is_set()):
            give_turn(self.folder, self.waiting, self.stopped.pop(self.waiting, None))
            self.waiting = None


def run_placed(arm: str, cfg: RunConfig, placement: Placement, devices: int, send: Callable[[dict], None],
               go=None, release: Callable[[], None] = lambda: None, stop: Callable[[], bool] = lambda: False,
               checkpoint_path=None, snapshot_dir=None, timeout_s: float = 120.0,
               resume_from: dict | None = None) -> ArmResult:
    """Train `arm` on `placement` over `devices` ranks; returns its ArmResult (with `slices` and,
    where `snapshot_dir` is given, `snapshots` in the one-process format). Raises DistError when
    a rank dies. `go`/`release`: the study's turns (None: the arm runs alone). `resume_from`: this
    arm's checkpoint (`resume.load_arm`) to go on from, every rank from its own state in it.

    With `checkpoint_path` and turns, the arm also checkpoints every `train.checkpoint_every_s`
    training seconds (a pause in which every rank leaves its state, `stage.RankRun.obey`), so a
    study killed mid-arm goes on from there. The ranks keep their snapshot shares in
    `snapshot_dir`, which outlives the run: an arm stopped early joins them only once it ends."""
    pcfg = arm_config(cfg, placement, devices)
    plan = plan_for(cfg, placement, devices)
    if resume_from is not None:
        _check_resumable(resume_from, placement, plan.stages)
    rundir = Path(tempfile.mkdtemp(prefix="seamkit-dist-"))
    try:
        (rundir / "config.json").write_text(C.dumps(pcfg))
        turns = rundir / f"turns-{arm}"
        turns.mkdir()
        env = {TURNS_ENV: str(turns)} if go is not None else {}
        if snapshot_dir is not None:
            env[SNAPSHOTS_ENV] = str(snapshot_dir)
        if resume_from is not None:
            env[RESUME_ENV] = str(_rank_states(resume_from, arm, rundir / "resume"))
        saves, save = rundir / "saves", None
        if checkpoint_path is not None and go is not None:
            saves.mkdir()
            env[SAVES_ENV] = str(saves)

            def save():
                _checkpoint(arm, cfg, placement, _load_states(saves, arm, plan.stages), "running", checkpoint_path)
        relay = Relay(arm, plan.stages, turns, go, release, send, stop, save or (lambda: None))
        got = launch_arm(arm, plan, rundir, relay.event, pcfg.train.threads, timeout_s, str(rundir / "state"),
                          kind=placement.kind, env=env, tick=relay.tick)
        ranks = got["parts"][arm]
        result = arm_result(arm, pcfg, plan, ranks, placement.kind)
        result.placement, result.wire = placement.name, arm_wire(arm, placement.kind, pcfg, plan, ranks)
        result.epochs = epochs(result.tokens, load_corpus(cfg.data))
        result.slices = ranks[0].get("slices") or []
        if snapshot_dir is not None:  # an arm stopped early keeps its shares for the ranks that go on
            result.snapshots = [] if result.status == "interrupted" else \
                merge_ranks(snapshot_dir, arm, [r.get("snapshots") or [] for r in ranks])
        if checkpoint_path is not None:
            ref = _checkpoint(arm, cfg, placement, _load_states(rundir / "state", arm, len(ranks)), result.status,
                              checkpoint_path)
            result.checkpoint, result.checkpoint_path = ref, str(checkpoint_path)
        send({"kind": "end", "arm": arm, "status": result.status, "result": result})
        return result
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


def _checkpoint(arm: str, cfg: RunConfig, placement: Placement, states: list[dict], status: str, path) -> str:
    """The ranks' states as one checkpoint in the one-process format, under the study's config:
    their weights joined into one GPT (what `prune-check` and the held-out views read), and each
    rank's state without its weights in `extra["ranks"]` (what a resumed arm goes on from)."""
    weights = {}
    for state in states:
        weights.update(state["stage"])
    model = GPT(cfg.model)
    model.load_state_dict(weights)  # strict: every rank's share together is the whole GPT
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    loop = states[0]["loop"]
    extra = {"arm": arm, "status": status, "resume": loop, "placement": placement.name, "world": len(states),
             "ranks": [{k: v for k, v in s.items() if k != "stage"} for s in states],
             "slices": states[0]["slices"]}
    ckpt_id = checkpoint.save(path, model, None, cfg, step=loop["steps"], data_state=states[0]["data"], extra=extra)
    return checkpoint.ref(path, ckpt_id)


def _load_states(folder: Path, arm: str, world: int) -> list[dict]:
    """Every rank's `RankRun.resume_state` as it left it in `folder` (`{arm}-rank{r}.pt`)."""
    return [torch.load(folder / f"{arm}-rank{r}.pt", map_location="cpu", weights_only=True) for r in range(world)]


def _check_resumable(ckpt: dict, placement: Placement, world: int) -> None:
    extra, path = ckpt["extra"], ckpt.get("path", "checkpoint")
    if extra.get("placement") != placement.name or extra.get("world") != world or not extra.get("ranks"):
        raise ResumeError(f"cannot resume from {path}: it holds arm {extra.get('arm')!r} on "
                          f"{extra.get('placement') or 'single'} over {extra.get('world') or 1} rank(s), "
                          f"this study runs it on {placement.name} over {world}")


def _rank_states(ckpt: dict, arm: str, folder: Path) -> Path:
    """Each rank's state from a joined checkpoint, its weights the checkpoint's GPT (each rank
    takes its share), as `{arm}-rank{r}.pt` in `folder` (RESUME_ENV)."""
    folder.mkdir(parents=True)
    for r, state in enumerate(ckpt["extra"]["ranks"]):
        torch.save({**state, "stage": ckpt["model"]}, folder / f"{arm}-rank{r}.pt")
    return folder
