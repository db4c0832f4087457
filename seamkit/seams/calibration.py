"""How fast each placement candidate trains on this host: what `seams.placement=best` picks from.

Each candidate (`placement.candidates`) trains `seams.calibrate_steps` steps alone, on processes
of its own (as the study runs it, `processes.run_arms`), outside every arm's budget; its speed is
taken over the steps after the first quarter (warm-up: allocations, the first pipeline fill),
from the loss curve's per-step times. Every candidate runs `seams.calibrate_rounds` times (the
order reversed every other round) and counts at its median: a machine's speed drifts by 10-20%
between minutes, and candidates within that of each other are otherwise ranked by the drift. So
the candidates whose median is within CONTEND_TOL of their arm's fastest (the contenders) run
`seams.calibrate_contend` rounds more, and their median is over all their runs: a close call
gets more runs, a clear one none.

Speeds are host-true. `seams.calibration`: `run` measures now; `auto` (the default) looks for a
committed calibration (`calibrations.json`, package data written by bench/placement.py) of this
host and config, re-times the candidates it chose on this host, and takes it only when each
re-timed speed is within RETIME_TOL of the committed one, else measures now; `bench` insists on
a committed one that holds here. A committed entry names its host by what it was measured on
(CPU model, cores, torch, OpenMP wait policy, GPU) and by a speed fingerprint (`fingerprint`: a
one-thread matmul's FLOP/s): hosts that report the same CPU model differ by 2-3x, and a speed
of another host must never pick a placement. The report's placement block says where the
speeds came from and which were measured in this run (`measured_here`), the only ones a
forecast may be validated against.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from seamkit.config import ConfigError, Placement, RunConfig, override, parse_placement
from seamkit.report import cpu_info, fingerprint
from seamkit.seams.arm import ArmSpec
from seamkit.seams.placement import candidates
from seamkit.seams.processes import run_arms
from seamkit.seams.report import placement_block
from seamkit.threads import openmp_wait, usable_cores

COMMITTED = Path(__file__).resolve().parents[1] / "calibrations.json"  # package data
RETIME_TOL = 0.15  # a committed speed holds here when re-timed within this share of it
FINGERPRINT_TOL = 0.15  # hosts whose fingerprints differ by more are different hosts
CONTEND_TOL = 0.15  # candidates this close to their arm's fastest run seams.calibrate_contend rounds more
# the config fields a candidate's speed depends on (not the seed, budget or learning rate)
NEVER = lambda: False  # noqa: E731 -- a stop() that never asks
SPEED_FIELDS = ("model", "data.batch", "train.dtype", "train.device", "train.compile", "train.threads",
                "seams.seams", "seams.objective", "seams.aux_classes", "seams.order", "seams.delay",
                "seams.weight_stashing", "seams.local_weight", "seams.arms", "seams.local_backward")


def same_speed(here, printed) -> bool:
    """Whether two speed fingerprints are of one host: both positive numbers, `here` within
    FINGERPRINT_TOL of `printed`."""
    nums = all(isinstance(v, (int, float)) and v > 0 for v in (here, printed))
    return nums and abs(here / printed - 1) <= FINGERPRINT_TOL


def machine_key() -> dict:
    """What a committed speed must have been measured on to stand for this host's (its
    fingerprint is compared apart, within FINGERPRINT_TOL)."""
    key = {"cpu": cpu_info()[0], "cores": usable_cores(), "torch": torch.__version__.split("+")[0], "openmp_wait": openmp_wait()}
    if torch.cuda.is_available():
        key["gpu"] = torch.cuda.get_device_name(0)
    return key


def speed_key(cfg: RunConfig, devices: int) -> str:
    """A short digest of what a candidate's speed depends on."""
    d, picked = cfg.to_dict(), {"devices": devices}
    for f in SPEED_FIELDS:
        v = d
        for part in f.split("."):
            v = v[part]
        picked[f] = v
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]


def short_config(cfg: RunConfig) -> RunConfig:
    """A candidate's calibration run: `calibrate_steps` steps, a point at every step, one held-out batch."""
    n = cfg.seams.calibrate_steps
    return override(cfg, {"train.max_steps": n, "train.budget_seconds": 0.0, "train.curve_points": n,
                          "train.eval_tokens": 1, "train.checkpoint_every_s": 0.0, "seams.order": "sequential"})


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


def _median(values: list) -> float | None:
    return statistics.median(values) if values and all(v is not None for v in values) else None


