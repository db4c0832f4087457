"""The seams study: e2e against local under one wall-clock budget, repeated over seeds, one report.

What it runs (`seams_study`): both arms get one hardware budget, `seams.devices` N, and each runs
on a placement within it (`seams.placement`: one process, data parallel, pipeline stages; `best`
gives each arm its fastest candidate, `calibration`). For each of `seams.repeats` seeds
(train.seed, +1, ...; both arms share each seed: same init, same batches) both arms train under
`train.budget_seconds`, each in its own process (an arm on N ranks: coordinated from it,
`pipeline.placed`), taking turns in slices (`processes.run_arms`; `seams.order`), so a busy
neighbour slows both alike. Then, off every clock, in this process:

- equal tokens: both arms' held-out loss at `seams.token_marks` common token counts, the last
  the largest step both arms kept a snapshot of at or below what the slower arm reached
  (`snapshots.Snapshots` keeps a doubling grid of steps, so the last mark is within a grid step of it);
- time to target: the training seconds each arm needs to reach the held-out loss every arm
  reaches (the worst final loss), linearly interpolated between the two held-out points either
  side of the crossing, found among the arm's snapshots by bisection (`first_at_or_below`,
  starting between the equal-token marks either side of it, already evaluated); an
  arm already there at its first snapshot is `censored` (its time is at most that), and its
  ratio to e2e is left out;
- costs (`seams.costs`): parameters and FLOPs per token counted on one real step per arm, and MFU
  against a matmul peak measured here.

The report (`build_report`) keeps the reference's keys at the top level, holding the means over
seeds (`arms.<arm>.final_loss` is the mean final held-out loss, `loss_curve` the mean curve);
`repeats[]` keeps every seed's arms; `aggregate` has mean, standard deviation and a 95% interval
(Student t) for each arm's final loss, tokens/s and memory, and for the paired local-e2e loss gap
and the local/e2e speed ratio. Memory is reported as the peak and as the growth over each arm's
own baseline (the RSS its training started from: torch and the corpus are shared, not the arm's).
The default objective, `aux_head`, is a greedy per-segment next-token head (DGL-style: Belilovsky
et al., 2020), not InfoPro. Ctrl-C or SIGTERM, in any phase, ends the study with an
"interrupted" report naming the phase (`seamkit.interrupts`; the running arms stop between
steps); reports are written atomically, whole or not at all.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import torch

from seamkit.config import ConfigError, RunConfig, override, parse_placement
from seamkit.data.load import load_corpus
from seamkit.flops import matmul_peak
from seamkit.interrupts import Interrupts, interrupts
from seamkit.lock import held
from seamkit.loop import ProgressBars, evaluate_model, fanout, held_out
from seamkit.model import GPT, autocast, param_dtype, resolve_device
from seamkit.report import host_speed, write_report
from seamkit.seams import placement as P
from seamkit.seams import resume as R
from seamkit.seams.arm import ArmSpec, checkpoint_path, run_arm
from seamkit.seams.calibration import check_committed, choose_placements
from seamkit.seams.launch import remove_orphans
from seamkit.seams.per_token import arm_costs
from seamkit.seams.processes import run_arms
from seamkit.seams.report import study_report
from seamkit.stats import held_out_time_to_target
from seamkit.threads import resolve_threads
from seamkit.tracking import check as check_trackers
from seamkit.tracking import runs_dir, tracked


def equal_token_marks(snapshots: dict, steps: dict, marks: int) -> list[int]:
    """Common snapshot steps at most the slowest arm's steps: `marks` of them spread up to the largest."""
    common = sorted(set.intersection(*({s["step"] for s in snapshots[a]} for a in snapshots)))
    common = [s for s in common if s <= min(steps.values())]
    if not common:
        return []
    last = common[-1]
    picked = {min(common, key=lambda s: abs(s - last * j / marks)) for j in range(1, marks + 1)}
    return sorted(picked)


