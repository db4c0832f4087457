"""Benchmark of the seams study (not a test). Four parts (`--part`):

threads  Quiet against busy: e2e tokens/s for each thread setting (torch's default 2 threads with
         OpenMP's default waiting, 2 threads with OMP_WAIT_POLICY=PASSIVE, 1 thread, GOMP spin
         counts, seamkit's own default), each alone and beside one CPU-bound process this bench
         starts itself. Every sample is a fresh process (OpenMP reads its policy when torch
         loads) training the e2e chain; the settings run in a shuffled order per round, quiet
         and busy back to back.
order    The study itself (`seamkit.seams.study`), interleaved against sequential, on a quiet
         machine and with a CPU-bound process running for part of the run: the local/e2e
         tokens/s ratio of each, and what interleaving costs in tokens/s.
switch   What taking turns costs, without the noise of separate processes: both arms in one pair
         of processes, phases of long slices (sequential-like) and of the study's short slices
         alternating; each arm's tokens/s in short-slice phases over the long ones around them.
arms     MFU of e2e, then local/e2e throughput and memory, and where a step goes:
         1. the e2e arm's MFU by the study's own path: FLOPs per token counted by FlopCounterMode
            on one real training step (`seamkit.seams.per_token.arm_costs`), the matmul peak
            measured in the same run (`seamkit.flops.matmul_peak`), and `seamkit.flops.mfu`;
         2. local/e2e tokens/s from steps of every arm's chain interleaved in this process, and
            local/e2e tokens/s and peak memory from budget runs, each arm on its own process
            (`seamkit.seams.processes.run_arms`, placement single), so peak RSS is per arm; e2e
            runs first and last, and ratios use the mean of the two (the machine may be shared);
         3. where each arm's step goes: forward and backward per segment, the read-outs (head and
            loss, both ways), the clip and the optimizer, from in-process steps.

Every part trains the `--preset` config (cpu by default) with `--set` overrides.

    python bench/seams.py --part threads --steps 40 --rounds-threads 3 --json bench/results/seams_threads.json
    python bench/seams.py --part threads --steps 40 --rounds-threads 3 --settings '2 threads, OpenMP default wait;1 thread;seamkit default (train.threads=0: cores not busy at start)' --json bench/results/seams_threads_auto.json
    python bench/seams.py --part order --budget 20 --rounds-order 2 --busy-delay 8 --busy-seconds 20 --json bench/results/seams_order.json
    python bench/seams.py --part switch --rounds-switch 8 --json bench/results/seams_switch.json
    python bench/seams.py --part arms --preset cpu --budget 25
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from seamkit import config as C
from seamkit import optim as OPT
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader
from seamkit.flops import matmul_peak, mfu
from seamkit.model import resolve_device
from seamkit.report import atomic_write_text, git_commit, machine
from seamkit.seams import study as S
from seamkit.seams import update as U
from seamkit.seams.arm import ArmSpec
from seamkit.seams.chain import Chain
from seamkit.seams.per_token import arm_costs
from seamkit.seams.placement import arm_segments
from seamkit.seams.processes import run_arms


def e2e_mfu(costs: dict, peak: dict, tokens_per_s: dict) -> dict:
    """The e2e arm's MFU for each throughput {label: tokens/s}: `arm_costs`' counted FLOPs per
    token over `matmul_peak`, by `seamkit.flops.mfu`, as the study's report computes it."""
    f = costs["e2e"]["flops_per_token"]
    return {label: {"tokens_per_s": tps, "flops_per_s": f * tps, "mfu": mfu(f, tps, peak["flops_per_s"])}
            for label, tps in tokens_per_s.items()}


def chain_of(arm: str, cfg: C.RunConfig, corpus) -> Chain:
    """The arm's training step in this process, as the study's one-process placement builds it."""
    segs = arm_segments(cfg, arm)
    return Chain(cfg, arm, segs, range(len(segs)), resolve_device(cfg.train.device), corpus)


