"""The tool commands: `data prepare`, `data check`, `sweep`, `forecast` and `figures`, each its flags
beside the function that runs it."""

from __future__ import annotations

import sys
from pathlib import Path

from seamkit import config as C
from seamkit.cli.common import build_config, check_writable, common_flags, made_dirs_go_on_error


def add_data(sub) -> None:
    p = sub.add_parser("data", help="corpora: `data prepare` tokenizes text into memory-mapped token files, "
                                    "`data check` reads all of them")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("prepare", help="tokenize .txt/.jsonl(.gz)/.parquet files, or a datasets dataset on "
                                            "disk, into token shards")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", nargs="+", metavar="PATH",
                        help="corpus files, or directories of them (taken in name order)")
    source.add_argument("--hf", metavar="PATH[:SPLIT]", help="a Hugging Face datasets dataset: a folder save_to_disk "
                        "wrote (SPLIT of a DatasetDict, default train) or of .parquet or .arrow files")
    p.add_argument("--tokenizer", default="qwen", help="qwen (default), bytes, or hf:PATH[#EOD]: a tokenizer.json "
                   "or a folder holding one, EOD its end-of-document token if not <|endoftext|>, </s>, ...")
    p.add_argument("--out", required=True, help="new or empty output directory")
    p.add_argument("--workers", type=int, default=0, help="tokenizing processes (default: one per CPU)")
    p.add_argument("--shard-tokens", dest="shard_tokens", type=int, default=1 << 28,
                   help="start a new shard once one holds this many tokens")
    p.add_argument("--text-column", dest="text_column", help="the column holding the text (parquet: default "
                   "text; --hf: default text, content or the only string column)")
    p.set_defaults(fn=cmd_data_prepare)
    p = data_sub.add_parser("check", help="read every shard of a token folder: its SHA-256 and every token id")
    p.add_argument("dir", metavar="DIR", help="a token folder from `data prepare`")
    p.set_defaults(fn=cmd_data_check)


def cmd_data_prepare(args) -> int:
    from seamkit.data.prepare import check_output, check_sizes, prepare
    # before any work and creating nothing: prepare writes beside the output and renames at the end
    check_sizes(args.workers, args.shard_tokens)
    check_output(args.out)
    meta = prepare(args.corpus, args.tokenizer, args.out, workers=args.workers, shard_tokens=args.shard_tokens,
                   text_column=args.text_column, hf=args.hf)
    sp = meta["splits"]
    print(f"{args.out}: {meta['tokens']:,} {meta['tokenizer']} tokens, {meta['documents']:,} documents in "
          f"{len(meta['shards'])} shards; train/val/test {sp['train']['tokens']:,}/{sp['val']['tokens']:,}/"
          f"{sp['test']['tokens']:,} tokens")
    vocab = f" --set model.vocab={C.tokenizer_vocab(meta['tokenizer'])}" if meta["tokenizer"].startswith("hf:") else ""
    print(f"train from it: --set data.corpus={args.out} --set data.tokenizer={meta['tokenizer']}{vocab}")
    return 0


def cmd_data_check(args) -> int:
    """One line: "ok: N shards, T tokens", or the first fault found and exit status 1."""
    from seamkit.data.errors import DataError
    from seamkit.data.tokenfiles import open_corpus
    try:
        corpus = open_corpus(args.dir, None, full=True, progress=True)
    except DataError as e:
        print(f"seamkit data check: error: {e}", file=sys.stderr)
        return 1
    print(f"ok: {len(corpus.shards)} shards, {corpus.n_tokens():,} tokens")
    return 0


def add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="a study's notebook over a grid x seeds (papermill), resumable, aggregated")
    p.add_argument("study", nargs="?", choices=("seams", "pruning"), help="the study to sweep")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a notebook parameter or config key and its values (repeatable; '|' separates "
                        "values that contain commas)")
    p.add_argument("--repeats", type=int, default=1, help="seeds 0..R-1 per grid point (default 1)")
    p.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config key, or a parameter of the study's notebook, for every point")
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


def add_forecast(sub) -> None:
    p = sub.add_parser("forecast", help="forecast each arm's tokens/s and bubble at N devices from measured costs")
    common_flags(p)
    p.set_defaults(preset=None)  # with --validate alone: the report's own config
    p.add_argument("--device-counts", dest="device_counts", help="device counts N, e.g. 1,2,4,8,16 (the default; "
                   "with --validate: N=1 and the devices it measured)")
    p.add_argument("--costs", metavar="FILE", help="a cost table (or a forecast report) to reuse; default: measure now")
    p.add_argument("--link", default="loopback", help="loopback, nvlink, infiniband or LATENCY_S,BANDWIDTH_BYTES_PER_S")
    p.add_argument("--cores", type=int, help="CPU cost tables: cores the ranks may share (default: the measuring "
                   "machine's); more ranks than that are not forecast")
    p.add_argument("--validate", metavar="REPORT", help="a seams report made with --devices N on this host: forecast "
                   "its config (or the one --preset and --set give, which must match it) at its devices and give each "
                   "candidate measured in that run its error")
    p.add_argument("--out", default="reports/forecast.json", help="report path")
    p.set_defaults(fn=cmd_forecast)