def first_at_or_below(steps: list[int], loss_at: Callable[[int], float], target: float,
                      known: dict[int, float] | None = None) -> int:
    """Index of the first of `steps` (ascending) whose held-out loss is at or below `target`,
    len(steps) when none is, found by bisection as loss falls with training: the steps either side
    of the crossing are evaluated, about log2(len) of them in all. `known` (step -> loss, steps
    evaluated already) narrows the search first, as bisection would read them: it starts between
    the first known step at or below the target and the last known one above it before that."""
    known = known or {}
    hi = next((i for i, s in enumerate(steps) if s in known and known[s] <= target), len(steps))
    lo = max((i + 1 for i, s in enumerate(steps[:hi]) if s in known), default=0)
    while lo < hi:
        mid = (lo + hi) // 2
        if loss_at(steps[mid]) <= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def held_out_views(cfg: RunConfig, corpus, results: dict) -> dict:
    """The equal-token table and time to target of one seed, from the arms' snapshots; every arm
    but e2e is compared with e2e (`gap_<arm>_minus_e2e`, `<arm>_over_e2e`). Each snapshot is
    evaluated once, whichever view asks for it first."""
    arms = cfg.seams.arm_names
    if not all(a in results and results[a].status == "complete" and results[a].final_loss is not None
               for a in arms):  # a held-out loss that was not finite: nothing to compare against
        return {"equal_tokens": [], "time_to_target": None}
    device = resolve_device(cfg.train.device)
    batches = held_out(corpus, cfg, device=device)
    per_step = cfg.data.batch * cfg.model.seq
    snaps = {a: {s["step"]: s for s in results[a].snapshots or []} for a in arms}
    model = GPT(cfg.model).to(device=device, dtype=param_dtype(cfg.train.dtype))
    seen = {a: {} for a in arms}  # step -> (elapsed_s, loss, stderr)

    def evaluated(a: str, step: int) -> tuple:
        if step not in seen[a]:
            s = snaps[a][step]
            model.load_state_dict(torch.load(s["path"], map_location=device, weights_only=True))
            seen[a][step] = (s["elapsed_s"], *evaluate_model(model, batches, lambda: autocast(device, cfg.train.dtype)))
        return seen[a][step]

    rows = []
    for step in equal_token_marks({a: list(snaps[a].values()) for a in arms}, {a: results[a].steps for a in arms},
                                  cfg.seams.token_marks):
        row = {"step": step, "tokens": step * per_step}
        for a in arms:
            elapsed, loss, err = evaluated(a, step)
            row[a] = {"loss": loss, "stderr": err, "elapsed_s": elapsed}
        for a in arms[1:]:
            row[f"gap_{a}_minus_e2e"] = row[a]["loss"] - row["e2e"]["loss"]
        rows.append(row)
    # time to target: each arm's snapshots searched for where it crosses the loss every arm reaches
    target = max(results[a].final_loss for a in arms)
    censored = []
    for a in arms:
        steps = sorted(s for s in snaps[a] if s < results[a].steps)
        known = {s: v[1] for s, v in seen[a].items()}  # the equal-token marks bracket the crossing
        if steps and first_at_or_below(steps, lambda s, a=a: evaluated(a, s)[1], target, known) == 0:
            censored.append(a)  # at the target by its first snapshot: the time is at most that
    curve = {a: sorted([(s, v[1]) for s, v in seen[a].items()] + [(results[a].steps, results[a].final_loss)])
             for a in arms}
    points = {a: sorted([v[:2] for v in seen[a].values()] + [(results[a].elapsed_s, results[a].final_loss)])
              for a in arms}
    reach = {a: held_out_time_to_target(p, target) for a, p in points.items()}
    known = {a: reach[a] is not None and a not in censored for a in arms}
    ttt = {"target_loss": target, "seconds": reach, "censored": censored,
           **{f"{a}_over_e2e": reach[a] / reach["e2e"] if known[a] and known["e2e"] and reach["e2e"] else None
              for a in arms[1:]},
           "points": {a: [list(q) for q in p] for a, p in points.items()},
           "curve": {a: [list(q) for q in c] for a, c in curve.items()}}
    return {"equal_tokens": rows, "slower_arm_tokens": min(results[a].steps for a in arms) * per_step,
            "time_to_target": ttt}


def check(cfg: RunConfig, here: float | None = None) -> tuple[int, dict]:
    """What a study checks before anything runs (the CLI, the notebook and every sweep point alike):
    the hardware budget as a count of devices, the placements `seams.placement` names, each able
    to run within it, and the committed calibration `seams.calibration=bench` needs; one line on
    anything that cannot. `here`: this host's speed fingerprint, when already measured."""
    devices = P.resolve_devices(cfg)
    named = P.chosen(cfg, devices)
    check_committed(cfg, devices, named, here)
    return devices, named


