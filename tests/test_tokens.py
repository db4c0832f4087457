"""Token files (seamkit.data.tokenfiles): `data prepare`, memory-mapped corpora, and training from them."""

import gzip
import json
import re
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from seamkit import cli
from seamkit.data import tokencheck
from seamkit.data import tokenfiles as tokens
from seamkit.data.corpus import Corpus, tokenize_documents
from seamkit.data.documents import SPLITS, split_documents
from seamkit.data.errors import DataError
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader, epochs, eval_batches, repeat_warning
from seamkit.data.tokenizers import get_tokenizer
from seamkit.data.windows import make_windows
from tests.test_data import (
    BROKEN,
    FAULTS,
    broken_file,
    data_cfg,
    good_bytes,
    lemma_docs,
    one_line_error,
    write_corpus,
)


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


# ----------------------------------------------------------------------------- prepare: failures leave nothing

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
    monkeypatch.setattr(tokens, "CHUNK_CHARS", 500)
    write = tokens._Writer.write

    def interrupted(self, c):
        write(self, c)
        raise KeyboardInterrupt

    monkeypatch.setattr(tokens._Writer, "write", interrupted)
    before = _listing(tmp_path)
    assert cli.main(["data", "prepare", "--corpus", str(good), "--tokenizer", "bytes", "--out", str(tmp_path / "tok"),
                     "--workers", "1"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert _listing(tmp_path) == before
    monkeypatch.setattr(tokens._Writer, "write", write)  # the rerun lands in the empty folder
    tokens.prepare([good], "bytes", tmp_path / "tok", workers=1, progress=False)
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


# ----------------------------------------------------------------------------- a damaged token corpus

def _edit_meta(edit):
    def fault(root: Path):
        meta = json.loads((root / "meta.json").read_text())
        edit(meta)
        (root / "meta.json").write_text(json.dumps(meta))
    return fault


def _write_meta_text(text):
    return lambda root: (root / "meta.json").write_text(text)


def _del(path: tuple):
    def edit(meta):
        for key in path[:-1]:
            meta = meta[key]
        del meta[path[-1]]
    return _edit_meta(edit)


def _set(path: tuple, value):
    def edit(meta):
        for key in path[:-1]:
            meta = meta[key]
        meta[path[-1]] = value
    return _edit_meta(edit)


def _wrong_type(kind):
    return "seven" if kind is not str else 7


def _resize(name: str, items: int):
    """Cut one element off a file (items=-1) or add one (items=1)."""
    def fault(root: Path):
        path = root / name
        meta = json.loads((root / "meta.json").read_text())
        size = np.dtype(tokens.PER_DOC.get(name.removesuffix(".bin"), np.int64 if name.startswith("split")
                                           else meta["dtype"])).itemsize
        data = path.read_bytes()
        path.write_bytes(data[:len(data) - size] if items < 0 else data + data[-size:])
    return fault


def _flip(name: str):
    def fault(root: Path):
        data = bytearray((root / name).read_bytes())
        data[len(data) // 2] ^= 1
        (root / name).write_bytes(bytes(data))
    return fault


def _sealed(name: str, change):
    """Change the array in `name`, then write the checksums prepare would have written for it:
    what the consistency checks alone must catch."""
    def fault(root: Path):
        meta = json.loads((root / "meta.json").read_text())
        dt = tokens.PER_DOC.get(name.removesuffix(".bin"), np.int64)
        a = np.fromfile(root / name, dt)
        change(a, meta, root)
        a.tofile(root / name)
        meta["checksums"][name] = tokencheck.sha256_file(root / name)
        (root / "meta.json").write_text(json.dumps(meta))
    return fault


def _past_the_shard(a, meta, root):
    a[meta["shards"][1]["first_doc"]] += 1  # the last document of shard 0 ends inside shard 1


def _split_past_the_end(a, meta, root):
    a[-1] = meta["documents"]


def _in_two_splits(a, meta, root):
    """val's first document replaced by the train document before it, val's tokens kept right."""
    lens, train = np.diff(np.fromfile(root / "offsets.bin", np.int64)), np.fromfile(root / "split-train.bin", np.int64)
    t = int(train[train < a[0]][-1])
    meta["splits"]["val"]["tokens"] += int(lens[t] - lens[a[0]])
    a[0] = t


def _token_faults() -> list[tuple[str, str, object]]:
    """(fault, the file the error must name, what breaks a copy of a good token folder), from the
    fields tokencheck declares and the files a token folder holds."""
    faults = [("no meta.json", "", lambda root: (root / "meta.json").unlink()),
              ("meta.json empty", "meta.json", _write_meta_text("")),
              ("meta.json not JSON", "meta.json", _write_meta_text("{")),
              ("meta.json a list", "meta.json", _write_meta_text("[]")),
              ("meta.json of format 1", "meta.json", _set(("format",), 1)),
              ("dtype not the tokenizer's", "meta.json", _set(("dtype",), "uint32")),
              ("an unknown tokenizer", "meta.json", _set(("tokenizer",), "gpt2")),
              ("a shard outside the folder", "meta.json", _set(("shards", 0, "file"), "../tokens-00000.bin"))]
    for name, kind in tokencheck.META_FIELDS.items():
        faults += [(f"meta without {name}", "meta.json", _del((name,))),
                   (f"meta {name} of another type", "meta.json", _set((name,), _wrong_type(kind)))]
    for name, kind in tokencheck.SHARD_FIELDS.items():
        faults += [(f"shard without {name}", "meta.json", _del(("shards", 1, name))),
                   (f"shard {name} of another type", "meta.json", _set(("shards", 1, name), _wrong_type(kind)))]
    for s in SPLITS:
        faults.append((f"splits without {s}", "meta.json", _del(("splits", s))))
        for name in tokencheck.SPLIT_FIELDS:
            faults += [(f"split {s} without {name}", "meta.json", _del(("splits", s, name))),
                       (f"split {s} {name} negative", "meta.json", _set(("splits", s, name), -1))]
    for name in tokencheck.checked_files():
        faults += [(f"checksums without {name}", "meta.json", _del(("checksums", name))),
                   (f"{name} changed", name, _flip(name))]
    for name in [*tokencheck.checked_files(), "tokens-00000.bin"]:
        faults += [(f"{name} missing", name, lambda root, name=name: (root / name).unlink()),
                   (f"{name} one element short", name, _resize(name, -1)),
                   (f"{name} one element long", name, _resize(name, 1))]
    faults += [
        ("offsets past the shard", "offsets.bin", _sealed("offsets.bin", _past_the_shard)),
        ("offsets that shrink", "offsets.bin", _sealed("offsets.bin", lambda a, m, r: a.__setitem__(5, a[4]))),
        ("offsets not from 0", "offsets.bin", _sealed("offsets.bin", lambda a, m, r: a.__setitem__(0, 1))),
        ("offsets past the tokens", "offsets.bin", _sealed("offsets.bin", lambda a, m, r: a.__setitem__(-1, a[-1] + 1))),
        ("a prompt longer than its document", "prompt_len.bin",
         _sealed("prompt_len.bin", lambda a, m, r: a.__setitem__(3, 10_000))),
        ("a negative word count", "words.bin", _sealed("words.bin", lambda a, m, r: a.__setitem__(0, -1))),
        ("a split index past the documents", "split-train.bin", _sealed("split-train.bin", _split_past_the_end)),
        ("a split out of order", "split-train.bin", _sealed("split-train.bin", lambda a, m, r: a.__setitem__(0, a[1]))),
        ("a document in two splits", "", _sealed("split-val.bin", _in_two_splits)),
        ("split tokens that disagree", "split-val.bin", _set(("splits", "val", "tokens"), 1)),
        ("shards that do not follow each other", "offsets.bin", _set(("shards", 1, "first_doc"), 1)),
        ("documents that the shards do not hold", "meta.json", _edit_meta(lambda m: m["shards"].pop())),
    ]
    return faults


TOKEN_FAULTS = _token_faults()


@pytest.fixture(scope="module")
def token_dir(prepared):
    """A good token folder of several shards, to copy and break."""
    return prepared[0].root


def _broken_copy(token_dir: Path, tmp_path: Path, fault) -> Path:
    root = tmp_path / "tok"
    shutil.copytree(token_dir, root)
    fault(root)
    return root


@pytest.mark.parametrize("fault, names, breaks", TOKEN_FAULTS, ids=[f[0] for f in TOKEN_FAULTS])
def test_damaged_token_corpus_is_one_line(token_dir, tmp_path, capsys, fault, names, breaks):
    """Every way a token folder can be damaged: open_corpus raises one DataError line naming the
    file, and `seamkit train --set data.corpus=DIR` exits 2 on that line, before any step."""
    root = _broken_copy(token_dir, tmp_path, breaks)
    with pytest.raises(DataError) as e:
        tokens.open_corpus(root, "bytes")
    msg = str(e.value)
    assert "\n" not in msg and str(root / names if names else root) in msg, msg
    out = tmp_path / "run"
    code = cli.main(["train", "--preset", "tiny", "--max-steps", "1", "--threads", "1",
                     "--set", f"data.corpus={root}", "--out", str(out)])
    assert code == 2 and one_line_error(capsys.readouterr().err, "train").endswith(msg)
    assert not out.exists()


def test_full_check_reads_the_shards(token_dir, tmp_path):
    """Every open checks the shards' sizes only; `full=True` reads them: a changed shard fails
    on its SHA-256, and a token id past the vocabulary fails even under a matching SHA-256."""
    tokens.open_corpus(token_dir, "bytes", full=True)
    root = _broken_copy(token_dir, tmp_path / "a", _flip("tokens-00001.bin"))
    tokens.open_corpus(root, "bytes")
    with pytest.raises(DataError, match=r"tokens-00001\.bin: SHA-256 differs"):
        tokens.open_corpus(root, "bytes", full=True)

    def past_the_vocab(root):
        shard = np.fromfile(root / "tokens-00002.bin", np.uint16)
        shard[7] = 258
        shard.tofile(root / "tokens-00002.bin")
        _set(("shards", 2, "sha256"), tokencheck.sha256_file(root / "tokens-00002.bin"))(root)

    root = _broken_copy(token_dir, tmp_path / "b", past_the_vocab)
    with pytest.raises(DataError, match=r"tokens-00002\.bin: token id 258 is outside the tokenizer's 258 ids"):
        tokens.open_corpus(root, "bytes", full=True)


# ----------------------------------------------------------------------------- prune-check on another corpus

@pytest.fixture(scope="module")
def token_checkpoint(tmp_path_factory, token_dir):
    """A tiny checkpoint trained (notionally) on the token folder."""
    from seamkit import checkpoint
    from seamkit import config as C
    from seamkit.model import GPT
    cfg = C.override(C.tiny(), {"data.corpus": str(token_dir)})
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ck") / "tiny.pt"
    checkpoint.save(path, GPT(cfg.model), None, cfg)
    return path


def _prune_check(ckpt, out, *sets):
    return cli.main(["prune-check", "--preset", "tiny", "--checkpoint", str(ckpt), "--windows", "1", "--samples", "1",
                     "--reference", "eager", "--threads", "1", "--set", "prune.warmup=0",
                     *[a for s in sets for a in ("--set", s)], "--out", str(out)])


def test_prune_check_reads_the_corpus_the_command_names(token_checkpoint, token_dir, tmp_path, capsys):
    """`--set data.corpus=OTHER` evaluates the checkpoint on OTHER (same tokenizer) and the report
    says so; a damaged OTHER fails in one line; OTHER of another tokenizer is refused in one line."""
    other = write_corpus(tmp_path / "other.jsonl", lemma_docs(200, seed=7))
    out = tmp_path / "r.json"
    assert _prune_check(token_checkpoint, out, f"data.corpus={other}", f"data.cache_dir={tmp_path / 'cache'}") == 0
    assert json.loads(out.read_text())["config"]["data"]["corpus"] == str(other)
    capsys.readouterr()

    no_meta = _broken_copy(token_dir, tmp_path / "a", lambda root: (root / "meta.json").unlink())
    for key in ("data.corpus", "corpus"):  # the bare key names the same field
        assert _prune_check(token_checkpoint, tmp_path / "new" / "x.json", f"{key}={no_meta}") == 2
        assert f"{no_meta}: not a token corpus (no meta.json" in one_line_error(capsys.readouterr().err, "prune-check")
        assert not (tmp_path / "new").exists()  # the folder the output check made went with the error

    qwen = tmp_path / "qwen"
    tokens.prepare([write_corpus(tmp_path / "q.jsonl", lemma_docs(5))], "qwen", qwen, workers=1, progress=False)
    assert _prune_check(token_checkpoint, tmp_path / "x.json", f"data.corpus={qwen}") == 2
    err = one_line_error(capsys.readouterr().err, "prune-check")
    assert f"corpus {qwen} was prepared with tokenizer qwen, the checkpoint reads bytes" in err
    assert not (tmp_path / "x.json").exists()
