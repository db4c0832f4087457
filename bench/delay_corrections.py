"""Benchmark: local and delayed configurations against e2e under AdamW and Muon (not a test).

One seams study per (optimizer, configuration) of `--plan`, each with `--repeats` paired seeds at the same
budget per arm (equal wall-clock), on `--devices` devices, every arm on its fastest placement
(`seams.placement=best`), e2e under the same optimizer in every study:
  aux_head+d1:           local aux_head, delayed d=1;
  own_head+d2:           local own_head, delayed d=2;
  aux_head+d1+pipemare:  local aux_head, delayed d=1 with PipeMare's LR rescheduling (lr_delay_steps=100);
  own_head+d1+predict:   local own_head, delayed d=1 with weight prediction (weight_prediction=1);
  aux_head+d1+feedback:  local aux_head, delayed d=1 with error feedback (error_feedback=0.5);
  aux_head+d1+nesterov:  local aux_head, delayed d=1 with Nesterov look-ahead (NAdamW at beta1 0.99);
(a study runs e2e and local always: `seams.arms` names both)
the delayed arm with weight stashing throughout. The default plan runs the first four under AdamW
and the first two under Muon; a study's local arm is repeated across studies with its own e2e.
Per arm, from the study's paired aggregate: the gap to e2e's held-out loss at equal wall-clock
and at equal tokens, and the time-to-target ratio, each with its t-interval over the seeds.
The results file is rewritten after every study, so a stopped run keeps what it measured.

    python bench/delay_corrections.py --preset cpu --devices 2 --budget 300 --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import tempfile
import time
from pathlib import Path

from seamkit import config as C
from seamkit.report import provenance, write_json
from seamkit.seams.study import seams_study
from seamkit.stats import interval

ARMS = {"seams.arms": "e2e,local,delayed", "seams.weight_stashing": True}
STUDIES = {
    "aux_head+d1": {**ARMS, "seams.objective": "aux_head", "seams.delay": 1},
    "own_head+d2": {**ARMS, "seams.objective": "own_head", "seams.delay": 2},
    "aux_head+d1+pipemare": {**ARMS, "seams.objective": "aux_head", "seams.delay": 1, "seams.lr_delay_steps": 100},
    "own_head+d1+predict": {**ARMS, "seams.objective": "own_head", "seams.delay": 1, "seams.weight_prediction": 1.0},
    "aux_head+d1+feedback": {**ARMS, "seams.objective": "aux_head", "seams.delay": 1, "seams.error_feedback": 0.5},
    "aux_head+d1+nesterov": {**ARMS, "seams.objective": "aux_head", "seams.delay": 1, "seams.nesterov_momentum": 0.99},
}
CORRECTION = {"seams.lr_delay_steps": " + PipeMare LR", "seams.weight_prediction": " + weight prediction",
              "seams.error_feedback": " + error feedback", "seams.nesterov_momentum": " + Nesterov (NAdamW)"}
PLAN = ("adamw:aux_head+d1,adamw:own_head+d2,adamw:aux_head+d1+pipemare,adamw:own_head+d1+predict,"
        "muon:aux_head+d1,muon:own_head+d2")
MEASURES = {"loss_gap": "loss_gap_{a}_minus_e2e", "equal_tokens_gap": "equal_tokens_gap_{a}_minus_e2e",
            "time_to_target_ratio": "time_to_target_{a}_over_e2e", "tokens_per_s_ratio": "tokens_per_s_{a}_over_e2e"}


def rows(report: dict, study: str, optimizer: str) -> list[dict]:
    """One row per non-e2e arm: its configuration, placement and paired measures against e2e."""
    paired, out = report["aggregate"]["paired"], []
    for a in report["arms"]:
        if a == "e2e":
            continue
        over = STUDIES[study]
        name = (f"local {over['seams.objective']}" if a == "local" else
                f"delayed d={over['seams.delay']}" + "".join(v for k, v in CORRECTION.items() if k in over))
        out.append({"optimizer": optimizer, "study": study, "arm": a, "configuration": name,
                    "placement": report["placement"]["chosen"].get(a),
                    "e2e_placement": report["placement"]["chosen"].get("e2e"),
                    "e2e_final_loss": report["aggregate"]["e2e"]["final_loss"],
                    **{m: paired.get(key.format(a=a)) for m, key in MEASURES.items()}})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--plan", default=PLAN, help="optimizer:study,... (studies: " + ", ".join(STUDIES) + ")")
    ap.add_argument("--out", default="bench/results/delay_corrections.json")
    args = ap.parse_args(argv)
    base = C.override(C.preset(args.preset), {**C.parse_overrides(args.overrides), "seams.devices": args.devices,
                                              "train.budget_seconds": args.budget, "seams.repeats": args.repeats})
    doc = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "budget_seconds": args.budget, "repeats": args.repeats, "devices": args.devices,
           "studies": {}, "rows": [], **provenance(base)}
    with tempfile.TemporaryDirectory(prefix="seamkit-corrections-") as tmp:
        for opt, study in (p.split(":") for p in args.plan.split(",")):
            cfg = C.override(base, {**STUDIES[study], "train.optimizer": opt})
            print(f"{opt}, {study}: {STUDIES[study]}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            report = seams_study(cfg, Path(tmp) / f"{opt}_{study}.json", progress=False)
            doc["studies"][f"{opt}/{study}"] = {
                "config": STUDIES[study], "optimizer": opt, "status": report["status"],
                "wall_s": time.perf_counter() - t0, "placement": report["placement"]["chosen"],
                "aggregate": report["aggregate"], "time_to_target": [r["time_to_target"] for r in report["repeats"]],
                "equal_tokens": [r["equal_tokens"] for r in report["repeats"]]}
            new = rows(report, study, opt)
            doc["rows"] += new
            write_json(args.out, doc)
            for r in new:
                gap, equal = (interval(r[k], "+.3f", missing="n/a") for k in ("loss_gap", "equal_tokens_gap"))
                ratio = interval(r["time_to_target_ratio"], ".3f", missing="n/a")
                print(f"  {r['configuration']:34s} [{r['placement']}] gap {gap}, equal tokens {equal}, "
                      f"time to target x{ratio}",
                      file=sys.stderr, flush=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
