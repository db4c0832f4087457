"""Tests for seamkit.data: tokenizers, corpus files, the split, the cache, rows and windows."""

import dataclasses
import gzip
import json
import random
from collections import Counter

import numpy as np
import pytest
import torch

from seamkit import config
from seamkit.cli import main as cli_main
from seamkit.data import documents
from seamkit.data.corpus import Corpus
from seamkit.data.documents import SPLITS, load_documents, split_documents
from seamkit.data.errors import DataError
from seamkit.data.load import load_corpus
from seamkit.data.rows import RowLoader, eval_batches
from seamkit.data.tokenizers import get_tokenizer
from seamkit.data.windows import Window, make_windows
from seamkit.model import IGNORE

TEXTS = ["plain ascii", "héllo wörld — naïve café, 日本語, emoji 🙂🚀", "tab\tand\nnewline",
         "a literal <|endoftext|> and <|im_start|> stay text", ""]


# ----------------------------------------------------------------------------- helpers

def lemma_docs(n: int, seed: int = 0) -> list[str]:
    """`lemma: gloss` documents of varied length, some without ':' (prompt_len 0)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "délta", "epsilon", "zeta", "eta", "thêta", "iota", "kappa"]
    docs = []
    for i in range(n):
        gloss = " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
        docs.append(gloss if i % 7 == 3 else f"lemma {i}: {gloss}")
    return docs


def write_corpus(path, docs):
    if path.name.endswith(".jsonl"):
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    else:
        path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def data_cfg(tmp_path, corpus, tokenizer="bytes") -> config.DataConfig:
    return dataclasses.replace(config.tiny().data, corpus=str(corpus), tokenizer=tokenizer,
                               cache_dir=str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path):
    """A 400-document bytes corpus (about 4 val and 4 test documents)."""
    return load_corpus(data_cfg(tmp_path, write_corpus(tmp_path / "c.jsonl", lemma_docs(400))))


def window_faults(w: Window, corpus: Corpus, policy: str, window_positions: int) -> list[str]:
    """Every packing invariant a window must satisfy; returns the violated ones."""
    faults = []
    if w.positions != len(w.idx) or w.positions > window_positions:
        faults.append("size")
    if w.documents != len(w.doc_ids) or w.doc.unique().tolist() != list(range(w.documents)):
        faults.append("doc numbering")
    whole = torch.cat([torch.from_numpy(corpus.doc(i).astype(np.int64)) for i in w.doc_ids])
    if not torch.equal(w.idx, whole):
        faults.append("documents not whole")
    for j in range(w.documents):
        sel = w.doc == j
        L = int(sel.sum())
        if not torch.equal(w.pos[sel], torch.arange(L)):
            faults.append("pos does not restart at 0")
        expect_next = torch.cat([w.idx[sel][1:], torch.tensor([IGNORE])])
        if not torch.equal(w.next[sel], expect_next):
            faults.append("next crosses a document")
        if policy == "completion":
            first = int(corpus.prompt_len[w.doc_ids[j]])
            expect = (torch.arange(1, L + 1) >= first) & (expect_next != IGNORE)
            if not torch.equal(w.loss_mask[sel], expect):
                faults.append("completion mask")
    if policy == "all" and not torch.equal(w.loss_mask, w.next != IGNORE):
        faults.append("all mask")
    if (w.loss_mask & (w.next == IGNORE)).any():
        faults.append("mask scores a missing target")
    if not torch.equal(w.targets, torch.where(w.loss_mask, w.next, IGNORE)):
        faults.append("targets")
    if w.words != int(corpus.words[w.doc_ids].sum()):
        faults.append("words")
    return faults


# ----------------------------------------------------------------------------- tokenizers

@pytest.mark.parametrize("name", ["bytes", "qwen"])
def test_tokenizer_round_trip(name):
    tok = get_tokenizer(name)
    assert tok is get_tokenizer(name)  # one shared instance
    assert tok.n_vocab == config.tokenizer_vocab(name)
    assert 0 <= tok.eod < tok.n_vocab and 0 <= tok.pad < tok.n_vocab and tok.eod != tok.pad
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert tok.eod not in ids and tok.pad not in ids
        assert all(0 <= i < tok.n_vocab for i in ids)
    # eod and pad decode to nothing the text could be confused with
    assert tok.decode(tok.encode("ab") + [tok.pad]).startswith("ab")


def test_qwen_ids():
    tok = get_tokenizer("qwen")
    assert (tok.eod, tok.pad, tok.n_vocab) == (151643, 151935, 151936)
    assert tok.encode("<|endoftext|>") != [tok.eod]
    assert tok.decode([tok.eod]) == "<|endoftext|>"  # the special id itself still decodes


def test_unknown_tokenizer():
    with pytest.raises(DataError, match="unknown tokenizer"):
        get_tokenizer("gpt2")


# ----------------------------------------------------------------------------- documents

def test_load_txt_and_jsonl(tmp_path):
    txt = "first: doc\nstill first\n\n\n  \nsecond: doc  \n\n\t\nthird\n"
    expect = ["first: doc\nstill first", "second: doc", "third"]
    (tmp_path / "a.txt").write_text(txt)
    with gzip.open(tmp_path / "a.txt.gz", "wt") as f:
        f.write(txt)
    jsonl = '{"text": "first: doc\\nstill first"}\n\n{"text": "second: doc", "id": 2}\n{"text": "third"}\n'
    (tmp_path / "a.jsonl").write_text(jsonl)
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write(jsonl)
    assert load_documents(str(tmp_path / "a.txt")) == expect
    assert load_documents(str(tmp_path / "a.txt.gz")) == expect
    assert load_documents(str(tmp_path / "a.jsonl")) == expect
    assert load_documents(str(tmp_path / "a.jsonl.gz")) == expect


# Every format a corpus file can have (documents.corpus_kind), and every way its reader can fail:
# FAULTS[kind] maps a fault to the bytes of a broken file of that kind, made from a good one.
FORMATS = ("txt", "txt.gz", "jsonl", "jsonl.gz", "parquet")


def good_bytes(kind: str, docs: list[str]) -> bytes:
    """A corpus file of `kind` holding `docs`."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    if kind == "parquet":
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": docs}), buf)
        return buf.getvalue()
    text = ("\n\n".join(docs) + "\n" if kind.startswith("txt")
            else "".join(json.dumps({"text": d}) + "\n" for d in docs))
    return gzip.compress(text.encode()) if kind.endswith(".gz") else text.encode()


