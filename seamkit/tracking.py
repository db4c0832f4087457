"""Each arm's curves to TensorBoard and Weights & Biases (`train.log_to`), live, as it trains.

One run per arm and seed, named `<study>/<arm>-seed<N>` (`<study>`: the report's stem, or the
folder of `seamkit train`), written under `runs/` beside the report: `tensorboard --logdir
<report dir>/runs`; wandb's runs go to `runs/wandb/`, offline unless WANDB_MODE says otherwise
(`wandb sync` uploads them later).

`Tracker` is a callback of the loop's events (`seamkit.loop`). They reach the study's own process
from the one rank of each arm that holds its loss curve, whatever the placement (an arm on its own
processes included, `seams.processes`), so one process writes each run, by training step:
- "point": train/loss (the model's LM loss before the step's update) and train/lr;
- "progress": train/tokens_per_s (steps done so far over training seconds);
- "held_out" (the study's equal-token marks) and "end" (the arm's final evaluation):
  held_out/loss, at the number of steps the evaluated weights had taken;
- "start": the run's config (the whole RunConfig, with the seed of the run).
A new study replaces the runs an earlier one left under its name. A resumed one goes on in them:
TensorBoard hides what the stopped run had logged from the resumed run's first step on (its
`purge_step`), so a point logged after the last checkpoint is not shown twice; wandb continues the
run of the same id (`resume="allow"`), whose history keeps the first value logged at each step.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
from pathlib import Path

from seamkit.config import ConfigError, RunConfig

__all__ = ["Tracker", "check", "runs_dir", "tracked"]

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # tracker -> the package it needs


def check(cfg: RunConfig) -> None:
    """One line for a tracker whose package is missing, before anything trains or is written."""
    for name in cfg.train.trackers:
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ConfigError(f"train.log_to={name} needs the {PACKAGES[name]} package: "
                              f"pip install 'seamkit[{name}]'")


def runs_dir(report_path) -> Path:
    """Where the runs of the study writing `report_path` go: runs/ beside it."""
    return Path(report_path).parent / "runs"


class _TensorBoard:
    def __init__(self, folder: Path, name: str, cfg: dict, purge_step: int | None):
        from torch.utils.tensorboard import SummaryWriter
        fresh = not (folder / name).exists()
        self.w = SummaryWriter(str(folder / name), purge_step=purge_step)
        if fresh:
            self.w.add_text("config", "```json\n" + json.dumps(cfg, indent=2) + "\n```", 0)

    def log(self, values: dict, step: int) -> None:
        for tag, v in values.items():
            self.w.add_scalar(tag, v, step)

    def close(self) -> None:
        self.w.close()


class _Wandb:
    def __init__(self, folder: Path, name: str, cfg: dict, group: str, run_id: str):
        import wandb
        (folder / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(dir=str(folder), project=os.environ.get("WANDB_PROJECT", "seamkit"), group=group,
                              name=name, id=run_id, resume="allow", config=cfg, reinit="create_new",
                              mode=None if os.environ.get("WANDB_MODE") else "offline")
        # held-out points come after the training steps they follow: their own x-axis
        self.run.define_metric("held_out/step")
        self.run.define_metric("held_out/*", step_metric="held_out/step")

    def log(self, values: dict, step: int) -> None:
        if any(k.startswith("held_out/") for k in values):
            self.run.log({**values, "held_out/step": step})
        else:
            self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


@contextlib.contextmanager
def tracked(cfg: RunConfig, folder, study: str, resume: bool = False):
    """A `Tracker` for the run (None when `train.log_to` is none), closed when the run ends."""
    tracker = Tracker(cfg, folder, study, resume) if cfg.train.trackers else None
    try:
        yield tracker
    finally:
        if tracker is not None:
            tracker.close()


class Tracker:
    """A callback writing every (arm, seed)'s events to the trackers `cfg.train.log_to` names, as
    runs `<study>/<arm>-seed<N>` under `folder`; `close()` when the study ends."""

    def __init__(self, cfg: RunConfig, folder, study: str, resume: bool = False):
        check(cfg)
        self.cfg, self.folder, self.study, self.resume = cfg, Path(folder), study, resume
        self.runs: dict[tuple[str, int], list] = {}
        self.wandb_tag = None  # drawn at the first run: nothing is written before an arm trains
        self.held: set[tuple[str, int, int]] = set()  # (arm, seed, step) of held-out points logged here
        self.last: dict[tuple[str, int], int] = {}  # (arm, seed) -> its last curve point's step logged here

    def _wandb_tag(self) -> str:
        """What makes this study's wandb run ids its own: drawn when it starts, kept for its resumes
        (an id names one run on the server: a new study under the same name gets new ones)."""
        path = self.folder / self.study / ".wandb-tag"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_hex(4))
        return path.read_text().strip()

    def _open(self, arm: str, seed: int, purge_step: int | None) -> list:
        """The run of (arm, seed), opened at its first event here; `purge_step`: TensorBoard hides
        what an earlier run logged from there on."""
        key = (arm, seed)
        if not self.runs and not self.resume and (self.folder / self.study).is_dir():
            shutil.rmtree(self.folder / self.study)  # an earlier study's runs under this name are not this one's
        if "wandb" in self.cfg.train.trackers and self.wandb_tag is None:
            self.wandb_tag = self._wandb_tag()
        if key not in self.runs:
            name = f"{self.study}/{arm}-seed{seed}"
            cfg = self.cfg.to_dict()
            cfg["train"]["seed"] = seed
            writers = []
            for t in self.cfg.train.trackers:
                if t == "tensorboard":
                    writers.append(_TensorBoard(self.folder, name, cfg, purge_step))
                else:
                    run_id = "".join(c if c.isalnum() else "-" for c in name) + f"-{self.wandb_tag}"
                    writers.append(_Wandb(self.folder, name, cfg, self.study, run_id))
            self.runs[key] = writers
        return self.runs[key]

    def __call__(self, e: dict) -> None:
        kind, arm, seed = e.get("kind"), e.get("arm"), e.get("seed", self.cfg.train.seed)
        if kind == "point":
            if self.last.get((arm, seed), -1) >= e["step"]:  # a step that spans several marks fills each: once here
                return
            self.last[(arm, seed)] = e["step"]
            values, step = {"train/loss": e["loss"], "train/lr": e["lr"]}, e["step"]
        elif kind == "progress" and e["step"] > 0:  # after `step` steps: the last one's index
            values, step = {"train/tokens_per_s": e["tokens_per_s"]}, e["step"] - 1
        elif kind == "held_out":
            values, step = {"held_out/loss": e["loss"]}, e["step"]
        elif kind == "end" and e["result"].final_loss is not None:
            values, step = {"held_out/loss": e["result"].final_loss}, e["result"].steps
        else:
            if kind == "start" and not self.resume:  # the config from the start; a resumed run has it
                self._open(arm, seed, None)
            return
        if "held_out/loss" in values:  # the last equal-token mark may be the final evaluation's step
            if (arm, seed, step) in self.held:
                return
            self.held.add((arm, seed, step))
        # a resumed arm's first training step here: TensorBoard hides what the stopped run logged from it on
        purge = step if self.resume and kind in ("point", "progress") else None
        for w in self._open(arm, seed, purge):
            w.log(values, step)

    def close(self) -> None:
        for writers in self.runs.values():
            for w in writers:
                w.close()
        self.runs = {}