def loader_of(cfg: C.RunConfig, corpus) -> RowLoader:
    return RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, cfg.train.seed)


def base_config(args) -> C.RunConfig:
    return C.override(C.preset(args.preset), C.parse_overrides(args.overrides))


# ----------------------------------------------------------------------------- where the time goes

def timed_step(ch: Chain, loader: RowLoader, lr: float) -> dict:
    """One training step of `ch`, as `Chain.step` takes it where no gradient comes late (e2e: one
    segment; local: each segment backpropagates its own loss at once), timed by phase (seconds).

    Segment k's forward is split into its blocks and its read-out (head + loss); its backward
    into the read-out's part (until the gradient reaches the segment's output h_BTC, seen by a
    hook) and the blocks' part.
    """
    assert not (ch.policy.crosses and len(ch.segs) > 1), "timed by phase: e2e or local only"
    x_BT, y_BT = loader.next()
    out, h_BTC = {}, None
    t_step = time.perf_counter()
    for k in ch.mine:
        t0 = time.perf_counter()
        with ch.autocast():
            h_BTC = ch.run(k, x_BT if k == 0 else None, None if k == 0 else h_BTC.detach())
            t1 = time.perf_counter()
            loss = ch.loss(k, h_BTC, y_BT)
        t2 = time.perf_counter()
        reached = []
        h_BTC.register_hook(lambda g, reached=reached: reached.append(time.perf_counter()))
        loss.backward()
        t3 = time.perf_counter()
        out.update({f"seg{k} fwd blocks": t1 - t0, f"seg{k} fwd head+loss": t2 - t1,
                    f"seg{k} bwd head+loss": reached[0] - t2, f"seg{k} bwd blocks": t3 - reached[0]})
    t4 = time.perf_counter()
    U.clip_each(ch.groups, ch.clip)  # one group for e2e: the global-norm clip
    t5 = time.perf_counter()
    U.apply(ch.opts, lr)
    t6 = time.perf_counter()
    out.update({"clip": t5 - t4, "optimizer": t6 - t5, "step": t6 - t_step})
    return out


def plain_step(ch: Chain, loader: RowLoader, lr: float) -> float:
    """Seconds of one `Chain.step`, the batch's loading included."""
    t = time.perf_counter()
    ch.step(*loader.next(), lr)
    return time.perf_counter() - t


def interleave(cfgs: dict, corpus, step, rounds: int, warmup: int, seed: int = 0) -> dict:
    """`step(chain, loader, lr)`'s value for each arm {name: (arm, cfg)} after `warmup` rounds,
    the arms' steps interleaved in one process in a random order each round (a shared machine's
    load falls on every arm alike): {name: [one value per round]}."""
    chains = {name: chain_of(arm, c, corpus) for name, (arm, c) in cfgs.items()}
    loaders = {name: loader_of(c, corpus) for name, (_, c) in cfgs.items()}
    samples = {name: [] for name in chains}
    order, rng = list(chains), random.Random(seed)
    for r in range(warmup + rounds):
        rng.shuffle(order)
        for name in order:
            got = step(chains[name], loaders[name], OPT.lr_at(r, cfgs[name][1].train))
            if r >= warmup:
                samples[name].append(got)
    return samples


def mean_phases(samples: list[dict]) -> dict:
    return {k: statistics.mean(s[k] for s in samples) for k in samples[0]}


def summarize_breakdown(b: dict) -> dict:
    """Totals by kind: blocks forward/backward, heads (read-out + loss, both ways), clip, optimizer."""
    out = {"fwd blocks": 0.0, "bwd blocks": 0.0, "heads": 0.0}
    for k, v in b.items():
        if k.endswith("fwd blocks"):
            out["fwd blocks"] += v
        elif k.endswith("bwd blocks"):
            out["bwd blocks"] += v
        elif "head+loss" in k:
            out["heads"] += v
    out["clip"], out["optimizer"], out["step"] = b["clip"], b["optimizer"], b["step"]
    out["other"] = out["step"] - sum(v for k, v in out.items() if k != "step")
    return out