def lock_path(out_path) -> Path:
    """The lock a study at `out_path` holds while it runs (`seamkit.lock`): beside its report."""
    out_path = Path(out_path)
    return out_path.parent / f".{out_path.name}.lock"


def seams_study(cfg: RunConfig, out_path, callback: Callable[[dict], None] | None = None, progress: bool = True,
                isolate: bool = True, resume: bool = False) -> dict:
    """Run the study (see the module docstring), write the report atomically, return it.

    `isolate`: each arm on processes of its own, taking turns (`seams.order`); False runs every
    arm here, one after the other, each on one process (tests, debugging). A script that calls
    this needs the usual multiprocessing `if __name__ == "__main__":` guard (notebooks and the CLI
    do not). `resume`: continue the study an earlier call with `out_path` stopped
    (`seams.resume`): finished repeats and ended arms are kept, the other arms go on from their
    checkpoints.

    One study writes `out_path` at a time (`lock_path`, taken before anything is written: another
    gets one line naming the holder). Ctrl-C and SIGTERM are this study's own for its whole run
    (`seamkit.interrupts`): in any phase the study ends within seconds with an interrupted report
    naming the phase and the signal, which `resume` continues.
    """
    out_path = Path(out_path)
    check_trackers(cfg)  # train.log_to without its package: one line before anything starts
    remove_orphans()  # what launchers killed outright left in the temporary directory
    with held(lock_path(out_path), f"study {out_path}"), interrupts() as it, \
            tracked(cfg, runs_dir(out_path), out_path.stem, resume) as tracker:
        return _study(cfg, out_path, fanout(tracker, callback), progress, isolate, resume, it)


def _study(cfg: RunConfig, out_path: Path, callback, progress: bool, isolate: bool, resume: bool,
           it: Interrupts) -> dict:
    kept = R.load_study(out_path, cfg) if resume else []
    arms = cfg.seams.arm_names
    ckpts = [{arm: checkpoint_path(out_path, arm, k) for arm in arms} for k in range(cfg.seams.repeats)]
    if resume:  # every checkpoint fits this config, before any training
        for k, paths in enumerate(ckpts):
            for arm, path in paths.items():
                if path.exists():
                    R.peek(path, override(cfg, {"train.seed": cfg.train.seed + k}), arm)
    devices, named = check(cfg)  # a placement that cannot run says why before anything starts
    host_speed()  # the report's speed fingerprint, read before any training loads the host
    saved = R.saved_placement(out_path) if resume else None
    if cfg.train.threads == 0 and devices == 1 and resume:  # a resumed study keeps the thread count it started with
        started = R.started_threads([R.study_state_path(out_path)] + sorted(
            R.study_state_path(out_path).parent.glob(f"{out_path.stem}_*.pt")))
        cfg = override(cfg, {"train.threads": started}) if started else cfg
    # a resumed study keeps where its arms ran: its seeds stay paired on the same placements
    placed = saved if saved and saved.get("devices") == devices else None
    runs, costs, peak, corpus, begun = kept, {}, None, None, False

    def begin() -> None:
        """The study's first writes: what dead writers left goes, and its state from the start,
        so a study stopped before its arms checkpointed can be resumed."""
        R.clean_study(out_path, [p for paths in ckpts for p in paths.values()])
        if not resume:  # an earlier study's checkpoints here are not this one's to resume from
            for paths in ckpts:
                for path in paths.values():
                    path.unlink(missing_ok=True)
        it.enter("saving", urgent=False)
        R.save_study(out_path, cfg, kept, placed)
    try:
        corpus = load_corpus(cfg.data)  # fills the cache once; data errors surface here, before any write
        if cfg.train.threads == 0 and devices == 1:  # chosen once: every arm (and every repeat) gets the same count
            cfg = override(cfg, {"train.threads": resolve_threads(0)})
        torch.set_num_threads(cfg.train.threads or devices)
        begin()
        begun = True
        if placed is None:
            it.enter("calibration", urgent=False)
            placed = choose_placements(cfg, devices, named, progress, stop=it)
            it.enter("saving", urgent=False)
            R.save_study(out_path, cfg, kept, placed)
        if not isolate and any(p != "single" for p in placed["chosen"].values()):
            raise ConfigError("a study whose arms run on several processes needs isolate=True")
        it.enter("costs")
        costs = arm_costs(cfg, corpus)
        peak = matmul_peak(resolve_device(cfg.train.device))
        runs, interrupted = _repeats(cfg, corpus, out_path, ckpts, kept, callback, progress, isolate, resume, it,
                                     placed, devices)
    except KeyboardInterrupt:
        interrupted = True
    if not begun:  # stopped while starting: still a study that --resume continues
        begin()
    it.enter("saving", urgent=False)
    report = study_report(cfg, runs, interrupted, isolate, costs, peak)
    report["placement"] = placed
    # its size in tokens; each arm's `epochs` says how often it was read
    report["corpus"] = corpus.summary() if corpus is not None else None
    if interrupted:
        report["interrupted"] = {"phase": it.interrupted_in or it.phase, "signal": it.name or "SIGINT"}
    R.check_named(runs, ckpts)
    write_report(out_path, report, "seams")
    return report