def measure(cfg: RunConfig, devices: int, cands: dict[str, list[Placement]], progress=None,
            rounds: int | None = None, stop=NEVER) -> dict:
    """Every candidate `rounds` times, one after the other, the order reversed every other round so
    a drift of the machine reaches all alike, then the contenders `seams.calibrate_contend` rounds
    more: {arm: {name: median tokens/s}}, every run's speed (`spread`), the contenders of each
    arm that ran again (`contended`) and the seconds taken. `stop()` True (a signal) ends the
    candidate running and raises KeyboardInterrupt."""
    rounds = rounds or cfg.seams.calibrate_rounds
    short, per_step = short_config(cfg), cfg.data.batch * cfg.model.seq
    runs, t0 = {arm: {p.name: [] for p in ps} for arm, ps in cands.items()}, time.perf_counter()

    def run_rounds(order: list, n: int, done: int = 0, of: int = 0) -> None:
        for r in range(n):
            for i, (arm, p) in enumerate(order if r % 2 == 0 else order[::-1]):
                if progress is not None:
                    progress({"kind": "calibration", "arm": arm, "placement": p.name,
                              "index": done + r * len(order) + i, "of": of or n * len(order)})
                results, interrupted = run_arms({arm: ArmSpec(arm, short, p, devices)}, stop=stop)
                if interrupted or stop():
                    raise KeyboardInterrupt
                runs[arm][p.name].append(steady_tokens_per_s(results[arm], per_step) if arm in results else None)
    order = [(arm, p) for arm, ps in cands.items() for p in ps]
    run_rounds(order, rounds)
    close = {arm: _close_call(vs) for arm, vs in runs.items()} if cfg.seams.calibrate_contend else {}
    contenders = [(arm, p) for arm, ps in cands.items() for p in ps if p.name in close.get(arm, ())]
    extra = cfg.seams.calibrate_contend if contenders else 0
    run_rounds(contenders, extra, rounds * len(order), rounds * len(order) + extra * len(contenders))
    spread = {arm: {n: {"values": v, "min": min(v), "max": max(v)} if _median(v) is not None else None
                    for n, v in vs.items()} for arm, vs in runs.items()}
    more = (f"; {extra} more of those within {CONTEND_TOL:.0%} of their arm's fastest: "
            + ", ".join(f"{a} {p.name}" for a, p in contenders) if extra else "")
    return {"tokens_per_s": {arm: {n: _median(v) for n, v in vs.items()} for arm, vs in runs.items()},
            "spread": spread, "seconds": time.perf_counter() - t0, "steps": cfg.seams.calibrate_steps,
            "rounds": rounds, "contended": {a: [p.name for b, p in contenders if b == a] for a in cands},
            "source": f"measured in this run ({rounds} round{'s' if rounds > 1 else ''}{more}; the median)"}


def _close_call(runs: dict[str, list]) -> set[str]:
    """An arm's candidates whose median is within CONTEND_TOL of its fastest median, where more
    than one is (a close call); else none."""
    med = {n: _median(v) for n, v in runs.items()}
    best = max((v for v in med.values() if v is not None), default=None)
    close = {n for n, v in med.items() if best is not None and v is not None and v >= (1 - CONTEND_TOL) * best}
    return close if len(close) > 1 else set()


def committed(cfg: RunConfig, devices: int, path: Path | None = None, here: float | None = None) -> dict | None:
    """The committed calibration (`path`, default COMMITTED) of this host and config (machine key,
    speed key, and a fingerprint within FINGERPRINT_TOL of `here`, this host's), or None."""
    try:
        entries = json.loads(Path(COMMITTED if path is None else path).read_text()).get("entries", [])
    except (OSError, ValueError, AttributeError):
        return None
    want, key = machine_key(), speed_key(cfg, devices)
    for entry in entries:
        printed = entry.get("fingerprint")
        if entry.get("machine") != want or entry.get("speed_key") != key or not printed:
            continue
        here = fingerprint() if here is None else here
        if same_speed(here, printed):
            return entry
    return None


def retime(cfg: RunConfig, devices: int, entry: dict, progress=None, stop=NEVER) -> tuple[dict, float]:
    """The committed entry's chosen candidate of each arm, timed here once: ({arm: {name: tokens/s}},
    the largest relative difference from the committed speeds)."""
    speeds = entry["tokens_per_s"]
    chosen = {a: fastest(speeds[a]) for a in cfg.seams.arm_names}
    now = measure(cfg, devices, {a: [parse_placement(n)] for a, n in chosen.items()}, progress, rounds=1, stop=stop)
    worst = 0.0
    for a, n in chosen.items():
        v = now["tokens_per_s"][a][n]
        worst = max(worst, math.inf if v is None else abs(v / speeds[a][n] - 1))
    return now["tokens_per_s"], worst