def _table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(rows[0], widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows[1:]]
    return "\n".join(out)


# ----------------------------------------------------------------------------- quiet against busy

SETTINGS = {"2 threads, OpenMP default wait": (0, None), "2 threads, OMP_WAIT_POLICY=PASSIVE": (0, "PASSIVE"),
            "1 thread": (1, None), "2 threads, GOMP_SPINCOUNT=10000": (0, "spin:10000"),
            "2 threads, GOMP_SPINCOUNT=100000": (0, "spin:100000"),
            "seamkit default (train.threads=0: cores not busy at start)": (-1, None)}
TARGET_QUIET = 7400.0  # the quiet 2-thread tokens/s at the cpu preset the default must stay within 5% of
PROBE_THREADS: list[int] = []  # the thread count each probe ran with


def probe_main(threads: int, steps: int, args) -> None:
    """A probe's own process: e2e steps at `threads` (0: torch's default; -1: seamkit's, chosen
    from the other processes' load); prints the threads used and the tokens/s."""
    if threads < 0:
        from seamkit.threads import resolve_threads
        threads = resolve_threads(0)
    if threads:
        torch.set_num_threads(threads)
    cfg = base_config(args)
    corpus = load_corpus(cfg.data)
    ch, loader = chain_of("e2e", cfg, corpus), loader_of(cfg, corpus)
    for _ in range(5):
        ch.step(*loader.next(), 1e-3)
    t = time.perf_counter()
    for _ in range(steps):
        ch.step(*loader.next(), 1e-3)
    print(torch.get_num_threads(), steps * cfg.data.batch * cfg.model.seq / (time.perf_counter() - t))


def busy_neighbour(delay: float = 0.0, seconds: float = 1e9) -> subprocess.Popen:
    """One CPU-bound process (a Python busy loop), after `delay` seconds, for `seconds`."""
    code = f"import time; time.sleep({delay}); end = time.time() + {seconds}\nwhile time.time() < end: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def probe(threads: int, policy: str | None, args) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SEAMKIT_THREADS",
                                                            "OMP_NUM_THREADS")}
    if policy and policy.startswith("spin:"):
        env["GOMP_SPINCOUNT"] = policy.split(":")[1]
    elif policy:
        env["OMP_WAIT_POLICY"] = policy
    sets = [a for kv in args.overrides for a in ("--set", kv)]
    out = subprocess.run([sys.executable, __file__, "--probe", str(threads), str(args.steps), "--preset", args.preset,
                          *sets], env=env, check=True, capture_output=True, text=True)
    used, tok_s = out.stdout.strip().splitlines()[-1].split()
    PROBE_THREADS.append(int(used))
    return float(tok_s)


def threads_part(args) -> dict:
    settings = {n: SETTINGS[n] for n in (args.settings.split(";") if args.settings else SETTINGS)}
    samples = {name: {"quiet": [], "busy": [], "threads_quiet": [], "threads_busy": []} for name in settings}
    rng = random.Random(0)
    for r in range(args.rounds_threads):
        names = list(settings)
        rng.shuffle(names)
        for name in names:
            threads, policy = settings[name]
            quiet = probe(threads, policy, args)
            hog = busy_neighbour()
            try:
                busy = probe(threads, policy, args)
            finally:
                hog.kill()
                hog.wait()
            s = samples[name]
            s["quiet"].append(quiet)
            s["busy"].append(busy)
            s["threads_quiet"].append(PROBE_THREADS[-2])
            s["threads_busy"].append(PROBE_THREADS[-1])
            print(f"round {r}: {name}: quiet {quiet:,.0f} tok/s ({PROBE_THREADS[-2]} threads), beside a busy "
                  f"process {busy:,.0f} ({PROBE_THREADS[-1]} threads)", flush=True)
    first = next(iter(samples))
    base = statistics.median(samples.get("2 threads, OpenMP default wait", samples[first])["quiet"])
    rows = [("setting", "quiet tok/s", "busy tok/s", "busy/quiet", "quiet vs 2-thread default", "quiet vs 7.4k")]
    summary = {}
    for name, s in samples.items():
        q, b = statistics.median(s["quiet"]), statistics.median(s["busy"])
        summary[name] = {"quiet_median": q, "busy_median": b, "busy_over_quiet": b / q, "quiet_over_default": q / base,
                         "quiet_over_issue_7400": q / TARGET_QUIET}
        rows.append((name, f"{q:,.0f}", f"{b:,.0f}", f"{b / q:.2f}", f"{q / base:.2f}", f"{q / TARGET_QUIET:.2f}"))
    print(_table(rows))
    return {"samples": samples, "summary": summary, "steps_per_sample": args.steps}


