"""Corpus files for the data tests (and the pruning study's): documents of varied shapes, every
format a corpus file can have, and every way each format's reader can fail."""

import dataclasses
import gzip
import io
import json
import random

import numpy as np

from seamkit import config
from seamkit.data.corpus import Corpus, tokenize_documents
from seamkit.data.documents import split_documents
from seamkit.data.tokenizers import get_tokenizer


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


def in_memory(docs) -> Corpus:
    """What load_corpus builds from the same documents in one file."""
    tok = get_tokenizer("bytes")
    arrays = tokenize_documents(docs, tok)
    return Corpus(name="mem", tokenizer=tok, tokens=arrays["tokens"], offsets=arrays["offsets"],
                  prompt_len=arrays["prompt_len"], words=arrays["words"],
                  splits={s: np.asarray(v, np.int64) for s, v in split_documents(docs).items()})


# Every format a corpus file can have (documents.corpus_kind), and every way its reader can fail:
# FAULTS[kind] maps a fault to the bytes of a broken file of that kind, made from a good one.
FORMATS = ("txt", "txt.gz", "jsonl", "jsonl.gz", "parquet")


def _parquet(table) -> bytes:
    import pyarrow.parquet as pq
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def good_bytes(kind: str, docs: list[str]) -> bytes:
    """A corpus file of `kind` holding `docs`."""
    import pyarrow as pa
    if kind == "parquet":
        return _parquet(pa.table({"text": docs}))
    text = ("\n\n".join(docs) + "\n" if kind.startswith("txt")
            else "".join(json.dumps({"text": d}) + "\n" for d in docs))
    return gzip.compress(text.encode()) if kind.endswith(".gz") else text.encode()


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


def write_sources(tmp_path, docs):
    """The documents split over a .txt, a .jsonl.gz and a .parquet file (with a null row), in that order."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    a, b, c = docs[:len(docs) // 3], docs[len(docs) // 3:2 * len(docs) // 3], docs[2 * len(docs) // 3:]
    (tmp_path / "a.txt").write_text("\n\n".join(a) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(b))
    pq.write_table(pa.table({"id": list(range(len(c) + 1)), "text": c[:5] + [None] + c[5:]}),
                   tmp_path / "c.parquet", row_group_size=7)
    return [tmp_path / "a.txt", tmp_path / "b.jsonl.gz", tmp_path / "c.parquet"]


def one_line_error(err: str, command: str) -> str:
    """The error line of a failed command, after checking stderr holds nothing else that counts:
    no traceback and at most three lines (a progress bar that was cleared is not one)."""
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert "Traceback" not in err and lines and len(err.strip().splitlines()) <= 3, err
    assert lines[-1].startswith(f"seamkit {command}: error: "), err
    return lines[-1]


def sampled(root, shard: str) -> np.ndarray:
    """bool per token of a shard: True where every open reads it (tokencheck.sample_blocks)."""
    from seamkit.data import tokencheck
    meta = json.loads((root / "meta.json").read_text())
    dtype, path = np.dtype(meta["dtype"]), root / shard
    mask = np.zeros(path.stat().st_size // dtype.itemsize, bool)
    with open(path, "rb") as f:
        for start, block in tokencheck.sample_blocks(f, path.stat().st_size, dtype.itemsize,
                                                     meta.get("sample", tokencheck.SAMPLE)):
            mask[start // dtype.itemsize:(start + len(block)) // dtype.itemsize] = True
    return mask


def set_tokens(root, shard: str, where, value) -> None:
    """Change a shard's tokens in place (same size, meta.json untouched): `value(ids)` at `where`."""
    ids = np.fromfile(root / shard, np.uint16)  # the bytes tokenizer's dtype
    ids[where] = value(ids[where]) if callable(value) else value
    ids.tofile(root / shard)
