"""The `seamkit` command: info, train, seams, prune-check, reproduce, data prepare, sweep.

Every subcommand builds a RunConfig from a preset plus overrides (the same `config.override`
the notebooks and widgets use), then calls one library function. User errors (a bad config,
a missing or corrupt checkpoint, an empty corpus...) exit with status 2 and one line; Ctrl-C
exits with 130 after the library has written what it had.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from seamkit import config as C


def _common(p: argparse.ArgumentParser, preset: str = "cpu") -> None:
    p.add_argument("--preset", default=preset, choices=sorted(C.PRESETS), help=f"config preset (default {preset})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set model.dim=64 (repeatable)")
    p.add_argument("--seed", type=int, help="train.seed")
    p.add_argument("--threads", type=int, help="torch threads (train.threads)")


def _devices(text: str) -> int:
    """--devices: a count, or auto (0)."""
    if text.strip().lower() == "auto":
        return 0
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of devices or auto, got {text!r}")
    return n


def build_config(args) -> C.RunConfig:
    cfg = C.preset(args.preset)
    ov = C.parse_overrides(args.overrides)
    for flag, key in (("seed", "train.seed"), ("threads", "train.threads"), ("budget", "train.budget_seconds"),
                      ("max_steps", "train.max_steps"), ("objective", "seams.objective"), ("seams", "seams.seams"),
                      ("windows", "prune.windows"), ("samples", "prune.samples"),
                      ("policy", "prune.policy"), ("dtype", "prune.dtype"), ("repeats", "seams.repeats"),
                      ("order", "seams.order"), ("lr_schedule", "train.lr_schedule"), ("exact", "prune.exact"),
                      ("reference", "prune.reference"), ("devices", "seams.devices"), ("placement", "seams.placement"),
                      ("calibration", "seams.calibration")):
        value = getattr(args, flag, None)
        if value is not None:
            ov[key] = value
    return C.override(cfg, ov)


class OutputError(C.SeamkitError):
    """An output path that cannot be written; found before any work starts."""


def check_writable(path, directory: bool = False) -> None:
    """Fail now, in one line, if `path` (a file, or a directory with `directory`) cannot be
    written: its directory is created and a probe file is written, synced and removed there."""
    path = Path(path)
    where = path if directory else path.parent
    if not directory and path.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory; give a file path")
    if not directory and path.exists() and not path.is_file():
        raise OutputError(f"cannot write {path}: it is not a regular file (outputs are replaced by a rename)")
    for up in [where, *where.parents]:
        if up.exists():
            if not up.is_dir():
                raise OutputError(f"cannot write {path}: {up} is not a directory")
            break
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=where, prefix=".seamkit-probe-") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None


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
          f"seq {m.seq}, mlp_mult {m.mlp_mult}, batch {cfg.data.batch}, tokenizer {cfg.data.tokenizer}")
    print(f"params {out['params']:,} (non-embedding {out['params_non_embed']:,})")
    print(f"seams after blocks {seams}")
    width = max(len(k) for k in b)
    for k, v in b.items():
        print(f"  {k:<{width}}  {v:,}" if isinstance(v, int) else f"  {k:<{width}}  {v}")
    print(f"traffic e2e/local: {out['traffic_ratio_e2e_over_local']} with allreduce, "
          f"{out['traffic_ratio_no_allreduce']} without")
    return 0


@contextlib.contextmanager
def _made_dirs_go_on_error(*dirs):
    """The folders that checking or running creates for `dirs` are removed again when the
    command fails on a bad input (a SeamkitError) before anything was written in them."""
    tops = [made[-1] for made in (list(itertools.takewhile(lambda d: not d.exists(), [Path(d), *Path(d).parents]))
                                  for d in dirs) if made]
    try:
        yield
    except C.SeamkitError:
        for top in tops:
            if top.is_dir() and all(f.is_dir() for f in top.rglob("*")):  # folders only: nothing written
                shutil.rmtree(top, ignore_errors=True)
        raise


def cmd_train(args) -> int:
    from seamkit.seams import resume as R
    from seamkit.seams.run import train_run
    cfg = build_config(args)
    out = args.resume or args.out
    if args.resume:
        R.check_run(out)  # before anything is created
    with _made_dirs_go_on_error(out):
        check_writable(out, directory=True)
        summary = train_run(cfg, Path(out), resume=args.resume is not None)
    print(json.dumps({k: summary[k] for k in ("status", "steps", "tokens_per_s", "val_loss", "checkpoint",
                                              "wall_clock_dependent") if k in summary}, indent=2))
    return _exit_code(summary.get("status"))


def _exit_code(status) -> int:
    """0 complete, 130 interrupted (as for Ctrl-C, after what was done is written), 1 otherwise."""
    return {"complete": 0, "interrupted": 130}.get(status, 1)


def cmd_seams(args) -> int:
    from seamkit.seams import resume as R
    from seamkit.seams.arm import checkpoint_path
    from seamkit.seams.report import summary_table
    from seamkit.seams.study import seams_study
    cfg = build_config(args)
    if args.resume:
        args.out = args.resume
        R.check_study(args.out)  # before anything is created
    with _made_dirs_go_on_error(Path(args.out).parent, checkpoint_path(args.out, "e2e").parent):
        check_writable(args.out)
        check_writable(checkpoint_path(args.out, "e2e"))
        report = seams_study(cfg, Path(args.out), resume=args.resume is not None)
    print(summary_table(report))
    print(f"report: {args.out}")
    return _exit_code(report.get("status"))


def cmd_prune_check(args) -> int:
    from seamkit.checkpoint import check_overrides
    from seamkit.pruning.study import prune_check, summary_table
    cfg = build_config(args)
    overrides = C.parse_overrides(args.overrides)
    check_overrides(args.checkpoint, overrides)
    # the checkpoint's corpus unless --set names another (of the checkpoint's tokenizer), bare key or dotted
    named = any(C.dotted_key(cfg, k) == "data.corpus" for k in overrides)
    with _made_dirs_go_on_error(Path(args.out).parent):
        check_writable(args.out)
        report = prune_check(cfg, Path(args.checkpoint), Path(args.out), corpus=cfg.data.corpus if named else None)
    print(summary_table(report))
    print(f"report: {args.out}")
    return 0 if report.get("status") == "complete" else 1


def cmd_reproduce(args) -> int:
    from seamkit.reproduce import reproduce
    with _made_dirs_go_on_error(args.out):
        check_writable(args.out, directory=True)
        summary = reproduce(preset=args.preset, out_dir=Path(args.out), overrides=C.parse_overrides(args.overrides))
    print(summary)
    return 0


def cmd_data_prepare(args) -> int:
    from seamkit.data.tokenfiles import check_output, check_sizes, prepare
    # before any work and creating nothing: prepare writes beside the output and renames at the end
    check_sizes(args.workers, args.shard_tokens)
    check_output(args.out)
    meta = prepare(args.corpus, args.tokenizer, args.out, workers=args.workers, shard_tokens=args.shard_tokens,
                   text_column=args.text_column)
    sp = meta["splits"]
    print(f"{args.out}: {meta['tokens']:,} {meta['tokenizer']} tokens, {meta['documents']:,} documents in "
          f"{len(meta['shards'])} shards; train/val/test {sp['train']['tokens']:,}/{sp['val']['tokens']:,}/"
          f"{sp['test']['tokens']:,} tokens")
    print(f"train from it: --set data.corpus={args.out} --set data.tokenizer={meta['tokenizer']}")
    return 0


def cmd_sweep(args) -> int:
    from seamkit.sweep import plan as P
    from seamkit.sweep import run as S
    from seamkit.sweep.plots import failures, sweep_table
    if args.collect:
        given = [flag for flag, v in (("a study", args.study), ("--grid", args.grid), ("--emit-jobs", args.emit_jobs),
                                      ("--out", args.out), ("--set", args.overrides), ("--checkpoint", args.checkpoint),
                                      ("--threads", args.threads)) if v]
        if given:
            raise P.SweepError(f"--collect DIR reads what the sweep in DIR ran; it takes no {', '.join(given)}")
        result = S.collect(Path(args.collect), target=args.target)
        out = Path(args.collect)
    else:
        if not args.study or not args.out:
            raise P.SweepError("give a study (seams or pruning) and --out DIR, or --collect DIR")
        if not args.grid:
            raise P.SweepError("give at least one --grid KEY=V1,V2,...")
        plan = P.make_plan(args.study, P.parse_grid(args.grid), args.out, preset=args.preset, repeats=args.repeats,
                           overrides=C.parse_overrides(args.overrides), checkpoint=args.checkpoint, jobs=args.jobs,
                           threads=args.threads, target=args.target)
        if args.emit_jobs:
            lines = S.emit_jobs(plan, args.out, args.emit_jobs)
            first = sum(p["needs"] is None and p["study"] != plan["study"] for p in plan["points"])
            print(f"{len(lines)} commands in {args.emit_jobs} (points already complete are left out)"
                  + (f"; run the first {first} before the rest: they train the checkpoints" if first else ""))
            print(f"then: seamkit sweep --collect {args.out}")
            return 0
        try:
            result = S.run(plan, args.out, jobs=args.jobs)
        except S.Terminated:
            print("seamkit sweep: terminated (SIGTERM); its points are stopped and recorded as interrupted",
                  file=sys.stderr)
            return 143  # 128 + SIGTERM: what a shell reports for a process SIGTERM ended
        out = Path(args.out)
    print(sweep_table(result))
    for line in failures(result):
        print(f"failed: {line}")
    c = result["counts"]
    print(f"{c['complete']} complete, {c['failed']} failed, {c['interrupted']} interrupted, {c['pending']} pending; "
          f"{out / 'sweep.json'}, {out / 'sweep.csv'}, {out / 'figures'}/")
    return 0 if result["status"] == "complete" else 1


def cmd_forecast(args) -> int:
    from seamkit.forecast import (
        ForecastError,
        forecast,
        load_costs,
        measured_speeds,
        parse_devices,
        parse_link,
        validate_report,
        validation_lines,
    )
    from seamkit.forecast.study import summary_lines
    from seamkit.report import write_json
    cfg = build_config(args)
    devices, link = parse_devices(args.device_counts or "1,2,4,8,16"), parse_link(args.link)  # bad inputs first
    measured = None
    if args.validate:
        try:
            measured = json.loads(Path(args.validate).read_text())
        except FileNotFoundError:
            raise ForecastError(f"--validate {args.validate} does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ForecastError(f"--validate {args.validate} is not readable JSON ({e})") from None
        at = sorted({n for per in measured_speeds(measured)["tokens_per_s"].values() for n in per})
        if isinstance(measured.get("run_config"), dict):  # a seams report: the forecast of the config it ran
            cfg = C.from_dict(measured["run_config"])
        # the measured devices (and N=1 to compare with), or those --devices names as well
        devices = parse_devices(sorted(set(at) | ({1} if not args.device_counts else set(devices))))
    costs = load_costs(args.costs) if args.costs else None
    with _made_dirs_go_on_error(Path(args.out).parent):
        check_writable(args.out)
        report = forecast(cfg, devices, costs=costs, link=link, cores=args.cores)
        if measured is not None:
            report["validation"] = validate_report(report, measured)
        write_json(args.out, report)
    print("\n".join(summary_lines(report)))
    if measured is not None:
        print("\n".join(validation_lines(report["validation"])))
    print(f"report: {args.out}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = C.OneLineParser(prog="seamkit", description=__doc__.splitlines()[0])  # errors in one line
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="config, parameter counts and the traffic bytes block")
    _common(p, preset="seed")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("train", help="train end to end for a budget; writes a checkpoint and a summary")
    _common(p)
    p.add_argument("--budget", type=float, help="seconds of training (train.budget_seconds)")
    p.add_argument("--max-steps", dest="max_steps", type=int, help="train.max_steps")
    p.add_argument("--lr-schedule", dest="lr_schedule", choices=C.LR_SCHEDULES,
                   help="LR schedule by budget share or by step (train.lr_schedule)")
    p.add_argument("--out", default="runs/train", help="output directory")
    p.add_argument("--resume", metavar="OUT", help="continue the run stopped in output directory OUT "
                   "(same --preset and --set as that run)")
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("seams", help="the seams study: e2e vs local under one wall-clock budget")
    _common(p)
    p.add_argument("--budget", type=float, help="seconds per arm (train.budget_seconds)")
    p.add_argument("--max-steps", dest="max_steps", type=int, help="train.max_steps")
    p.add_argument("--objective", choices=C.OBJECTIVES, help="local objective")
    p.add_argument("--seams", help="'all', a count, or block indices '1,3,5'")
    p.add_argument("--devices", type=_devices, help="the hardware budget both arms get: N, or auto (the free "
                   "cores on CPU, every GPU on CUDA; seams.devices)")
    p.add_argument("--placement", help="best (each arm its fastest placement on this machine, the default) or "
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

    p = sub.add_parser("prune-check", help="the pruning study: exact pruning vs a compiled reference step")
    _common(p)
    p.add_argument("--checkpoint", required=True, help="checkpoint to start every step from")
    p.add_argument("--windows", type=int, help="prune.windows")
    p.add_argument("--samples", type=int, help="prune.samples")
    p.add_argument("--policy", help="loss policy: all, completion or random:<p>")
    p.add_argument("--dtype", choices=("float32", "float64"), help="prune.dtype")
    p.add_argument("--exact", choices=("arithmetic", "bitwise"),
                   help="prune.exact: arithmetic (default; float64 within 1e-12) or bitwise (this CPU's bits, slower)")
    p.add_argument("--reference", choices=("inductor", "eager"),
                   help="prune.reference: inductor (default; a failed compile stops the run) or eager")
    p.add_argument("--out", default="reports/pruning.json", help="report path")
    p.set_defaults(fn=cmd_prune_check)

    p = sub.add_parser("reproduce", help="run both notebooks headless (papermill) and write both reports")
    p.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="reports", help="output directory")
    p.set_defaults(fn=cmd_reproduce)

    p = sub.add_parser("data", help="corpora: `data prepare` tokenizes text into memory-mapped token files")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("prepare", help="tokenize .txt/.jsonl(.gz)/.parquet files into token shards")
    p.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                   help="corpus files, or directories of them (taken in name order)")
    p.add_argument("--tokenizer", default="qwen", choices=C.TOKENIZERS, help="tokenizer (default qwen)")
    p.add_argument("--out", required=True, help="new or empty output directory")
    p.add_argument("--workers", type=int, default=0, help="tokenizing processes (default: one per CPU)")
    p.add_argument("--shard-tokens", dest="shard_tokens", type=int, default=1 << 28,
                   help="start a new shard once one holds this many tokens")
    p.add_argument("--text-column", dest="text_column", default="text", help="parquet column holding the text")
    p.set_defaults(fn=cmd_data_prepare)


    p = sub.add_parser("sweep", help="a study's notebook over a grid x seeds (papermill), resumable, aggregated")
    p.add_argument("study", nargs="?", choices=("seams", "pruning"), help="the study to sweep")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a notebook parameter or config key and its values (repeatable; '|' separates "
                        "values that contain commas)")
    p.add_argument("--repeats", type=int, default=1, help="seeds 0..R-1 per grid point (default 1)")
    p.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every point")
    p.add_argument("--threads", type=int, help="torch threads per point (default: cores / jobs when jobs > 1)")
    p.add_argument("--jobs", type=int, default=1, help="points run at once on this machine")
    p.add_argument("--checkpoint", help="pruning: a checkpoint path, or 'seams' to train one per seed in the sweep")
    p.add_argument("--target", type=float, help="training loss for time-to-target (default: the highest loss "
                   "every arm reached)")
    p.add_argument("--out", help="the sweep folder")
    p.add_argument("--emit-jobs", dest="emit_jobs", metavar="FILE",
                   help="write one shell command per point to FILE instead of running them")
    p.add_argument("--collect", metavar="DIR", help="aggregate the points in DIR (run by --emit-jobs commands)")
    p.set_defaults(fn=cmd_sweep)

    p = sub.add_parser("forecast", help="forecast each arm's tokens/s and bubble at N devices from measured costs")
    _common(p)
    p.add_argument("--devices", dest="device_counts", help="device counts N, e.g. 1,2,4,8,16 (the default; with "
                   "--validate: N=1 and the devices it measured)")
    p.add_argument("--costs", metavar="FILE", help="a cost table (or a forecast report) to reuse; default: measure now")
    p.add_argument("--link", default="loopback", help="loopback, nvlink, infiniband or LATENCY_S,BANDWIDTH_BYTES_PER_S")
    p.add_argument("--cores", type=int, help="CPU cost tables: cores the ranks may share (default: the measuring "
                   "machine's); more ranks than that are not forecast")
    p.add_argument("--validate", metavar="REPORT", help="a seams report made with --devices N (or a calibration or "
                   "bench JSON of measured candidates): forecast its config at its devices and give each candidate's "
                   "error")
    p.add_argument("--out", default="reports/forecast.json", help="report path")
    p.set_defaults(fn=cmd_forecast)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except C.SeamkitError as e:
        print(f"seamkit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"seamkit {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