# ----------------------------------------------------------------------------- interleaved against sequential

def order_run(cfg: C.RunConfig, busy: bool, args) -> dict:
    """One study; "busy": a CPU-bound process runs from `busy_delay` s after it starts for
    `busy_seconds` (in sequential order that is mostly the e2e arm's time)."""
    hog = busy_neighbour(args.busy_delay, args.busy_seconds) if busy else None
    try:
        with tempfile.TemporaryDirectory() as d:
            rep = S.seams_study(cfg, Path(d) / "seams.json", progress=False)
    finally:
        if hog:
            hog.kill()
            hog.wait()
    e, lo = rep["arms"]["e2e"]["tokens_per_s"], rep["arms"]["local"]["tokens_per_s"]
    return {"order": cfg.seams.order, "busy": busy, "e2e_tokens_per_s": e, "local_tokens_per_s": lo,
            "ratio": lo / e, "slices": {a: rep["arms"][a].get("slices") for a in ("e2e", "local")}}


def order_part(args) -> dict:
    """Each run: the study (1 seed) with `--budget` s per arm, quiet or busy, in a shuffled order per round."""
    base = C.override(base_config(args), {"train.budget_seconds": args.budget, "seams.token_marks": 1,
                                          "train.eval_tokens": 8192, "seams.repeats": 1})
    runs, rng = [], random.Random(1)
    for r in range(args.rounds_order):
        cases = [(o, b) for o in C.ORDERS for b in (False, True)]
        rng.shuffle(cases)
        for order, busy in cases:
            run = {"round": r, **order_run(C.override(base, {"seams.order": order}), busy, args)}
            runs.append(run)
            print(f"round {r}: {order:11s} {'busy' if busy else 'quiet'}: e2e {run['e2e_tokens_per_s']:,.0f} tok/s, "
                  f"local {run['local_tokens_per_s']:,.0f}, local/e2e {run['ratio']:.3f}", flush=True)

    def med(order, busy, key):
        return statistics.median(x[key] for x in runs if x["order"] == order and x["busy"] == busy)
    summary = {}
    rows = [("order", "quiet local/e2e", "busy local/e2e", "busy vs quiet ratio", "quiet e2e tok/s",
             "quiet local tok/s")]
    for order in C.ORDERS:
        q, b = med(order, False, "ratio"), med(order, True, "ratio")
        summary[order] = {"quiet_ratio": q, "busy_ratio": b, "busy_over_quiet_ratio": b / q,
                          "quiet_e2e_tokens_per_s": med(order, False, "e2e_tokens_per_s"),
                          "quiet_local_tokens_per_s": med(order, False, "local_tokens_per_s")}
        rows.append((order, f"{q:.3f}", f"{b:.3f}", f"{b / q:.3f}", f"{summary[order]['quiet_e2e_tokens_per_s']:,.0f}",
                     f"{summary[order]['quiet_local_tokens_per_s']:,.0f}"))
    i, s = summary["interleaved"], summary["sequential"]
    summary["interleaving_cost"] = {arm: 1 - i[f"quiet_{arm}_tokens_per_s"] / s[f"quiet_{arm}_tokens_per_s"]
                                    for arm in ("e2e", "local")}
    print(_table(rows))
    print("interleaving cost on a quiet machine (1 - interleaved/sequential tokens/s): "
          + ", ".join(f"{a} {v:+.1%}" for a, v in summary["interleaving_cost"].items()))
    return {"runs": runs, "summary": summary, "budget_seconds": args.budget, "busy_delay": args.busy_delay,
            "busy_seconds": args.busy_seconds}