def _repeats(cfg: RunConfig, corpus, out_path: Path, ckpts: list[dict], kept: list[dict], callback, progress: bool,
             isolate: bool, resume: bool, it: Interrupts, placed: dict, devices: int) -> tuple[list[dict], bool]:
    """Every repeat in turn (kept ones as they are), the state saved after each; (runs, interrupted)."""
    bars = ProgressBars() if progress else None
    runs, interrupted = [], False
    for k in range(cfg.seams.repeats):
        seed = cfg.train.seed + k
        c = override(cfg, {"train.seed": seed})

        def cb(event, seed=seed, k=k):
            fanout(callback, bars)({**event, "seed": seed, "repeat": k})
        prior = kept[k] if k < len(kept) else {}
        if prior.get("finished"):
            runs.append(prior)
            continue
        if it():  # a signal between repeats (or during the last one's held-out views)
            interrupted = True
            break
        # snapshots live beside the checkpoints until the repeat ends, so a resumed repeat still has them
        snap_dir = checkpoint_path(out_path, "snapshots", k).with_suffix("")
        if not resume:
            shutil.rmtree(snap_dir, ignore_errors=True)
        results = {a: r for a, r in prior.get("results", {}).items() if r.status in R.ENDED}
        specs = {a: ArmSpec(a, c, parse_placement(placed["chosen"][a]), devices, str(ckpts[k][a]),
                            str(snap_dir / a), resume, own_process=isolate)
                 for a in cfg.seams.arm_names if a not in results}
        it.enter("training", urgent=False)
        try:
            new, interrupted = run_arms(specs, cb, it) if isolate else _in_process(specs, cb, it, corpus)
            results.update(new)
        except KeyboardInterrupt:
            interrupted = True
        for a, spec in specs.items():  # an arm stopped at once returns nothing: its checkpoint says where it is
            if a not in results and (r := R.on_disk(spec.checkpoint, c, a)) is not None:
                results[a] = r
        interrupted = interrupted or any(r.status == "interrupted" for r in results.values())
        views = {"equal_tokens": [], "time_to_target": None}
        if not interrupted:
            try:
                it.enter("evaluation")
                views = held_out_views(c, corpus, results)
                for row in views["equal_tokens"]:  # each arm's held-out curve, for the callback's trackers
                    for a in cfg.seams.arm_names:
                        cb({"kind": "held_out", "arm": a, "step": row["step"], "tokens": row["tokens"],
                            "loss": row[a]["loss"], "stderr": row[a]["stderr"]})
            except KeyboardInterrupt:
                interrupted = True
        if not interrupted:
            for r in results.values():
                r.snapshots = None
            shutil.rmtree(snap_dir, ignore_errors=True)
        runs.append({"seed": seed, "results": results, "views": views, "finished": not interrupted})
        it.enter("saving", urgent=False)
        R.save_study(out_path, cfg, runs, placed)
        if interrupted:
            break
    return runs, interrupted


def _in_process(specs: dict, callback, stop, corpus) -> tuple[dict, bool]:
    """Every arm here, one after the other (`isolate=False`)."""
    results = {}
    for arm, spec in specs.items():
        results[arm] = run_arm(spec, emit=callback, stop=stop, corpus=corpus)
        if results[arm].status == "interrupted":
            return results, True
    return results, False
