"""Token files (seamkit.data.tokenfiles): `data prepare`, memory-mapped corpora, and training from them."""

import gzip
import json
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from seamkit import cli
from seamkit.data import tokenfiles as tokens
from seamkit.data.corpus import Corpus, tokenize_documents
from seamkit.data.documents import SPLITS, split_documents
from seamkit.data.errors import DataError
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader, epochs, eval_batches, repeat_warning
from seamkit.data.tokenizers import get_tokenizer
from seamkit.data.windows import make_windows
from tests.test_data import data_cfg, lemma_docs


def write_sources(tmp_path, docs):
    """The documents split over a .txt, a .jsonl.gz and a .parquet file (with a null row), in that order."""
    a, b, c = docs[:len(docs) // 3], docs[len(docs) // 3:2 * len(docs) // 3], docs[2 * len(docs) // 3:]
    (tmp_path / "a.txt").write_text("\n\n".join(a) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(b))
    pq.write_table(pa.table({"id": list(range(len(c) + 1)), "text": c[:5] + [None] + c[5:]}),
                   tmp_path / "c.parquet", row_group_size=7)
    return [tmp_path / "a.txt", tmp_path / "b.jsonl.gz", tmp_path / "c.parquet"]


@pytest.fixture(scope="module")
def docs():
    return lemma_docs(900, seed=4)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, docs):
    """The same documents prepared in this process and by 2 worker processes, in small shards."""
    tmp = tmp_path_factory.mktemp("tok")
    files = write_sources(tmp, docs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tokens, "CHUNK_CHARS", 2000)  # many tasks, so the workers' results must come back in order
        one = tokens.open_corpus(_prepare(files, tmp / "one", workers=1), "bytes")
        two = tokens.open_corpus(_prepare(files, tmp / "two", workers=2), "bytes")
    return one, two


def _prepare(files, out, workers, shard_tokens=3000):
    tokens.prepare(files, "bytes", out, workers=workers, shard_tokens=shard_tokens, progress=False)
    return out


def in_memory(docs) -> Corpus:
    """What load_corpus builds from the same documents in one file."""
    tok = get_tokenizer("bytes")
    arrays = tokenize_documents(docs, tok)
    return Corpus(name="mem", tokenizer=tok, tokens=arrays["tokens"], offsets=arrays["offsets"],
                       prompt_len=arrays["prompt_len"], words=arrays["words"],
                       splits={s: np.asarray(v, np.int64) for s, v in split_documents(docs).items()})


def test_prepared_corpus_equals_the_in_memory_one(prepared, docs):
    """Every format, either tokenizing path, several shards: the same documents, arrays and splits."""
    mem = in_memory(docs)
    for tc in prepared:
        assert len(tc.shards) > 3 and isinstance(tc.shards[0], np.memmap) and isinstance(tc.offsets, np.memmap)
        assert tc.n_docs == mem.n_docs == len(docs)
        assert np.array_equal(tc.offsets, mem.offsets)
        assert np.array_equal(tc.prompt_len, mem.prompt_len) and np.array_equal(tc.words, mem.words)
        assert all(np.array_equal(tc.splits[s], mem.splits[s]) for s in SPLITS)
        assert all(np.array_equal(tc.doc(i), mem.doc(i)) for i in range(mem.n_docs))
        assert tc.n_tokens() == mem.n_tokens() and all(tc.n_tokens(s) == mem.n_tokens(s) for s in SPLITS)
        for chunk in (50, 1 << 20):  # chunks smaller than a document, and the whole corpus at once
            assert np.array_equal(tc.token_counts("train", 258, chunk=chunk), mem.token_counts("train", 258))