# ----------------------------------------------------------------------------- what switching costs

def switch_worker(arm: str, mine, theirs, phases: list, threads: int, cfg_dict: dict, out) -> None:
    """One arm in its own process, taking turns with the other: per phase, `total` training
    seconds in slices of `slice` seconds (the clock stops while the other arm trains)."""
    torch.set_num_threads(threads)
    cfg = C.from_dict(cfg_dict)
    corpus = load_corpus(cfg.data)
    ch, loader = chain_of(arm, cfg, corpus), loader_of(cfg, corpus)
    for _ in range(3):
        ch.step(*loader.next(), 1e-3)
    per_step = cfg.data.batch * cfg.model.seq
    results = []
    for slice_s, total in phases:
        steps, seconds = 0, 0.0
        while seconds < total - 1e-9:
            mine.wait()
            mine.clear()
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < min(slice_s, total - seconds):
                ch.step(*loader.next(), 1e-3)
                steps += 1
            seconds += time.perf_counter() - t0
            theirs.set()
        results.append({"slice_s": slice_s, "steps": steps, "seconds": seconds, "tokens_per_s": steps * per_step / seconds})
    out.put((arm, results))


def switch_part(args) -> dict:
    """Both arms in one pair of processes for the whole run, phases alternating between long
    slices (`--long-slice`, as in sequential order) and the study's short ones (seams.slice_seconds):
    each arm's tokens/s in short-slice phases over the long-slice phases around them. The same two
    processes run every phase, so what differs between processes (memory placement, the thread
    count) cancels; only what taking turns costs (caches the other arm evicted, the hand-over) remains."""
    import multiprocessing as mp
    cfg = base_config(args)
    short = cfg.seams.slice_seconds
    phases = []
    for _ in range(args.rounds_switch):
        phases += [(args.long_slice, args.long_slice), (short, args.long_slice)]
    phases.append((args.long_slice, args.long_slice))
    ctx = mp.get_context("spawn")
    ev = {a: ctx.Event() for a in ("e2e", "local")}
    out = ctx.Queue()
    threads = args.threads or torch.get_num_threads()
    procs = [ctx.Process(target=switch_worker, args=(a, ev[a], ev[b], phases, threads, cfg.to_dict(), out))
             for a, b in (("e2e", "local"), ("local", "e2e"))]
    for pr in procs:
        pr.start()
    ev["e2e"].set()
    got = dict(out.get() for _ in procs)
    for pr in procs:
        pr.join()
    summary = {}
    for arm, rs in got.items():
        ratios = [rs[i]["tokens_per_s"] / statistics.mean([rs[i - 1]["tokens_per_s"], rs[i + 1]["tokens_per_s"]])
                  for i in range(1, len(rs), 2)]
        summary[arm] = {"short_over_long": ratios, "median": statistics.median(ratios),
                        "cost": 1 - statistics.median(ratios)}
        print(f"{arm}: tokens/s in {short:g}-s slices over {args.long_slice:g}-s slices around them: "
              + ", ".join(f"{r:.3f}" for r in ratios) + f" (median {statistics.median(ratios):.3f})", flush=True)
    return {"phases": phases, "threads": threads, "per_arm": got, "summary": summary}


# ----------------------------------------------------------------------------- the arms