def _parquet(table) -> bytes:
    import io

    import pyarrow.parquet as pq
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _faults(kind: str) -> dict[str, bytes]:
    import pyarrow as pa
    docs = lemma_docs(40)
    good = good_bytes(kind, docs)
    gz = kind.endswith(".gz")
    plain = gzip.decompress(good) if gz else good
    wrap = gzip.compress if gz else (lambda b: b)
    out = {"empty file": b"", "not this format": bytes(range(256)) * 4}  # neither UTF-8, gzip nor parquet
    if kind != "txt":  # a cut .txt is a shorter corpus, not a broken one
        out["truncated"] = good[:len(good) // 2] if kind != "jsonl" else good[:-5]
    if gz:
        out["not gzipped"] = plain
        out["no documents"] = gzip.compress(b"\n \n\n")
    if kind == "parquet":
        out["no documents"] = _parquet(pa.table({"text": pa.array([], pa.string())}))
        out["no text column"] = _parquet(pa.table({"body": docs}))
        out["text not a string column"] = _parquet(pa.table({"text": list(range(len(docs)))}))
    else:
        out["no documents"] = wrap(b"\n \n\n")
        out["not UTF-8"] = wrap(plain[:50] + b"\xff\xfe" + plain[50:])
    if kind.startswith("jsonl"):
        lines = plain.splitlines(keepends=True)
        out["a line that is not JSON"] = wrap(b"".join(lines[:3] + [b"{oops}\n"] + lines[3:]))
        out["a line without text"] = wrap(b"".join(lines[:3] + [b'{"body": "b"}\n'] + lines[3:]))
        out["text not a string"] = wrap(b"".join(lines[:3] + [b'{"text": 7}\n'] + lines[3:]))
        out["a line that is a list"] = wrap(b"".join(lines[:3] + [b'["a"]\n'] + lines[3:]))
    return out


FAULTS = {kind: _faults(kind) for kind in FORMATS}
BROKEN = [(kind, fault) for kind in FORMATS for fault in FAULTS[kind]]


def broken_file(tmp_path, kind: str, fault: str):
    path = tmp_path / f"corpus.{kind}"
    path.write_bytes(FAULTS[kind][fault])
    return path


def one_line_error(err: str, command: str) -> str:
    """The error line of a failed command, after checking stderr holds nothing else that counts:
    no traceback and at most three lines (a progress bar that was cleared is not one)."""
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert "Traceback" not in err and lines and len(err.strip().splitlines()) <= 3, err
    assert lines[-1].startswith(f"seamkit {command}: error: "), err
    return lines[-1]


def test_every_format_reads(tmp_path):
    """The good file of each format holds its documents: what FAULTS breaks is a working file."""
    docs = lemma_docs(40)
    for kind in FORMATS:
        path = tmp_path / f"ok.{kind}"
        path.write_bytes(good_bytes(kind, docs))
        assert documents.corpus_kind(path) == kind.removesuffix(".gz")
        assert load_documents(str(path)) == docs


@pytest.mark.parametrize("kind, fault", BROKEN)
def test_broken_corpus_file_is_one_line(tmp_path, kind, fault):
    """Every format, broken every way its reader can fail: one DataError line naming the file."""
    path = broken_file(tmp_path, kind, fault)
    with pytest.raises(DataError) as e:
        load_documents(str(path))
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kind, fault", BROKEN)
def test_train_on_a_broken_corpus_file(tmp_path, kind, fault, capsys):
    """`seamkit train --set data.corpus=FILE`: exit 2, one line naming the file, nothing written."""
    path, out = broken_file(tmp_path, kind, fault), tmp_path / "run"
    code = cli_main(["train", "--preset", "tiny", "--max-steps", "1", "--threads", "1", "--set",
                     f"data.corpus={path}", "--set", f"data.cache_dir={tmp_path / 'cache'}", "--out", str(out)])
    assert code == 2 and str(path) in one_line_error(capsys.readouterr().err, "train")
    assert not out.exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("name, content, match", [
    ("corpus.csv", "a,b\n", "unknown corpus format"),
    ("corpus.parquet.gz", "x", "unknown corpus format"),
    ("missing.txt", None, "no such corpus file"),
])
def test_bad_corpus_names_the_file(tmp_path, name, content, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=match) as e:
        load_documents(str(path))
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_load_corpus_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such corpus file"):
        load_corpus(data_cfg(tmp_path, tmp_path / "nope.txt"))


def test_shipped_wordnet():
    docs = load_documents("wordnet")
    assert len(docs) == 117659  # 82115 noun + 13767 verb + 18156 adj + 3621 adv synsets
    assert docs[0].startswith("entity: that which is perceived")
    assert all(": " in d and "_" not in d.split(":", 1)[0] for d in docs)
    sizes = {s: len(v) for s, v in split_documents(docs).items()}
    assert sizes == {"train": 115325, "val": 1167, "test": 1167}


def test_shipped_corpus_behind_a_link_git_wrote_as_text(tmp_path, monkeypatch):
    """A checkout without symlinks holds the link as a text file naming its target: data/ is read."""
    corpora, data_dir = tmp_path / "corpora", tmp_path / "data"
    corpora.mkdir()
    data_dir.mkdir()
    monkeypatch.setattr(documents, "CORPORA_DIR", corpora)
    monkeypatch.setattr(documents, "DATA_DIR", data_dir)
    with gzip.open(data_dir / "c.jsonl.gz", "wt") as f:
        f.write('{"text": "a: b"}\n')
    assert documents._shipped("c.jsonl.gz") == data_dir / "c.jsonl.gz"  # no file inside the package
    (corpora / "c.jsonl.gz").write_text("../../data/c.jsonl.gz")  # what git writes for the link
    assert documents._shipped("c.jsonl.gz") == data_dir / "c.jsonl.gz"
    assert load_documents(documents._shipped("c.jsonl.gz")) == ["a: b"]
    (corpora / "c.jsonl.gz").unlink()
    (corpora / "c.jsonl.gz").write_bytes((data_dir / "c.jsonl.gz").read_bytes())  # a wheel's copy
    assert documents._shipped("c.jsonl.gz") == corpora / "c.jsonl.gz"


# ----------------------------------------------------------------------------- split

def test_split_deterministic_disjoint_and_content_based():
    docs = [f"doc {i}: {i * 7919 % 1000}" for i in range(5000)]
    s = split_documents(docs)
    assert s == split_documents(list(docs))
    all_ids = s["train"] + s["val"] + s["test"]
    assert sorted(all_ids) == list(range(5000))  # disjoint and complete
    for ids in s.values():
        assert ids == sorted(ids)
    # about 1% each: the hash makes each count Binomial(5000, 0.01), sd 7, so 20..80 is > 4 sd
    assert 20 <= len(s["val"]) <= 80 and 20 <= len(s["test"]) <= 80
    # the split follows the text, not the position
    rev = split_documents(docs[::-1])
    for name in s:
        assert sorted(4999 - i for i in rev[name]) == s[name]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 10, 99, 100, 150])
