"""What a token folder's checks cost (not a test): the sampled check every open makes, the full
read of `seamkit data check`, and the vocabulary guard on every batch, against what they guard.

1. Generate text from the shipped WordNet glosses (`--tokens` bytes, documents of 25 glosses)
   and `seamkit data prepare` it with the `bytes` tokenizer (one token per byte, two bytes a
   token on disk) in `--shard-tokens` shards.
2. Interleaved, `--rounds` times, the page cache warm (a second open of a folder):
   - `open`: `open_corpus` whole, and `sample`: its sampled check (`check_samples`) alone;
   - `full`: the full check (`check_shards`: every shard's SHA-256 and every id), in MB/s;
   - `batch`: a cpu-preset training batch from `RowLoader.next` with the guard and without it
     (`check_vocab` replaced by a no-op), 200 batches each, and one cpu-preset training step
     (forward, backward, AdamW; one thread) for scale.

    python bench/data_checks.py --tokens 200e6 --rounds 5

The generated files are deleted at the end. Results: bench/results/data_checks.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seamkit import config as C  # noqa: E402
from seamkit.data import rows as rows_mod  # noqa: E402
from seamkit.data.prepare import prepare  # noqa: E402
from seamkit.data.rows import RowLoader  # noqa: E402
from seamkit.data.tokencheck import check_samples, check_shards  # noqa: E402
from seamkit.data.tokenfiles import open_corpus  # noqa: E402
from seamkit.model import GPT, lm_loss  # noqa: E402
from seamkit.report import git_commit, machine  # noqa: E402

BATCHES = 200


def glosses() -> list[str]:
    path = next(p for p in sorted((ROOT / "data").glob("*.jsonl.gz")))
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def write_text(path: Path, n_bytes: int) -> None:
    lines, copy, written = glosses(), 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < n_bytes:
            for i in range(0, len(lines), 25):
                doc = json.dumps({"text": f"{copy}: " + " ".join(lines[i:i + 25])}) + "\n"
                f.write(doc)
                written += len(doc)
                if written >= n_bytes:
                    break
            copy += 1


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def batches(corpus, cfg, guard: bool) -> float:
    saved = rows_mod.check_vocab
    if not guard:
        rows_mod.check_vocab = lambda *a: None
    try:
        loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, seed=0)
        return timed(lambda: [loader.next() for _ in range(BATCHES)]) / BATCHES
    finally:
        rows_mod.check_vocab = saved


def step_seconds(cfg, corpus) -> float:
    torch.manual_seed(0)
    model = GPT(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, seed=0)

    def one():
        x, y = loader.next()
        lm_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    one()
    return statistics.median(timed(one) for _ in range(5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--tokens", type=float, default=200e6, help="tokens (bytes of text) to generate")
    ap.add_argument("--shard-tokens", dest="shard_tokens", type=float, default=64e6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench/results/data_checks.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="seamkit-bench-checks-"))
    try:
        text, folder = work / "text.jsonl", work / "tokens"
        write_text(text, int(args.tokens))
        t_prepare = timed(lambda: prepare([text], "bytes", folder, shard_tokens=int(args.shard_tokens)))
        meta = json.loads((folder / "meta.json").read_text())
        corpus = open_corpus(folder, "bytes")
        n_vocab = corpus.tokenizer.n_vocab
        shard_bytes = sum((folder / s["file"]).stat().st_size for s in meta["shards"])
        cfg = C.cpu()
        rounds = []
        for r in range(args.rounds):
            order = [True, False] if r % 2 == 0 else [False, True]
            per = {"open_s": timed(lambda: open_corpus(folder, "bytes")),
                   "sample_s": timed(lambda: check_samples(folder, meta, n_vocab)),
                   "full_s": timed(lambda: check_shards(folder, meta, n_vocab))}
            for guard in order:
                per["batch_guarded_s" if guard else "batch_bare_s"] = batches(corpus, cfg, guard)
            rounds.append(per)
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in per.items()),
                  flush=True)
        step = step_seconds(cfg, corpus)

        def med(key):
            return statistics.median(p[key] for p in rounds)
        guard_cost = [p["batch_guarded_s"] - p["batch_bare_s"] for p in rounds]
        out = {
            "command": " ".join(["python", "bench/data_checks.py", *sys.argv[1:]]),
            "host": platform.node(), "machine": machine(), "torch": torch.__version__, "git_commit": git_commit(),
            "tokens": corpus.n_tokens(), "shards": len(meta["shards"]), "shard_bytes": shard_bytes,
            "sample": meta.get("sample"), "prepare_s": t_prepare, "rounds": rounds,
            "median": {"open_s": med("open_s"), "sample_s": med("sample_s"), "full_s": med("full_s"),
                       "full_mb_per_s": shard_bytes / med("full_s") / 1e6,
                       "batch_guarded_s": med("batch_guarded_s"), "batch_bare_s": med("batch_bare_s"),
                       "guard_s_per_batch": statistics.median(guard_cost)},
            "guard_cost_range_s": [min(guard_cost), max(guard_cost)],
            "cpu_step_s": step,
            "guard_share_of_step": statistics.median(guard_cost) / step,
            "sample_share_of_full": med("sample_s") / med("full_s"),
        }
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out["median"], indent=2))
        print(f"guard per batch {out['guard_share_of_step']:.2e} of a cpu step ({step * 1e3:.0f} ms); sampled check "
              f"{out['sample_share_of_full']:.2e} of the full read; results: {args.out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
