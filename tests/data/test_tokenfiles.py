"""seamkit.data.tokenfiles: token folders read through np.memmap, as the in-memory corpus reads
the same documents, and training from one."""

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seamkit import cli
from seamkit.data import prepare as P
from seamkit.data import tokenfiles as tokens
from seamkit.data.documents import SPLITS
from seamkit.data.errors import DataError
from tests.data.corpora import in_memory, write_sources


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


def _rss_file_kib() -> int:
    return int(re.search(r"^RssFile:\s+(\d+)", Path("/proc/self/status").read_text(), re.MULTILINE).group(1))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssFile from /proc")
def test_reading_releases_the_pages_it_mapped(tmp_path, monkeypatch):
    """Reading a whole 8 MB corpus does not leave it in RSS: every RELEASE_EVERY documents the
    shards' pages are unmapped again (without that, RssFile grows by the corpus's size).

    Planted fault this catches: `release` never called (RELEASE_EVERY 0 is that fault, and the
    first half of the test shows it)."""
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i}: " + "x" * 4000}) + "\n" for i in range(2000)))
    P.prepare([path], "bytes", tmp_path / "tok", workers=1, progress=False)
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
    assert cli.main(["train", "--preset", "tiny", "--max-steps", "3", "--set", f"data.corpus={out}",
                     "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["run_config"]["data"]["corpus"] == str(out)


def test_token_corpus_errors(tmp_path, prepared):
    root = prepared[0].root
    with pytest.raises(DataError, match="prepared with tokenizer bytes, the config asks for qwen"):
        tokens.open_corpus(root, "qwen")
    with pytest.raises(DataError, match="no meta.json"):
        tokens.open_corpus(tmp_path, "bytes")
    with pytest.raises(DataError, match="output exists and is not an empty directory"):
        tokens.prepare([root / "meta.json"], "bytes", root, progress=False)
    with pytest.raises(DataError, match="a token-file corpus has no single tokens array"):
        prepared[0].tokens  # noqa: B018 -- the property raises
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
