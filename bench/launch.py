"""How long short arm runs take to start and finish on their ranks, forked from the launcher's fork
server (the default on Linux) against spawned as fresh interpreters.

Each sample is a new launcher process that runs the same list of short arms (tiny preset, 4 steps,
one thread a rank) one after the other through `processes.run_arms`, timed from its first call to
its last return: the fork server's start (its import of torch and seamkit) is inside the timing.
The two start methods alternate, sample by sample, so a drift of the machine reaches both alike.

    .venv/bin/python bench/launch.py --samples 5
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seamkit.report import git_commit, machine  # noqa: E402

RUNS = [("e2e", "dp"), ("e2e", "pipe:gpipe:4"), ("local", "stages"), ("e2e", "single"), ("delayed", "stages")]

CHILD = """
import json, sys, time
from seamkit import config as C
from seamkit.seams import launch
from seamkit.seams.arm import ArmSpec
from seamkit.seams.processes import run_arms
if __name__ == "__main__":
    launch.START_METHOD = sys.argv[1]
    cfg = C.override(C.tiny(), {"train.max_steps": 4, "train.budget_seconds": 0.0, "train.threads": 1})
    runs = json.loads(sys.argv[2])
    t0 = time.perf_counter()
    for arm, placement in runs:
        results, _ = run_arms({arm: ArmSpec(arm, cfg, C.parse_placement(placement), 2)})
        assert results[arm].status == "complete", (arm, placement, results[arm].status)
    print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def sample(method: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, method, json.dumps(RUNS)], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"bench/launch.py: the {method} sample failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--samples", type=int, default=5, help="samples per start method (alternating)")
    ap.add_argument("--out", default="bench/results/launch.json")
    ap.add_argument("--note", default="", help="what the results file says about the machine (quiet, shared...)")
    args = ap.parse_args()
    times = {"forkserver": [], "spawn": []}
    for i in range(args.samples):
        for method in (("forkserver", "spawn") if i % 2 == 0 else ("spawn", "forkserver")):
            times[method].append(sample(method))
            print(f"sample {i + 1}/{args.samples} {method}: {times[method][-1]:.1f} s", flush=True)
    med = {m: statistics.median(v) for m, v in times.items()}
    pairs = [s / f for f, s in zip(times["forkserver"], times["spawn"])]
    out = {
        "command": "python " + " ".join(sys.argv),
        "what": __doc__.strip().splitlines()[0],
        "method": "each sample a new launcher process running the same short arms one after the other on two "
                  "ranks; start methods alternate; the fork server's own start inside the timing",
        "runs": RUNS, "steps": 4, "preset": "tiny",
        "seconds": {m: {"values": v, "median": med[m], "min": min(v), "max": max(v)} for m, v in times.items()},
        "spawn_over_forkserver": {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)},
        "machine": {"host": platform.node(), **machine(), "note": args.note}, "git_commit": git_commit(), "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"spawn {med['spawn']:.1f} s, forkserver {med['forkserver']:.1f} s (median over {args.samples}); "
          f"spawn/forkserver per pair {out['spawn_over_forkserver']['median']:.2f}x; wrote {args.out}")


if __name__ == "__main__":
    main()
