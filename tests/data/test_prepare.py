"""seamkit.data.prepare: `seamkit data prepare` streams, and a failed or interrupted run leaves nothing."""

import json
import tracemalloc
from pathlib import Path

import pytest

from seamkit import cli
from seamkit.data import prepare as P
from seamkit.data import tokenfiles as tokens
from tests.data.corpora import (
    BROKEN,
    FAULTS,
    broken_file,
    good_bytes,
    lemma_docs,
    one_line_error,
    write_corpus,
)


def test_prepare_streams(tmp_path, monkeypatch):
    """Peak Python/numpy memory while preparing a 7 MB corpus stays under a quarter of it."""
    docs = [f"doc {i}: " + "lorem ipsum dolor sit amet " * 8 for i in range(30_000)]
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    monkeypatch.setattr(P, "CHUNK_CHARS", 1 << 16)
    tracemalloc.start()
    try:
        P.prepare([path], "bytes", tmp_path / "out", workers=1, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < path.stat().st_size / 4, (peak, path.stat().st_size)  # reading it whole would be > 1
    assert tokens.open_corpus(tmp_path / "out", "bytes").n_docs == len(docs)


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("kind, fault", BROKEN)
def test_prepare_fails_in_one_line_and_leaves_nothing(tmp_path, kind, fault, capsys):
    """A good file, then one of every format broken every way its reader can fail (alone where
    the fault is holding no documents, which a file among others may): exit 2, one line naming
    the file, and no output (nor the folders above it, nor a temporary folder); the same command
    on the fixed file then works."""
    good = write_corpus(tmp_path / "good.jsonl", lemma_docs(50))
    bad = broken_file(tmp_path, kind, fault)
    alone = FAULTS[kind][fault] == b"" or fault == "no documents"
    before, out = _listing(tmp_path), tmp_path / "new" / "tok"
    argv = ["data", "prepare", "--corpus", *([] if alone else [str(good)]), str(bad), "--tokenizer", "bytes",
            "--out", str(out), "--workers", "1"]
    assert cli.main(argv) == 2
    assert str(bad) in one_line_error(capsys.readouterr().err, "data")
    assert _listing(tmp_path) == before
    bad.write_bytes(good_bytes(kind, lemma_docs(20, seed=1)))
    assert cli.main(argv) == 0 and tokens.open_corpus(out, "bytes").n_docs == 20 + 50 * (not alone)


def test_prepare_with_workers_leaves_nothing(tmp_path, capsys):
    """The same through a pool of worker processes."""
    good, bad = write_corpus(tmp_path / "good.jsonl", lemma_docs(50)), broken_file(tmp_path, "jsonl.gz", "truncated")
    before = _listing(tmp_path)
    assert cli.main(["data", "prepare", "--corpus", str(good), str(bad), "--tokenizer", "bytes",
                     "--out", str(tmp_path / "tok"), "--workers", "2"]) == 2
    assert str(bad) in one_line_error(capsys.readouterr().err, "data")
    assert _listing(tmp_path) == before


def test_prepare_interrupted_leaves_nothing(tmp_path, monkeypatch, capsys):
    """Ctrl-C after the first chunk is written: exit 130, no output; an empty --out folder stays as it was."""
    good = write_corpus(tmp_path / "good.jsonl", lemma_docs(300))
    (tmp_path / "tok").mkdir()
    monkeypatch.setattr(P, "CHUNK_CHARS", 500)
    write = P._Writer.write

    def interrupted(self, c):
        write(self, c)
        raise KeyboardInterrupt

    monkeypatch.setattr(P._Writer, "write", interrupted)
    before = _listing(tmp_path)
    assert cli.main(["data", "prepare", "--corpus", str(good), "--tokenizer", "bytes", "--out", str(tmp_path / "tok"),
                     "--workers", "1"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert _listing(tmp_path) == before
    monkeypatch.setattr(P._Writer, "write", write)  # the rerun lands in the empty folder
    P.prepare([good], "bytes", tmp_path / "tok", workers=1, progress=False)
    assert tokens.open_corpus(tmp_path / "tok", "bytes").n_docs == 300


@pytest.mark.parametrize("flag, value", [(flag, v) for flag in ("--workers", "--shard-tokens")
                                         for v in ("-1", "-1000")] + [("--shard-tokens", "0")])
def test_prepare_refuses_sizes_out_of_range(tmp_path, capsys, flag, value):
    good = write_corpus(tmp_path / "good.jsonl", lemma_docs(20))
    before = _listing(tmp_path)
    assert cli.main(["data", "prepare", "--corpus", str(good), "--tokenizer", "bytes", "--out", str(tmp_path / "tok"),
                     flag, value]) == 2
    assert f"{flag} must be an integer" in one_line_error(capsys.readouterr().err, "data")
    assert _listing(tmp_path) == before
