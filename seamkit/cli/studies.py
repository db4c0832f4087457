"""The study commands: `info`, `train`, `seams`, `prune-check`, `reproduce` and `findings`, each its
flags beside the function that runs it."""

from __future__ import annotations

import json
from pathlib import Path

from seamkit import config as C
from seamkit.cli.common import (
    build_config,
    check_writable,
    common_flags,
    devices_flag,
    exit_code,
    made_dirs_go_on_error,
)


def add_info(sub) -> None:
    p = sub.add_parser("info", help="config, parameter counts and the traffic bytes block")
    common_flags(p, preset="seed")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_info)


def cmd_info(args) -> int:
    from seamkit.model import param_counts
    from seamkit.seams.cuts import traffic_bytes, traffic_ratios
    cfg = build_config(args)
    seams = cfg.seam_blocks
    b = traffic_bytes(cfg.model, cfg.data.batch, len(seams))
    out = {"preset": cfg.preset, "config": cfg.to_dict(), **param_counts(cfg.model), "seam_blocks": seams,
           "bytes": b, **traffic_ratios(b)}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    m = cfg.model
    print(f"preset {cfg.preset}: vocab {m.vocab}, dim {m.dim}, n_blocks {m.n_blocks}, n_heads {m.n_heads}, "
          f"kv_heads {m.n_kv_heads}, seq {m.seq}, mlp {m.mlp} {m.mlp_width} wide, bias {m.bias}, "
          f"batch {cfg.data.batch}, tokenizer {cfg.data.tokenizer}")
    print(f"params {out['params']:,} (non-embedding {out['params_non_embed']:,})")
    print(f"seams after blocks {seams}")
    width = max(len(k) for k in b)
    for k, v in b.items():
        print(f"  {k:<{width}}  {v:,}" if isinstance(v, int) else f"  {k:<{width}}  {v}")
    print(f"traffic e2e/local: {out['traffic_ratio_e2e_over_local']} with allreduce, "
          f"{out['traffic_ratio_no_allreduce']} without")
    return 0


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train end to end for a budget; writes a checkpoint and a summary")
    common_flags(p)
    p.add_argument("--budget", type=float, help="seconds of training (train.budget_seconds)")
    p.add_argument("--max-steps", dest="max_steps", type=int, help="train.max_steps")
    p.add_argument("--lr-schedule", dest="lr_schedule", choices=C.LR_SCHEDULES,
                   help="LR schedule by budget share or by step (train.lr_schedule)")
    p.add_argument("--out", default="runs/train", help="output directory")
    p.add_argument("--resume", metavar="OUT", help="continue the run stopped in output directory OUT "
                   "(same --preset and --set as that run)")
    p.set_defaults(fn=cmd_train)


def cmd_train(args) -> int:
    from seamkit.seams import resume as R
    from seamkit.seams.run import train_run
    cfg = build_config(args)
    out = args.resume or args.out
    if args.resume:
        R.check_run(out)  # before anything is created
    with made_dirs_go_on_error(out):
        check_writable(out, directory=True)
        summary = train_run(cfg, Path(out), resume=args.resume is not None)
    print(json.dumps({k: summary[k] for k in ("status", "steps", "tokens_per_s", "val_loss", "checkpoint",
                                              "wall_clock_dependent", "interrupted") if k in summary}, indent=2))
    return exit_code(summary.get("status"), (summary.get("interrupted") or {}).get("signal"))


def add_seams(sub) -> None:
    p = sub.add_parser("seams", help="the seams study: e2e, local (and delayed) under one wall-clock budget")
    common_flags(p)
    p.add_argument("--budget", type=float, help="seconds per arm (train.budget_seconds)")
    p.add_argument("--max-steps", dest="max_steps", type=int, help="train.max_steps")
    p.add_argument("--objective", choices=C.OBJECTIVES, help="local objective")
    p.add_argument("--seams", help="'all', a count, or block indices '1,3,5'")
    p.add_argument("--devices", type=devices_flag, help="the hardware budget every arm gets: N, or auto (the free "
                   "cores on CPU, every GPU on CUDA; seams.devices)")
    p.add_argument("--placement", help="best (each arm its fastest placement on this host, the default) or "
                   "e2e=single|dp|pipe:SCHEDULE[:M],local=single|stages,delayed=single|stages (seams.placement)")
    p.add_argument("--calibration", choices=C.CALIBRATIONS, help="placement=best: where each candidate's speed comes "
                   "from (seams.calibration)")
    p.add_argument("--repeats", type=int, help="seeds to repeat the study for, paired (seams.repeats)")
    p.add_argument("--order", choices=C.ORDERS, help="arms take turns in slices, or run one after the other")
    p.add_argument("--lr-schedule", dest="lr_schedule", choices=C.LR_SCHEDULES,
                   help="LR schedule by budget share or by step (train.lr_schedule)")
    p.add_argument("--out", default="reports/seams.json", help="report path")
    p.add_argument("--resume", metavar="OUT", help="continue the study stopped with report path OUT "
                   "(same --preset and --set as that study)")
    p.set_defaults(fn=cmd_seams)