def test_split_tiny_corpora(n):
    s = split_documents([f"d{i}" for i in range(n)])
    assert sorted(s["train"] + s["val"] + s["test"]) == list(range(n))
    if n >= 3:
        assert len(s["val"]) >= 1 and len(s["test"]) >= 1 and len(s["train"]) >= 1
    else:
        assert s["train"] == list(range(n))


# ----------------------------------------------------------------------------- corpus and cache

@pytest.mark.parametrize("tokenizer", ["bytes", "qwen"])
def test_corpus_layout(tmp_path, tokenizer):
    docs = lemma_docs(60) + ["no colon here", "two: colons: here", "<|endoftext|>: literal"]
    cfg = data_cfg(tmp_path, write_corpus(tmp_path / "c.jsonl", docs), tokenizer)
    c = load_corpus(cfg)
    tok = c.tokenizer
    assert c.name == "c" and c.n_docs == len(docs) and tok is get_tokenizer(tokenizer)
    assert c.tokens.dtype == np.int32 and c.offsets.dtype == np.int64
    assert c.prompt_len.dtype == np.int32 and c.words.dtype == np.int32
    assert c.offsets[0] == 0 and c.offsets[-1] == len(c.tokens)
    for i, text in enumerate(docs):
        k = text.find(":") + 1
        prompt = tok.encode(text[:k]) if k else []
        assert c.doc(i).tolist() == prompt + tok.encode(text[k:]) + [tok.eod]
        assert c.prompt_len[i] == len(prompt)
        assert c.words[i] == len(text.split())
        assert tok.decode(c.doc(i)[:-1]) == text
        assert (c.doc(i) == tok.eod).sum() == 1  # the literal "<|endoftext|>" is not eod
    assert c.prompt_len[docs.index("no colon here")] == 0
    split = split_documents(docs)
    for name in SPLITS:
        assert c.splits[name].dtype == np.int64 and c.splits[name].tolist() == split[name]