def covers(entry: dict | None, cands: dict[str, list[Placement]]) -> bool:
    """Whether a committed entry holds a speed for every candidate."""
    return entry is not None and all({p.name for p in ps} <= set(entry["tokens_per_s"].get(a, {}))
                                     for a, ps in cands.items())


def no_entry() -> ConfigError:
    return ConfigError(f"seams.calibration=bench: {COMMITTED.name} has no entry for this host and config "
                       f"(run bench/placement.py here, or set seams.calibration=run)")


def check_committed(cfg: RunConfig, devices: int, named: dict, here: float | None = None) -> None:
    """seams.calibration=bench: a study that calibrates (more than one device, and an arm that
    seams.placement leaves to its fastest) takes every candidate's speed from a committed entry of
    this host and config; one line, before anything runs, when there is none. Whether its speeds
    still hold is re-timed when the study runs (`calibrate`). `here`: this host's fingerprint."""
    if cfg.seams.calibration != "bench" or devices == 1 or len(named) == len(cfg.seams.arm_names):
        return
    if not covers(committed(cfg, devices, here=here), candidates(cfg, devices)):
        raise no_entry()


def calibrate(cfg: RunConfig, devices: int, cands: dict[str, list[Placement]], progress=None,
              stop=NEVER) -> dict:
    """The candidates' speeds, from where `seams.calibration` says (module docstring)."""
    how = cfg.seams.calibration
    if how in ("auto", "bench"):
        entry = committed(cfg, devices)
        if covers(entry, cands):
            now, worst = retime(cfg, devices, entry, progress, stop)
            what = f"{COMMITTED.name} (commit {entry.get('git_commit', 'unknown')}, host {entry.get('host', '?')})"
            if worst <= RETIME_TOL:
                return {"tokens_per_s": entry["tokens_per_s"], "spread": entry.get("spread"), "seconds": 0.0,
                        "measured_here": now, "steps": entry.get("steps"),
                        "source": f"{what}; its choices re-timed here within {worst:.0%}"}
            if how == "bench":
                raise ConfigError(f"seams.calibration=bench: {what} does not hold on this host (its choices re-timed "
                                  f"{worst:.0%} off); set seams.calibration=run")
            print(f"seamkit: the committed calibration is {worst:.0%} off on this host: calibrating",
                  file=sys.stderr, flush=True)
        elif how == "bench":
            raise no_entry()
    out = measure(cfg, devices, cands, progress, stop=stop)
    return {**out, "measured_here": out["tokens_per_s"]}


def fastest(speeds: dict[str, float | None]) -> str:
    """The fastest candidate's name (one that did not run counts as the slowest)."""
    return max(speeds, key=lambda n: speeds[n] if speeds[n] is not None and math.isfinite(speeds[n]) else -1.0)


def choose_placements(cfg: RunConfig, devices: int, named: dict, progress: bool = False, stop=NEVER) -> dict:
    """The report's placement block (`report.placement_block`): each arm's placement within
    `devices`, the one `seams.placement` names, else the fastest candidate. One device: every arm
    in one process, nothing to calibrate."""
    arms = cfg.seams.arm_names
    if devices == 1:
        return placement_block(1, {a: "single" for a in arms}, {a: {"single": None} for a in arms},
                               "one device: every arm in one process")
    cands = candidates(cfg, devices)
    speeds = {"tokens_per_s": {a: {p.name: None for p in ps} for a, ps in cands.items()}, "seconds": 0.0,
              "source": "named by seams.placement"}
    if len(named) < len(arms):
        speeds = calibrate(cfg, devices, cands, _say_calibrating if progress else None, stop)
    tps = {a: speeds["tokens_per_s"][a] for a in arms}  # a committed entry may hold more arms than this study runs
    chosen = {a: named[a].name if a in named else fastest(tps[a]) for a in arms}
    return placement_block(devices, chosen, tps, speeds["source"], speeds["seconds"], speeds.get("spread"),
                           speeds.get("measured_here") or {})


def _say_calibrating(e: dict) -> None:
    print(f"seamkit: calibrating placements {e['index'] + 1}/{e['of']}: {e['arm']} on {e['placement']}",
          file=sys.stderr, flush=True)