def cmd_seams(args) -> int:
    from seamkit.seams import resume as R
    from seamkit.seams.arm import checkpoint_path
    from seamkit.seams.report import summary_table
    from seamkit.seams.study import seams_study
    cfg = build_config(args)
    if args.resume:
        args.out = args.resume
        R.check_study(args.out)  # before anything is created
    with made_dirs_go_on_error(Path(args.out).parent, checkpoint_path(args.out, "e2e").parent):
        check_writable(args.out)
        check_writable(checkpoint_path(args.out, "e2e"))
        report = seams_study(cfg, Path(args.out), resume=args.resume is not None)
    print(summary_table(report))
    print(f"report: {args.out}")
    return exit_code(report.get("status"), (report.get("interrupted") or {}).get("signal"))


def add_prune_check(sub) -> None:
    p = sub.add_parser("prune-check", help="the pruning study: exact pruning vs a compiled reference step")
    common_flags(p)
    p.add_argument("--checkpoint", required=True, help="checkpoint to start every step from")
    p.add_argument("--windows", type=int, help="prune.windows")
    p.add_argument("--samples", type=int, help="prune.samples")
    p.add_argument("--policy", help="loss policy: all, completion or random:<p>")
    p.add_argument("--dtype", choices=("float32", "float64"), help="prune.dtype")
    p.add_argument("--exact", choices=("arithmetic", "bitwise"),
                   help="prune.exact: arithmetic (default; float64 within 1e-12) or bitwise (this CPU's bits, slower)")
    p.add_argument("--reference", choices=("inductor", "eager"),
                   help="prune.reference: inductor (default; a failed compile stops the run) or eager")
    p.add_argument("--precision", choices=("fp32", "bf16"),
                   help="prune.precision: what the timed steps run in, fp32 (default) or bf16 (as training on CUDA)")
    p.add_argument("--out", default="reports/pruning.json", help="report path")
    p.set_defaults(fn=cmd_prune_check)


def cmd_prune_check(args) -> int:
    from seamkit.checkpoint import check_overrides
    from seamkit.pruning.report import summary_table
    from seamkit.pruning.study import prune_check
    cfg = build_config(args)
    overrides = C.parse_overrides(args.overrides)
    check_overrides(args.checkpoint, overrides)
    # the checkpoint's corpus unless --set names another (of the checkpoint's tokenizer), bare key or dotted
    named = any(C.dotted_key(cfg, k) == "data.corpus" for k in overrides)
    with made_dirs_go_on_error(Path(args.out).parent):
        check_writable(args.out)
        report = prune_check(cfg, Path(args.checkpoint), Path(args.out), corpus=cfg.data.corpus if named else None)
    print(summary_table(report))
    print(f"report: {args.out}")
    return 0 if report.get("status") == "complete" else 1


def add_reproduce(sub) -> None:
    p = sub.add_parser("reproduce", help="run both notebooks headless (papermill) and write both reports")
    p.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="reports", help="output directory")
    p.set_defaults(fn=cmd_reproduce)


def cmd_reproduce(args) -> int:
    from seamkit.reproduce import reproduce
    with made_dirs_go_on_error(args.out):
        check_writable(args.out, directory=True)
        summary = reproduce(preset=args.preset, out_dir=Path(args.out), overrides=C.parse_overrides(args.overrides))
    print(summary)
    return 0


def add_findings(sub) -> None:
    p = sub.add_parser("findings", help="rerun every headline figure here, from a clean commit: the JSON files and "
                                        "the page with its tables and figures (resumable)")
    p.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS), help="config preset (default cpu; tiny: a "
                   "dry run of seconds)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field for every step (repeatable)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every training budget by this (default 1)")
    p.add_argument("--out", default="bench/results/findings", help="the results folder")
    p.add_argument("--page", default="docs/findings.md", help="the page to write (its PNGs go to img/findings/ "
                   "beside it)")
    p.add_argument("--only", metavar="STEP", help="run this step alone, again even if done (the steps it reads "
                   "must be done): seams_n1, seams_n2, forecast, own_head, qwen or pruning")
    p.add_argument("--allow-dirty", dest="allow_dirty", action="store_true",
                   help="run from a tree with uncommitted changes (development only; the page says so)")
    p.set_defaults(fn=cmd_findings)


def cmd_findings(args) -> int:
    from seamkit.findings import run_findings
    with made_dirs_go_on_error(args.out, Path(args.page).parent):
        check_writable(args.out, directory=True)
        check_writable(args.page)
        summary = run_findings(preset=args.preset, out_dir=args.out, page_path=args.page,
                               overrides=C.parse_overrides(args.overrides), scale=args.scale,
                               allow_dirty=args.allow_dirty, only=args.only)
    ran, skipped = ", ".join(summary["ran"]) or "nothing", ", ".join(summary["skipped"]) or "none"
    print(f"findings: ran {ran}; done before: {skipped}; page {summary['page']}")
    return 0