def budget_run(arm: str, c: C.RunConfig, threads: int) -> dict:
    """One budget run of `arm` alone on a process of its own (placement single, `threads` threads)."""
    results, _ = run_arms({arm: ArmSpec(arm, c, C.Placement("single"), threads)})
    res = results[arm]
    mem = res.peak_vram_bytes if res.peak_vram_bytes is not None else res.peak_rss_bytes
    r = {"steps": res.steps, "tokens_per_s": res.tokens_per_s, "final_loss": res.final_loss, "mem": mem,
         "mem_train": mem - res.rss_start_bytes if res.peak_vram_bytes is None else mem}
    label = f"{arm} {c.seams.objective} {c.seams.seams}" if arm == "local" else arm
    print(f"  budget run {label}: {r['steps']} steps, {r['tokens_per_s']:,.0f} tok/s, final loss "
          f"{r['final_loss']:.4f}, peak {r['mem'] / 2**20:.0f} MiB (+{r['mem_train'] / 2**20:.0f} MiB "
          f"during training)", flush=True)
    return r


def ratio_table(local_runs: dict, e2e_runs: list, steps: dict) -> str:
    """local over e2e per (objective, seams): interleaved and budget-run tokens/s, memory, final loss."""
    def e2e_mean(key):
        return statistics.mean(r[key] for r in e2e_runs)
    rows = [("objective", "seams", "tok/s local/e2e (interleaved)", "tok/s local/e2e (budget run)",
             "peak RSS local/e2e", "RSS growth in training local/e2e", "final loss local (e2e)")]
    for (o, n), r in local_runs.items():
        rows.append((o, n, f"{steps['e2e'] / steps[(o, n)]:.2f}x",
                     f"{r['tokens_per_s'] / e2e_mean('tokens_per_s'):.2f}x",
                     f"{r['mem'] / e2e_mean('mem'):.2f}x", f"{r['mem_train'] / e2e_mean('mem_train'):.2f}x",
                     f"{r['final_loss']:.3f} ({e2e_mean('final_loss'):.3f})"))
    return _table(rows)


def breakdown_part(args, cfg: C.RunConfig, local_cfgs: dict, corpus) -> dict:
    """Where a step goes, for e2e and local at the first and last seam count of each objective."""
    seams = args.seams.split(",")
    wanted = {"e2e": ("e2e", cfg)}
    for o in args.objectives.split(","):
        for n in sorted({seams[0], seams[-1]}, key=int):
            wanted[f"local {o}, {n} seams"] = ("local", local_cfgs[(o, n)])
    print(f"\nwhere a step goes (ms per step, mean of {args.breakdown_steps} interleaved in-process steps after 5 "
          "warm-up steps):")
    parts = {name: mean_phases(s) for name, s in interleave(wanted, corpus, timed_step, args.breakdown_steps, 5).items()}
    kinds = ["fwd blocks", "bwd blocks", "heads", "clip", "optimizer", "other", "step"]
    print(_table([("arm", *kinds)] + [(name, *(f"{1e3 * summarize_breakdown(b)[k]:.1f}" for k in kinds))
                                      for name, b in parts.items()]))
    print("\nper segment (ms): fwd blocks / fwd head+loss / bwd head+loss / bwd blocks")
    for name, b in parts.items():
        segs = sorted({k.split()[0] for k in b if k.startswith("seg")}, key=lambda s: int(s[3:]))
        cells = [f"{s}: " + " / ".join(f"{1e3 * b[f'{s} {p}']:.1f}" for p in
                                        ("fwd blocks", "fwd head+loss", "bwd head+loss", "bwd blocks")) for s in segs]
        print(f"  {name}: " + "; ".join(cells))
    return parts


