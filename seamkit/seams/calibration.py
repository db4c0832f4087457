"""How fast each placement candidate trains on this machine: what `seams.placement=best` picks from.

Each candidate (`placement.candidates`) trains `seams.calibrate_steps` steps alone, in processes
of its own (as the study runs it), outside every arm's budget; its speed is taken over the steps
after the first quarter (warm-up: allocations, the first pipeline fill), from the loss curve's
per-step times. Every candidate runs `seams.calibrate_rounds` times (the order reversed every
other round) and counts at its median: this machine's speed drifts by 10-20% between minutes,
and candidates within that of each other are otherwise ranked by the drift. The seconds the whole
calibration took, and every run's speed, are in the report.

`seams.calibration`: `run` measures now; `bench` reads a committed `bench/results/placement.json`
(written by `bench/placement.py`) whose machine and config match this run, and refuses one that
does not; `auto` (the default) reads a matching one where there is one and measures otherwise.

A committed speed stands for this run only when it was measured under the same conditions: the
same CPU, cores, torch and OpenMP wait policy (`machine_key`). The policy matters most: an
interactive notebook kernel waits passively (seamkit/__init__.py), which costs a two-thread
`single` about a third of its speed and a one-thread rank nothing, so a choice made from the
command line's speeds would put an arm on its slower placement there. Entries written before the
policy was recorded were measured from a shell with OpenMP's default waiting.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import statistics
import time
from pathlib import Path

import torch

from seamkit.config import ConfigError, RunConfig, override
from seamkit.seams.pipeline.placed import run_placed
from seamkit.seams.placement import Placement, arm_config
from seamkit.seams.processes import run_arm_isolated
from seamkit.threads import openmp_wait, usable_cores

BENCH = Path(__file__).resolve().parents[2] / "bench" / "results" / "placement.json"
# the config fields a candidate's speed depends on (not the seed, budget or learning rate)
SPEED_FIELDS = ("model", "data.batch", "train.dtype", "train.device", "train.compile", "seams.seams", "seams.objective",
                "seams.aux_classes", "seams.order", "seams.delay", "seams.weight_stashing", "seams.local_weight")


def machine_key() -> dict:
    """What a committed speed must have been measured on to stand for this machine's."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    key = {"cpu": cpu, "cores": usable_cores(), "torch": torch.__version__.split("+")[0], "openmp_wait": openmp_wait()}
    if torch.cuda.is_available():
        key["gpu"] = torch.cuda.get_device_name(0)
    return key


def speed_key(cfg: RunConfig, devices: int) -> str:
    """A short digest of what a candidate's speed depends on."""
    d = cfg.to_dict()
    picked = {}
    for f in SPEED_FIELDS:
        v = d
        for part in f.split("."):
            v = v[part]
        picked[f] = v
    picked["devices"] = devices
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]


def short_config(cfg: RunConfig) -> RunConfig:
    """A candidate's calibration run: `calibrate_steps` steps, a point at every step, one held-out batch."""
    n = cfg.seams.calibrate_steps
    return override(cfg, {"train.max_steps": n, "train.budget_seconds": 0.0, "train.curve_points": n,
                          "train.eval_tokens": 1, "train.checkpoint_every_s": 0.0})


def steady_tokens_per_s(result, tokens_per_step: int) -> float | None:
    """Tokens/s over the steps after the first quarter (from the loss curve's step start times)."""
    steps, times = result.loss_curve_steps, result.loss_curve_elapsed_s
    if result.status != "complete" or result.steps < 4:
        return None
    w = result.steps // 4
    t_w = next((t for s, t in zip(steps, times) if s >= w), None)
    if t_w is None or result.elapsed_s <= t_w:
        return None
    return (result.steps - w) * tokens_per_step / (result.elapsed_s - t_w)


def medians(values: dict) -> dict:
    """{arm: {candidate: the median of its speeds}} (None where any run gave none)."""
    return {arm: {n: statistics.median(v) if v and all(x is not None for x in v) else None for n, v in vs.items()}
            for arm, vs in values.items()}


def spread(values: dict) -> dict:
    """{arm: {candidate: {values, min, max}}} of every run's speed (None where any run gave none)."""
    return {arm: {n: {"values": v, "min": min(v), "max": max(v)} if v and all(x is not None for x in v) else None
                  for n, v in vs.items()} for arm, vs in values.items()}


def measure(cfg: RunConfig, devices: int, candidates: dict[str, list[Placement]], progress=None,
            rounds: int | None = None) -> dict:
    """Every candidate `rounds` times (`seams.calibrate_rounds`), one after the other, the order
    reversed every other round so a drift of the machine reaches all alike; {arm: {placement name:
    the median tokens/s}}, each run's speed (`spread`) and the seconds taken."""
    rounds = rounds or cfg.seams.calibrate_rounds
    short = short_config(cfg)
    per_step = cfg.data.batch * cfg.model.seq
    order = [(arm, p) for arm, ps in candidates.items() for p in ps]
    runs, t0 = {arm: {p.name: [] for p in ps} for arm, ps in candidates.items()}, time.perf_counter()
    for r in range(rounds):
        for i, (arm, p) in enumerate(order if r % 2 == 0 else order[::-1]):
            if progress is not None:
                progress({"kind": "calibration", "arm": arm, "placement": p.name, "index": r * len(order) + i,
                          "of": rounds * len(order)})
            if p.kind == "single":
                result, interrupted = run_arm_isolated(arm, arm_config(short, p, devices))
                if interrupted:
                    raise KeyboardInterrupt
            else:
                result = run_placed(arm, short, p, devices, send=lambda e: None)
            runs[arm][p.name].append(steady_tokens_per_s(result, per_step))
    return {"tokens_per_s": medians(runs), "spread": spread(runs), "seconds": time.perf_counter() - t0,
            "source": f"measured in this run ({rounds} round{'s' if rounds > 1 else ''}, the median)",
            "steps": cfg.seams.calibrate_steps, "rounds": rounds}


def committed(cfg: RunConfig, devices: int, path: Path = BENCH) -> dict | None:
    """The committed calibration of this machine and config, or None."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    want, key = machine_key(), speed_key(cfg, devices)
    for entry in table.get("entries", []):
        if {"openmp_wait": "default", **entry.get("machine", {})} == want and entry.get("speed_key") == key:
            return {"tokens_per_s": entry["tokens_per_s"], "seconds": 0.0, "steps": entry.get("steps"),
                    "source": f"bench/results/placement.json ({entry.get('rounds', 1)} rounds, commit "
                              f"{entry.get('git_commit', 'unknown')})", "spread": entry.get("spread")}
    return None


def calibrate(cfg: RunConfig, devices: int, candidates: dict[str, list[Placement]], progress=None) -> dict:
    """The candidates' speeds, from where `seams.calibration` says (see the module docstring)."""
    how = cfg.seams.calibration
    if how in ("auto", "bench"):
        found = committed(cfg, devices)
        names = {arm: {p.name for p in ps} for arm, ps in candidates.items()}
        if found is not None and all(names[a] <= set(found["tokens_per_s"].get(a, {})) for a in names):
            return found
        if how == "bench":
            raise ConfigError(f"seams.calibration=bench: {BENCH.name} has no entry for this machine and config "
                              f"(run bench/placement.py, or set seams.calibration=run)")
    return measure(cfg, devices, candidates, progress)


def fastest(speeds: dict[str, float | None]) -> str:
    """The fastest candidate's name (one that did not run counts as the slowest)."""
    return max(speeds, key=lambda n: speeds[n] if speeds[n] is not None and math.isfinite(speeds[n]) else -1.0)
