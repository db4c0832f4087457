"""Benchmark of token-file corpora (not a test): a 500M-token corpus trains in flat memory, at full speed.

1. Generate a corpus of `--tokens` tokens from repeated text: the shipped WordNet glosses,
   25 consecutive glosses to a document (about 2,000 bytes, the length of a web page's text;
   single glosses of 88 bytes would be an atypically small document) and a copy number in
   front of each, so no two documents are equal and the split stays about 1% / 1%.
   Tokenizer: `bytes` (one token per UTF-8 byte), because the timed preset (`cpu`) uses it, and
   because Qwen's BPE would take about 4 minutes per 500M tokens per core here.
2. `seamkit data prepare` it (in its own process; wall time and peak RSS are recorded).
3. Interleaved e2e training runs of the `cpu` preset, each in its own fresh process (the arm's
   budget loop, `seamkit.seams.arm.run_arm` on placement single, in that process):
   `memory` trains from the shipped corpus loaded in memory (data.load_corpus), `tokens` from
   the 500M-token directory (memory-mapped, seamkit.data.tokenfiles). Per run: tokens/s of the budget
   loop; `open`: RSS after opening the corpus minus before; `growth`: peak RSS while training
   (VmHWM, reset when training starts) minus RSS after WARM_STEPS steps, i.e. what training
   adds once every step's buffers exist: pages of the corpus read so far, the loader's
   per-epoch arrays, anything that leaks; and the whole run's peak RSS. The 500M-token corpus
   held in memory as the in-memory path holds one (int32) would be 1.9 GiB.
4. Two loader-only passes that read `--read` tokens (half the corpus by default; a CPU run
   trains on a few hundred thousand) through RowLoader at seed's batch shape: RSS growth with
   `TokenCorpus.release` every RELEASE_EVERY documents (the default) and never.

    python bench/data.py --tokens 500e6 --budget 40 --pairs 3 --read 250e6

The generated files are deleted at the end (`--keep` keeps them). Results: bench/results/data.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
WARM_STEPS = 3


def proc_status(key: str) -> int:
    m = re.search(rf"^{key}:\s+(\d+)\s*kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(m.group(1)) * 1024


# ----------------------------------------------------------------------------- one training run (child)

def child(corpus: str, budget: float, threads: int) -> dict:
    import torch

    from seamkit import config as C
    from seamkit.data.load import load_corpus
    from seamkit.seams.arm import ArmSpec, run_arm
    torch.set_num_threads(threads)
    cfg = C.override(C.cpu(), {"train.budget_seconds": budget, "train.threads": threads, "data.corpus": corpus,
                               "data.tokenizer": "bytes"})
    rss0 = proc_status("VmRSS")
    c = load_corpus(cfg.data)
    rss1 = proc_status("VmRSS")
    warm = {}

    def callback(event):  # RSS once a few steps have allocated what every step needs
        if event["kind"] in ("progress", "point") and event["step"] >= WARM_STEPS and not warm:
            warm["rss"], warm["step"] = proc_status("VmRSS"), event["step"]
    # in this process, which holds nothing else: its RSS is the arm's (own_process)
    r = run_arm(ArmSpec("e2e", cfg, C.Placement("single"), 1, own_process=True), emit=callback, corpus=c)
    if not warm:
        raise SystemExit(f"{r.steps} steps in {budget:g} s: growth is measured after {WARM_STEPS}; raise --budget")
    return {"corpus_tokens": c.n_tokens(), "train_tokens": c.n_tokens("train"), "steps": r.steps,
            "tokens_per_s": r.tokens_per_s, "rss_before_corpus": rss0, "rss_after_corpus": rss1,
            "rss_train_start": r.rss_start_bytes, "rss_warm": warm["rss"], "warm_step": warm["step"],
            "peak_rss": r.peak_rss_bytes, "open_MiB": (rss1 - rss0) / MiB,
            "growth_MiB": (r.peak_rss_bytes - warm["rss"]) / MiB,
            "rss_anon_end": proc_status("RssAnon"), "rss_file_end": proc_status("RssFile"),
            "final_loss": r.final_loss}


def loader_pass(corpus: str, n_tokens: float, release_every: int) -> dict:
    """Read n_tokens through RowLoader alone (seed's batch 8 x seq 512), far more than a CPU run
    trains on: what reading most of the corpus does to RSS, with and without `release`."""
    import torch

    from seamkit import config as C
    from seamkit.data import tokenfiles as tokens
    from seamkit.data.load import load_corpus
    from seamkit.data.rows import RowLoader
    from seamkit.memory import peak_rss_bytes, reset_peak_memory
    tokens.RELEASE_EVERY = release_every
    cfg = C.override(C.cpu(), {"data.corpus": corpus, "data.tokenizer": "bytes"})
    rss0 = proc_status("VmRSS")
    loader = RowLoader(load_corpus(cfg.data), "train", 8, 512, seed=0)
    loader.next()
    rss1 = proc_status("VmRSS")
    reset_peak_memory(torch.device("cpu"))
    t, batches = time.perf_counter(), int(n_tokens // (8 * 512))
    for _ in range(batches):
        loader.next()
    seconds = time.perf_counter() - t
    return {"release_every": release_every, "tokens_read": batches * 8 * 512, "seconds": seconds,
            "loader_tokens_per_s": batches * 8 * 512 / seconds, "open_and_first_batch_MiB": (rss1 - rss0) / MiB,
            "growth_MiB": (peak_rss_bytes() - rss1) / MiB, "rss_anon_end_MiB": proc_status("RssAnon") / MiB,
            "rss_file_end_MiB": proc_status("RssFile") / MiB}


def tokens_release_every() -> int:
    from seamkit.data.tokenfiles import RELEASE_EVERY
    return RELEASE_EVERY


def run_child(corpus: str, budget: float, threads: int, extra=()) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", corpus, "--budget", str(budget),
                          "--threads", str(threads), *extra], capture_output=True, text=True, cwd=ROOT,
                         check=False)  # a failed child says why below
    if out.returncode:
        raise SystemExit(f"child run failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- the corpus

def generate(path: Path, target_bytes: int) -> int:
    """A .jsonl of distinct ~2 kB documents made from WordNet glosses; returns its text bytes."""
    from seamkit.data.documents import load_documents
    glosses = load_documents("wordnet")
    groups = ["\n".join(glosses[i:i + 25]) for i in range(0, len(glosses), 25)]
    written, copy = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target_bytes:
            for g in groups:
                text = f"copy {copy} {g}"
                f.write(json.dumps({"text": text}) + "\n")
                written += len(text.encode("utf-8")) + 1  # + eod
                if written >= target_bytes:
                    break
            copy += 1
    return written


def prepare(work: Path, tokens: float, workers: int) -> dict:
    tok_dir = work / "tokens"
    meta_path = tok_dir / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text())["tokens"] >= tokens:
        return {"reused": True, **json.loads(meta_path.read_text())}
    shutil.rmtree(tok_dir, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    src = work / "repeated.jsonl"
    t = time.perf_counter()
    generate(src, int(tokens))
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "seamkit", "data", "prepare", "--corpus", str(src), "--tokenizer", "bytes",
                    "--out", str(tok_dir), "--workers", str(workers)], check=True, cwd=ROOT)
    prep_s = time.perf_counter() - t
    meta = json.loads(meta_path.read_text())
    source_bytes = src.stat().st_size
    src.unlink()  # the shards are what the runs read
    return {"reused": False, "generate_s": gen_s, "prepare_s": prep_s, "source_bytes": source_bytes,
            "prepare_peak_rss_children_MiB": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "prepare_workers": workers, **meta}


# ----------------------------------------------------------------------------- main

def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=float, default=500e6)
    ap.add_argument("--budget", type=float, default=40.0, help="training seconds per run")
    ap.add_argument("--pairs", type=int, default=3, help="interleaved (memory, tokens) pairs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2, help="data prepare processes")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "seamkit-bench-data"))
    ap.add_argument("--keep", action="store_true", help="keep the generated corpus")
    ap.add_argument("--prepare-only", action="store_true", help="generate and prepare, then stop (implies --keep)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "data.json"))
    ap.add_argument("--read", type=float, default=250e6, help="tokens the loader-only passes read")
    ap.add_argument("--note", default="sides interleaved, order alternating per pair",
                    help="what the results file says about the machine (quiet, shared...)")
    ap.add_argument("--child")
    ap.add_argument("--release-every", type=int)
    return ap.parse_args()


def train_pairs(work: Path, args) -> dict:
    """`--pairs` pairs of training runs, in memory and from the token files, who goes first alternating."""
    runs = {"memory": [], "tokens": []}
    for k in range(args.pairs):
        for side in ("memory", "tokens") if k % 2 == 0 else ("tokens", "memory"):
            r = run_child("wordnet" if side == "memory" else str(work / "tokens"), args.budget, args.threads)
            runs[side].append(r)
            print(f"pair {k} {side:6s}: {r['tokens_per_s']:,.0f} tok/s, open {r['open_MiB']:.1f} MiB, "
                  f"growth {r['growth_MiB']:.1f} MiB, peak {r['peak_rss'] / MiB:.0f} MiB "
                  f"(anon {r['rss_anon_end'] / MiB:.0f} MiB, file {r['rss_file_end'] / MiB:.0f} MiB at the end)")
    return runs


def loader_passes(work: Path, args) -> list[dict]:
    passes = []
    for every in (tokens_release_every(), 0):  # the default, and never
        r = run_child(str(work / "tokens"), 0, args.threads, ["--release-every", str(every), "--read", str(args.read)])
        passes.append(r)
        print(f"loader only, release every {every}: {r['tokens_read']:,} tokens read at "
              f"{r['loader_tokens_per_s'] / 1e6:.1f} M tok/s, RSS growth {r['growth_MiB']:.1f} MiB "
              f"(file {r['rss_file_end_MiB']:.0f} MiB at the end)")
    return passes


def results(args, prep: dict, runs: dict, passes: list[dict]) -> dict:
    import torch
    from seamkit.report import git_commit, machine
    ratios = [t["tokens_per_s"] / m["tokens_per_s"] for m, t in zip(runs["memory"], runs["tokens"])]
    growth = [r["growth_MiB"] for r in runs["tokens"]]
    return {
        "command": shlex.join(["python", "bench/data.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine(), "note": args.note},
        "torch_version": torch.__version__, "git_commit": git_commit(),
        "preset": "cpu (e2e arm, bytes tokenizer)", "budget_seconds": args.budget, "threads": args.threads,
        "corpus": {k: v for k, v in prep.items() if k not in ("shards", "sources")},
        "tokens_over_memory_tokens_per_s": {"median": statistics.median(ratios), "min": min(ratios),
                                            "max": max(ratios), "samples": ratios},
        "tokens_rss_growth_MiB": {"max": max(growth), "samples": growth},
        "memory_rss_growth_MiB": {"max": max(r["growth_MiB"] for r in runs["memory"]),
                                  "samples": [r["growth_MiB"] for r in runs["memory"]]},
        "open_MiB": {side: [r["open_MiB"] for r in rs] for side, rs in runs.items()},
        "peak_rss_MiB": {side: [r["peak_rss"] / MiB for r in rs] for side, rs in runs.items()},
        "in_memory_equivalent_MiB": prep["tokens"] * 4 / MiB,
        "loader_passes": passes,
        "targets": {"rss_growth_under_200MiB": max(growth) < 200 and passes[0]["growth_MiB"] < 200,
                    "note": "growth: training runs' samples and the loader-only pass with release",
                    "tokens_per_s_within_5pct": abs(statistics.median(ratios) - 1) <= 0.05},
        "runs": runs,
    }


def main() -> None:
    args = parse()
    if args.child:
        print(json.dumps(child(args.child, args.budget, args.threads) if args.release_every is None
                         else loader_pass(args.child, args.read, args.release_every)))
        return
    work = Path(args.workdir)
    prep = prepare(work, args.tokens, args.workers)
    print(f"corpus: {prep['tokens']:,} tokens in {len(prep['shards'])} shards"
          + ("" if prep["reused"] else f", generated in {prep['generate_s']:.0f} s, prepared in {prep['prepare_s']:.0f} s"))
    if args.prepare_only:
        return
    try:
        runs = train_pairs(work, args)
        passes = loader_passes(work, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    from seamkit.report import atomic_write_text
    result = results(args, prep, runs, passes)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("tokens_over_memory_tokens_per_s", "tokens_rss_growth_MiB",
                                             "memory_rss_growth_MiB", "open_MiB", "peak_rss_MiB", "loader_passes",
                                             "targets")},
                     indent=2))


if __name__ == "__main__":
    main()