def test_cache_hit_skips_tokenizing(tmp_path, monkeypatch):
    path = write_corpus(tmp_path / "c.txt", lemma_docs(50))
    cfg = data_cfg(tmp_path, path)
    first = load_corpus(cfg)

    def boom(text):
        raise AssertionError("tokenized again despite the cache")
    monkeypatch.setattr(get_tokenizer("bytes"), "encode", boom)
    second = load_corpus(cfg)
    for f in ("tokens", "offsets", "prompt_len", "words"):
        assert np.array_equal(getattr(first, f), getattr(second, f))
    assert all(np.array_equal(first.splits[s], second.splits[s]) for s in SPLITS)
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.suffix != ".npz"] == []  # no tmp left

    write_corpus(path, lemma_docs(51))  # edited corpus -> new key -> tokenized again
    with pytest.raises(AssertionError, match="tokenized again"):
        load_corpus(cfg)


def test_damaged_cache_is_rebuilt(tmp_path):
    cfg = data_cfg(tmp_path, write_corpus(tmp_path / "c.txt", lemma_docs(20)))
    first = load_corpus(cfg)
    (cache,) = (tmp_path / "cache").glob("*.npz")
    cache.write_bytes(cache.read_bytes()[:100])
    assert np.array_equal(load_corpus(cfg).tokens, first.tokens)