def test_row_loader_reads_a_token_corpus_like_the_in_memory_one(prepared, docs):
    """Same batches, across several epochs, and the same held-out batches and windows."""
    mem, tc = in_memory(docs), prepared[1]
    a, b = RowLoader(mem, "train", 4, 64, seed=3), RowLoader(tc, "train", 4, 64, seed=3)
    for _ in range(3 * mem.n_tokens("train") // (4 * 64)):
        (xa, ya), (xb, yb) = a.next(), b.next()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert b.epoch == 2 and a.state_dict() == b.state_dict() and a.epochs == b.epochs > 2
    for (x1, y1), (x2, y2) in zip(eval_batches(mem, "val", 2, 16, 3), eval_batches(tc, "val", 2, 16, 3)):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    w1, w2 = (make_windows(c, "test", 256, "completion", 1)[0] for c in (mem, tc))
    assert torch.equal(w1.idx, w2.idx) and torch.equal(w1.loss_mask, w2.loss_mask) and w1.words == w2.words


def test_prepare_streams(tmp_path, monkeypatch):
    """Peak Python/numpy memory while preparing a 7 MB corpus stays under a quarter of it."""
    docs = [f"doc {i}: " + "lorem ipsum dolor sit amet " * 8 for i in range(30_000)]
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    monkeypatch.setattr(tokens, "CHUNK_CHARS", 1 << 16)
    tracemalloc.start()
    try:
        tokens.prepare([path], "bytes", tmp_path / "out", workers=1, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < path.stat().st_size / 4, (peak, path.stat().st_size)  # reading it whole would be > 1
    assert tokens.open_corpus(tmp_path / "out", "bytes").n_docs == len(docs)


def _rss_file_kib() -> int:
    return int(re.search(r"^RssFile:\s+(\d+)", Path("/proc/self/status").read_text(), re.M).group(1))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssFile from /proc")
def test_reading_releases_the_pages_it_mapped(tmp_path, monkeypatch):
    """Reading a whole 8 MB corpus does not leave it in RSS: every RELEASE_EVERY documents the
    shards' pages are unmapped again (without that, RssFile grows by the corpus's size)."""
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i}: " + "x" * 4000}) + "\n" for i in range(2000)))
    tokens.prepare([path], "bytes", tmp_path / "tok", workers=1, progress=False)
    size_kib = sum(f.stat().st_size for f in (tmp_path / "tok").glob("tokens-*.bin")) // 1024
    for every, grows in ((0, True), (64, False)):
        monkeypatch.setattr(tokens, "RELEASE_EVERY", every)
        c = tokens.open_corpus(tmp_path / "tok", "bytes")
        first = np.array(c.doc(7))
        before = _rss_file_kib()
        total = sum(int(c.doc(i)[-1]) for i in range(c.n_docs))
        grown = _rss_file_kib() - before
        assert total == 256 * c.n_docs and np.array_equal(c.doc(7), first)
        assert (grown > size_kib // 2) == grows, (every, grown, size_kib)
        c.release()
        assert _rss_file_kib() - before < size_kib // 8


def test_train_from_a_token_directory(tmp_path, docs, capsys):
    """`seamkit data prepare`, then `seamkit train --set data.corpus=DIR` (the arm's loader reads the memmaps)."""
    files = write_sources(tmp_path, docs)
    out = tmp_path / "tok"
    assert cli.main(["data", "prepare", "--corpus", *map(str, files), "--tokenizer", "bytes", "--out", str(out),
                     "--workers", "1"]) == 0
    assert f"--set data.corpus={out}" in capsys.readouterr().out
    cfg = data_cfg(tmp_path, out)
    assert isinstance(load_corpus(cfg), tokens.TokenCorpus)
    assert cli.main(["train", "--preset", "tiny", "--max-steps", "3", "--set", f"data.corpus={out}",
                     "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["run_config"]["data"]["corpus"] == str(out)


def test_epochs_and_the_repeat_warning(prepared):
    tc = prepared[0]
    n = tc.n_tokens("train")
    assert epochs(n // 2, tc) == (n // 2) / n
    assert repeat_warning("e2e", n, tc) is None
    msg = repeat_warning("local", 3 * n, tc)
    assert msg.startswith("local: ") and "3.00 epochs" in msg and "repeats data" in msg and "\n" not in msg
    assert tc.summary()["split_tokens"] == {s: tc.n_tokens(s) for s in SPLITS}


def test_token_corpus_errors(tmp_path, prepared):
    root = prepared[0].root
    with pytest.raises(DataError, match="prepared with tokenizer bytes, the config asks for qwen"):
        tokens.open_corpus(root, "qwen")
    with pytest.raises(DataError, match="no meta.json"):
        tokens.open_corpus(tmp_path, "bytes")
    with pytest.raises(DataError, match="output exists and is not an empty directory"):
        tokens.prepare([root / "meta.json"], "bytes", root, progress=False)
    with pytest.raises(DataError, match="a token-file corpus has no single tokens array"):
        prepared[0].tokens
    bad = tmp_path / "cut"
    bad.mkdir()
    for f in root.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    shard = bad / "tokens-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(DataError, match=r"tokens-00001\.bin: \d+ bytes, meta.json says") as e:
        tokens.open_corpus(bad, "bytes")
    assert "\n" not in str(e.value)
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "p.parquet")
    with pytest.raises(DataError, match=r"p\.parquet: no string column 'text' \(columns: body\)"):
        tokens.prepare([tmp_path / "p.parquet"], "bytes", tmp_path / "o1", progress=False)
    (tmp_path / "p.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unknown corpus format"):
        tokens.prepare([tmp_path / "p.csv"], "bytes", tmp_path / "o2", progress=False)