def arms_part(args) -> dict:
    cfg = C.override(base_config(args), {"train.budget_seconds": args.budget, "train.threads": args.threads})
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    corpus = load_corpus(cfg.data)
    local_cfgs = {(o, n): C.override(cfg, {"seams.objective": o, "seams.seams": n})
                  for o in args.objectives.split(",") for n in args.seams.split(",")}
    costs = arm_costs(cfg, corpus)  # the study's count: one real training step per arm
    peak = matmul_peak(resolve_device(cfg.train.device))
    print(f"preset {args.preset}: {cfg.model}, batch {cfg.data.batch}; torch threads {threads}; "
          f"matmul {peak['flops_per_s'] / 1e9:.1f} GFLOP/s ({peak['matmul']})", flush=True)
    cfgs = {"e2e": ("e2e", cfg), **{k: ("local", c) for k, c in local_cfgs.items()}}
    steps = {k: statistics.median(v) for k, v in interleave(cfgs, corpus, plain_step, args.rounds, 3).items()}
    print(f"interleaved: median step e2e {steps['e2e'] * 1e3:.1f} ms", flush=True)
    e2e_runs = [budget_run("e2e", cfg, threads)]
    local_runs = {k: budget_run("local", c, threads) for k, c in local_cfgs.items()}
    e2e_runs.append(budget_run("e2e", cfg, threads))
    f = costs["e2e"]["flops_per_token"]
    mfus = e2e_mfu(costs, peak, {"interleaved median step": cfg.data.batch * cfg.model.seq / steps["e2e"],
                                 "budget runs (mean of first and last)":
                                     statistics.mean(r["tokens_per_s"] for r in e2e_runs)})
    print()
    for label, m in mfus.items():
        print(f"e2e MFU, {label}: {m['tokens_per_s']:,.0f} tok/s x {f / 1e6:.2f} MFLOP/token "
              f"(counted, one training step) = {m['flops_per_s'] / 1e9:.2f} GFLOP/s = {m['mfu']:.1%} of the "
              "measured matmul")
    tps = ", ".join(f"{r['tokens_per_s']:,.0f}" for r in e2e_runs)
    losses = ", ".join(f"{r['final_loss']:.4f}" for r in e2e_runs)
    print(f"e2e budget runs (first, last): {tps} tok/s; final loss {losses}\n")
    print(ratio_table(local_runs, e2e_runs, steps))
    parts = breakdown_part(args, cfg, local_cfgs, corpus)
    return {"matmul_peak": peak, "costs": costs, "e2e_mfu": mfus,
            "interleaved_step_s": {str(k): v for k, v in steps.items()}, "e2e": e2e_runs,
            "local": [{"objective": o, "seams": n, **r} for (o, n), r in local_runs.items()], "breakdown": parts}


# ----------------------------------------------------------------------------- main

def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("threads", "order", "switch", "arms"), default="arms")
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds per arm in the budget runs")
    ap.add_argument("--seams", default="1,3,7", help="arms: seam counts to try")
    ap.add_argument("--objectives", default=",".join(C.OBJECTIVES))
    ap.add_argument("--threads", type=int, default=0, help="torch threads everywhere (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=12, help="arms: interleaved steps per arm")
    ap.add_argument("--breakdown-steps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=40, help="threads: timed steps per sample")
    ap.add_argument("--rounds-threads", type=int, default=3)
    ap.add_argument("--settings", help="threads: ';'-separated names of SETTINGS (default: all)")
    ap.add_argument("--rounds-order", type=int, default=2)
    ap.add_argument("--busy-delay", type=float, default=8.0, help="order: seconds before the busy process starts")
    ap.add_argument("--busy-seconds", type=float, default=20.0, help="order: seconds the busy process runs")
    ap.add_argument("--rounds-switch", type=int, default=3, help="switch: short-slice phases")
    ap.add_argument("--long-slice", type=float, default=12.0, help="switch: seconds of a long slice (and of a phase)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--note", default="'quiet' means no busy process of this bench's own",
                    help="what the results file says about the machine (quiet, shared...)")
    ap.add_argument("--probe", nargs=2, type=int, help=argparse.SUPPRESS)  # a threads sample's own process
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.probe:
        probe_main(*args.probe, args)
        return 0
    out = {"threads": threads_part, "order": order_part, "switch": switch_part, "arms": arms_part}[args.part](args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.json), json.dumps({
            "command": shlex.join(["python", "bench/seams.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine(),
            "torch": torch.__version__, "git_commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "conditions": args.note, **out}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
