"""What a resume costs on the cpu preset: the time from `--resume` to the first training step,
against a fresh start's time to its first step (target: the difference under 10 s).

    python bench/resume.py --pairs 5 --out bench/results/resume.json

Each sample is a new Python process (imports done, then timed from the call of `train_run` /
`seams_study` to the first training step's progress event, the first event after a step), so
no sample reuses another's caches. Fresh and resumed samples alternate (fresh, resume, fresh,
...), so a busy neighbour lands on both. The resumed samples continue one interrupted run (a
copy of it, made outside the timing): `train` e2e at step 20 of 40; the seams study (both arms
in their processes, sequential order) with e2e at step 20 of 40. Inside the resumed train
samples, the restore itself is timed too: reading and verifying the checkpoint
(`seamkit.seams.resume.load_arm`, wherever it is called) and putting its state into the freshly
built arm (`seamkit.seams.ranks.RankLoop.restore`: the weights, both optimizers, the data
position, the RNG and the budget loop).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from seamkit.report import git_commit, machine

ROOT = Path(__file__).resolve().parents[1]
STEPS, STOP_AT = 40, 20
OVERRIDES = {"train.max_steps": STEPS, "train.budget_seconds": 0.0}

CHILD = r"""
import json, sys, time
from seamkit import config as C
from seamkit.seams import arm as A
from seamkit.seams import resume as R
from seamkit.seams.ranks import RankLoop
from seamkit.seams.study import seams_study
from seamkit.seams.run import train_run
kind, out, resume = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
cfg = C.override(C.preset(sys.argv[5]), json.loads(sys.argv[4]))
t = {}
def timed(f, name):
    def g(*a, **k):
        start = time.perf_counter(); r = f(*a, **k); t[name] = t.get(name, 0) + time.perf_counter() - start; return r
    return g
R.load_arm, A.load_arm = timed(R.load_arm, "load_arm"), timed(A.load_arm, "load_arm")  # both names it is called by
RankLoop.restore = timed(RankLoop.restore, "restore_arm")
def cb(e):
    if e["kind"] == "progress" and e["step"] > 0 and "first_step_s" not in t:
        t["first_step_s"] = time.perf_counter() - t0
        raise KeyboardInterrupt  # enough: stop here (the arm still checkpoints)
t0 = time.perf_counter()
if kind == "train":
    train_run(cfg, out, callback=cb, progress=False, resume=resume)
else:
    seams_study(cfg, out, callback=cb, progress=False, resume=resume)
print(json.dumps(t))
"""


def child(kind: str, out: Path, resume: bool, overrides: dict, preset: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, kind, str(out), "1" if resume else "0", json.dumps(overrides),
                        preset], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def interrupted_run(kind: str, where: Path, preset: str) -> Path:
    """One run stopped at step STOP_AT (a callback acting as Ctrl-C); returns its output path."""
    from seamkit import config as C
    from seamkit.seams.run import train_run
    from seamkit.seams.study import seams_study
    cfg = C.override(C.preset(preset), {**OVERRIDES, "seams.repeats": 1, "seams.order": "sequential"})

    stopped = []

    def cb(e):
        if e["kind"] == "progress" and e["step"] >= STOP_AT and e.get("arm", "e2e") == "e2e" and not stopped:
            stopped.append(e["step"])
            raise KeyboardInterrupt
    out = where / ("run" if kind == "train" else "study.json")
    if kind == "train":
        train_run(cfg, out, callback=cb, progress=False)
    else:
        seams_study(cfg, out, callback=cb, progress=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--kinds", default="train,seams")
    ap.add_argument("--preset", default="cpu", choices=("cpu", "seed", "tiny"))
    ap.add_argument("--out", default="bench/results/resume.json")
    ap.add_argument("--note", default="fresh and resumed samples alternate",
                    help="what the results file says about the machine (quiet, shared...)")
    args = ap.parse_args()
    from tqdm import tqdm
    overrides = {**OVERRIDES, "seams.repeats": 1, "seams.order": "sequential"}
    results = {}
    with tempfile.TemporaryDirectory(prefix="seamkit-bench-resume-") as tmp:
        tmp = Path(tmp)
        for kind in args.kinds.split(","):
            base = tmp / kind / "base"
            base.mkdir(parents=True)
            src = interrupted_run(kind, base, args.preset)
            fresh, resumed, restore = [], [], []
            for i in tqdm(range(args.pairs), desc=kind):
                f = child(kind, tmp / kind / f"fresh{i}" / src.name, False, overrides, args.preset)
                copy = tmp / kind / f"resume{i}"
                shutil.copytree(base, copy)
                r = child(kind, copy / src.name, True, overrides, args.preset)
                fresh.append(f["first_step_s"])
                resumed.append(r["first_step_s"])
                restore.append(r.get("load_arm", 0.0) + r.get("restore_arm", 0.0))
            over = [b - a for a, b in zip(fresh, resumed)]
            results[kind] = {
                "fresh_to_first_step_s": fresh, "resume_to_first_step_s": resumed,
                "overhead_s": over, "overhead_median_s": statistics.median(over),
                "restore_s": restore if kind == "train" else None,
                "restore_median_s": statistics.median(restore) if kind == "train" else None,
                "meets_target_under_10_s": statistics.median(over) < 10,
            }
            print(kind, json.dumps({k: v for k, v in results[kind].items() if "median" in k}))
    out = {
        "command": "python " + " ".join(sys.argv),
        "what": __doc__.strip().splitlines()[0],
        "method": "each sample a new process, timed from the train_run/seams_study call to the first step's "
                  "progress event; fresh and resumed samples alternate; overhead = resumed - fresh, pairwise",
        "preset": args.preset, "overrides": overrides, "stopped_at_step": STOP_AT,
        "machine": {**machine(), "note": args.note},
        "torch": torch.__version__, "git_commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