# ----------------------------------------------------------------------------- rows

def test_row_loader_shapes_shift_and_determinism(corpus):
    B, T = 3, 16
    a = RowLoader(corpus, "train", B, T, seed=1)
    b = RowLoader(corpus, "train", B, T, seed=1)
    c = RowLoader(corpus, "train", B, T, seed=2)
    xa, ya = a.next()
    assert xa.shape == ya.shape == (B, T) and xa.dtype == ya.dtype == torch.int64
    assert torch.equal(ya[:, :-1], xa[:, 1:])  # y is x shifted by one ...
    assert torch.equal(ya[:-1, -1], xa[1:, 0])  # ... along one consecutive stream
    xb, yb = b.next()
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(xa, c.next()[0])
    # the next batch starts where this one's x ended
    x2, _ = a.next()
    assert x2[0, 0] == ya[-1, -1]


def test_row_loader_epoch_is_a_permutation_of_the_split(corpus):
    ids = corpus.splits["train"]
    L = int((corpus.offsets[ids + 1] - corpus.offsets[ids]).sum())
    loader = RowLoader(corpus, "train", 1, 1, seed=0)
    stream = np.concatenate([corpus.doc(i) for i in loader._order(0)])
    assert len(stream) == L and Counter(stream.tolist()) == Counter(
        np.concatenate([corpus.doc(i) for i in ids]).tolist())
    assert not np.array_equal(loader._order(0), loader._order(1))  # a new order each epoch
    B, T = 4, 64  # read past the end of epoch 0: the stream runs on into epoch 1
    loader = RowLoader(corpus, "train", B, T, seed=0)
    got = np.concatenate([loader.next()[0].flatten().numpy() for _ in range(L // (B * T) + 2)])
    ref = np.concatenate([stream, np.concatenate([corpus.doc(i) for i in loader._order(1)])])
    assert np.array_equal(got, ref[:len(got)])
    assert loader.state_dict()["epoch"] == 1


def test_row_loader_resume(corpus):
    a = RowLoader(corpus, "train", 2, 32, seed=3)
    for _ in range(5):
        a.next()
    state = a.state_dict()
    assert set(state) == {"epoch", "position"} and all(type(v) is int for v in state.values())
    expect = a.next()
    b = RowLoader(corpus, "train", 2, 32, seed=3)
    b.load_state_dict(state)
    got = b.next()
    assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1])
    with pytest.raises(DataError, match="does not fit"):
        b.load_state_dict({"epoch": 0, "position": 10 ** 9})


def test_tiny_split_repeats_and_empty_split_errors(tmp_path):
    c = load_corpus(data_cfg(tmp_path, write_corpus(tmp_path / "t.txt", ["a: x", "b: yy", "c: zzz"])))
    assert all(len(c.splits[s]) == 1 for s in SPLITS)
    x, y = RowLoader(c, "val", 4, 32, seed=0).next()  # 129 tokens from a 5-token split
    doc = torch.from_numpy(c.doc(int(c.splits["val"][0])).astype(np.int64))
    assert torch.equal(x.flatten()[:2 * len(doc)], doc.repeat(2))
    assert len(eval_batches(c, "test", 4, 32, n=3)) == 3

    two = load_corpus(data_cfg(tmp_path, write_corpus(tmp_path / "two.txt", ["a: x", "b: y"])))
    with pytest.raises(DataError, match="split 'val' is empty"):
        RowLoader(two, "val", 1, 4, seed=0)
    with pytest.raises(DataError, match="split 'test' is empty"):
        eval_batches(two, "test", 1, 4, n=1)
    with pytest.raises(DataError, match="unknown split"):
        eval_batches(two, "dev", 1, 4, n=1)


def test_eval_batches_fixed(corpus):
    a = eval_batches(corpus, "val", 2, 16, n=4)
    b = eval_batches(corpus, "val", 2, 16, n=4)
    assert len(a) == 4 and all(x.shape == y.shape == (2, 16) for x, y in a)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    ids = corpus.splits["val"]
    stream = np.concatenate([corpus.doc(i) for i in ids] * 3)  # index order, repeated
    got = np.concatenate([x.flatten().numpy() for x, _ in a])
    assert np.array_equal(got, stream[:len(got)])
    assert all(torch.equal(y[:, :-1], x[:, 1:]) for x, y in a)


# ----------------------------------------------------------------------------- windows

@pytest.mark.parametrize("policy", ["all", "completion", "random:0.5"])
def test_window_invariants(corpus, policy):
    W = 256
    windows = make_windows(corpus, "train", W, policy, n=6)
    assert len(windows) == 6
    for w in windows:
        assert window_faults(w, corpus, policy, W) == []
        assert w.idx.dtype == w.next.dtype == w.targets.dtype == w.doc.dtype == w.pos.dtype == torch.int64
        assert w.loss_mask.dtype == torch.bool
    # greedy and in index order: the windows hold a prefix of the split, each one as full as it can be
    packed = [i for w in windows for i in w.doc_ids]
    ids = corpus.splits["train"].tolist()
    assert packed == ids[:len(packed)]
    nxt = ids[len(packed)]
    for w, following in zip(windows, [w.doc_ids[0] for w in windows[1:]] + [nxt]):
        assert w.positions + len(corpus.doc(following)) > W


def test_window_checker_catches_planted_faults(corpus):
    (w,) = make_windows(corpus, "train", 256, "completion", n=1)
    assert w.documents >= 2
    crossing = dataclasses.replace(w, next=w.next.clone())
    crossing.next[int((w.doc == 0).sum()) - 1] = w.idx[int((w.doc == 0).sum())]  # into the next doc
    assert "next crosses a document" in window_faults(crossing, corpus, "completion", 256)
    prompt = dataclasses.replace(w, loss_mask=w.next != IGNORE)
    assert "completion mask" in window_faults(prompt, corpus, "completion", 256)
    shifted = dataclasses.replace(w, pos=torch.arange(w.positions))
    assert "pos does not restart at 0" in window_faults(shifted, corpus, "completion", 256)


def test_completion_mask_excludes_prompt(corpus):
    (w,) = make_windows(corpus, "train", 512, "completion", n=1)
    for j, i in enumerate(w.doc_ids):
        sel = w.doc == j
        scored = w.pos[sel][w.loss_mask[sel]] + 1  # indices within the document of the scored targets
        L, k = len(corpus.doc(i)), int(corpus.prompt_len[i])
        assert scored.tolist() == list(range(max(k, 1), L))  # every gloss token and eod, no prompt token
    assert (corpus.prompt_len[w.doc_ids] == 0).any() and (corpus.prompt_len[w.doc_ids] > 0).any()


def test_random_policy_seeded(corpus):
    a = make_windows(corpus, "train", 1024, "random:0.3", n=3, seed=0)
    b = make_windows(corpus, "train", 1024, "random:0.3", n=3, seed=0)
    c = make_windows(corpus, "train", 1024, "random:0.3", n=3, seed=1)
    assert all(torch.equal(x.loss_mask, y.loss_mask) for x, y in zip(a, b))
    assert not torch.equal(a[0].loss_mask, c[0].loss_mask)
    assert not torch.equal(a[0].loss_mask[:500], a[1].loss_mask[:500])  # a new draw per window
    assert [w.doc_ids for w in a] == [w.doc_ids for w in c]  # the seed only moves the mask
    kept = sum(int(w.loss_mask.sum()) for w in a) / sum(int((w.next != IGNORE).sum()) for w in a)
    assert 0.25 < kept < 0.35  # ~3000 Bernoulli(0.3) draws: sd 0.008, so this is > 6 sd
    full = make_windows(corpus, "train", 1024, "random:1", n=1)[0]
    assert torch.equal(full.loss_mask, full.next != IGNORE)


def test_window_errors(corpus):
    longest = int(np.argmax(np.diff(corpus.offsets)[corpus.splits["train"]]))
    L = len(corpus.doc(corpus.splits["train"][longest]))
    with pytest.raises(DataError, match=f"window_positions={L - 1} is too small for document .* of {L} tokens"):
        make_windows(corpus, "train", L - 1, "all", n=10 ** 6)
    with pytest.raises(DataError, match="fills only"):
        make_windows(corpus, "val", 10 ** 6, "all", n=2)
    with pytest.raises(config.ConfigError):
        make_windows(corpus, "val", 512, "random:2", n=1)
