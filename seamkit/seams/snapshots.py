"""Weights kept along an arm's run for the study's held-out loss at equal token counts.

`Snapshots` keeps a doubling grid of steps: after every g-th step it saves the weights, and when
more than `keep` would be kept, g doubles and the others are deleted. The grid depends on the
step count alone, so every rank of a multi-process arm keeps the same steps, each its own share
of the weights; `merge_ranks` joins those shares into one GPT state dict per step, the format a
one-process arm keeps, so the study reads both the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch


class Snapshots:
    """`after_step` hook keeping weights after every g-th step in `folder`, at most `keep` of them."""

    def __init__(self, folder, keep: int):
        self.folder, self.keep, self.g = Path(folder), max(2, keep), 1
        self.folder.mkdir(parents=True, exist_ok=True)
        self.kept: list[dict] = []  # {"step", "elapsed_s", "path"}, by step

    def state(self) -> dict:
        """What a checkpoint keeps of this (plain data)."""
        return {"g": self.g, "kept": list(self.kept)}

    def restore(self, state: dict | None) -> None:
        """Go on from a checkpoint's `state()`. A snapshot the stopped run deleted after that
        checkpoint (its grid doubled later) is dropped: the views read only what is there."""
        if state:
            self.g = state["g"]
            self.kept = [s for s in state["kept"] if Path(s["path"]).is_file()]

    def __call__(self, a, steps: int, elapsed_s: float) -> None:
        self.take(a.name, steps, elapsed_s, a.model.state_dict)

    def take(self, name: str, steps: int, elapsed_s: float, weights: Callable[[], dict]) -> None:
        """Save `weights()` as `{name}_{steps}.pt` when `steps` is on the grid."""
        if steps % self.g:
            return
        path = self.folder / f"{name}_{steps}.pt"
        torch.save(weights(), path)
        self.kept.append({"step": steps, "elapsed_s": elapsed_s, "path": str(path)})
        while len(self.kept) > self.keep:
            self.g *= 2
            for s in [s for s in self.kept if s["step"] % self.g]:
                Path(s["path"]).unlink(missing_ok=True)
            self.kept = [s for s in self.kept if s["step"] % self.g == 0]


def merge_ranks(folder, name: str, per_rank: list[list[dict]]) -> list[dict]:
    """One GPT state dict per step from every rank's `Snapshots.kept`: the steps all ranks kept,
    the weights the union of their shares (`{name}_{step}.pt` in `folder`), the time the slowest
    rank reached that step. The ranks' files are removed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    by_step = [{s["step"]: s for s in kept} for kept in per_rank]
    common = sorted(set.intersection(*(set(b) for b in by_step))) if by_step else []
    merged = []
    for step in common:
        state = {}
        for b in by_step:
            state.update(torch.load(b[step]["path"], map_location="cpu", weights_only=True))
        path = folder / f"{name}_{step}.pt"
        torch.save(state, path)
        merged.append({"step": step, "elapsed_s": max(b[step]["elapsed_s"] for b in by_step), "path": str(path)})
    for b in by_step:
        for s in b.values():
            Path(s["path"]).unlink(missing_ok=True)
    return merged