def cmd_forecast(args) -> int:
    from seamkit.forecast import (
        check_cores,
        check_validatable,
        forecast,
        load_costs,
        load_measured,
        measured_devices,
        parse_devices,
        parse_link,
        summary_lines,
        validate_report,
        validation_lines,
    )
    from seamkit.report import write_json
    # bad inputs first, before minutes of cost measurement
    devices = parse_devices(args.device_counts if args.device_counts is not None else "1,2,4,8,16")
    link, cores = parse_link(args.link), check_cores(args.cores)
    measured = load_measured(args.validate) if args.validate is not None else None
    named = args.preset is not None or args.overrides or args.seed is not None or args.threads is not None
    if measured is not None and not named and isinstance(measured.get("run_config"), dict):
        cfg = C.from_dict(measured["run_config"])  # a seams report alone: the forecast of the config it ran
    else:
        args.preset = args.preset or "cpu"
        cfg = build_config(args)
    if measured is not None:  # the measured devices (and N=1 to compare with), or those --device-counts names too
        devices = parse_devices(sorted(set(measured_devices(measured)) |
                                       ({1} if args.device_counts is None else set(devices))))
    costs = load_costs(args.costs) if args.costs is not None else None
    if measured is not None:  # the same config, devices and host, or one line
        check_validatable(cfg, measured, devices, host=costs["machine"] if costs else None)
    with made_dirs_go_on_error(Path(args.out).parent):
        check_writable(args.out)
        if Path(args.out).is_file():  # said before minutes of measuring; the old file stays until the rename
            print(f"seamkit forecast: replacing existing {args.out} once the new forecast is written", file=sys.stderr)
        report = forecast(cfg, devices, costs=costs, link=link, cores=cores)
        if measured is not None:
            report["validation"] = validate_report(report, measured)
        write_json(args.out, report)
    print("\n".join(summary_lines(report)))
    if measured is not None:
        print("\n".join(validation_lines(report["validation"])))
    print(f"report: {args.out}")
    return 0


def add_figures(sub) -> None:
    p = sub.add_parser("figures", help="a report's figures as PNG, SVG or PDF files (plotly's kaleido in Chromium)")
    p.add_argument("report", metavar="REPORT", help="a seams or pruning report, or a sweep folder or its sweep.json")
    p.add_argument("--format", help="png, svg or pdf, or several comma-separated, drawn in one browser session "
                                    "(default png, or --out FILE's suffix)")
    p.add_argument("--out", help="a folder (default: figures/ beside the report), or one file when --only names "
                                 "one figure")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="this figure alone, by its name less the kind prefix, e.g. loss_seconds or "
                        "final_loss_vs_seams (repeatable; default: every figure)")
    p.set_defaults(fn=cmd_figures)


def cmd_figures(args) -> int:
    from seamkit.figures import FORMATS, FiguresError, browser, figures_of, formats, load, render, write_bytes
    from seamkit.figures import write_images
    kind, report = load(args.report)
    figs = figures_of(kind, report)
    unknown = [n for n in args.only if n not in figs]
    if unknown:
        raise FiguresError(f"the {kind} report has no figure {unknown[0]!r}; it has {', '.join(figs)}")
    figs = {n: figs[n] for n in dict.fromkeys(args.only)} if args.only else figs
    where = Path(args.report)
    out = Path(args.out) if args.out else (where if where.is_dir() else where.parent) / "figures"
    one_file = out.suffix.lstrip(".").lower() in FORMATS
    fmts = (out.suffix.lstrip(".").lower(),) if one_file else formats(args.format or "png")
    if one_file and len(figs) != 1:
        raise FiguresError(f"--out {out} is one file: name its figure with --only (one of {', '.join(figs)})")
    if one_file and args.format and formats(args.format) != fmts:
        raise FiguresError(f"--out {out} is a .{fmts[0]} file but --format is {args.format}")
    path = browser()  # kaleido or a browser missing: one line, before anything is created
    with made_dirs_go_on_error(out.parent if one_file else out):
        check_writable(out, directory=not one_file)
        if one_file:
            write_bytes(out, next(iter(render(figs, fmts, path).values())))
            written = [out]
        else:
            written = write_images(figs, out, fmts, prefix=f"{kind}_", path=path)
    print("\n".join(map(str, written)))
    return 0
