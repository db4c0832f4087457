"""Token files: corpora larger than memory, tokenized once (`seamkit.data.prepare`, `seamkit data
prepare --corpus PATH... --tokenizer qwen|bytes|hf:PATH --out DIR`) and read through np.memmap.

`--set data.corpus=DIR` trains from it: `load.load_corpus` sees a directory and calls
`open_corpus`, which memory-maps every file; `RowLoader` then copies out only the documents
each batch touches. `open_corpus` checks what it opens (seamkit.data.tokencheck): meta.json's
fields, every file's size, the SHA-256 of the per-document arrays, offsets that fit the shards,
and a sample of each shard (its token ids and SHA-256); `full=True` (`seamkit data check DIR`)
reads every shard whole.

Layout of DIR (all arrays little-endian, raw, no header; meta.json says dtype and length):
  meta.json                 format, tokenizer (an hf: one's key too: its file's SHA-256), dtype,
                            counts, the shards (each with its SHA-256,
                            largest token id and the SHA-256 of its sampled blocks), the sample's
                            sizes, the splits' sizes and the SHA-256 of every file below but the shards
  tokens-00000.bin ...      token ids, uint16 up to 65,536 ids ("bytes"), else uint32 ("qwen"); whole documents
                            back to back, a new shard once one holds `shard_tokens` or more
  offsets.bin               int64 (n_docs + 1): document i is corpus tokens [offsets[i], offsets[i+1])
  prompt_len.bin            int32 (n_docs): leading tokens of each document that are its prompt
  words.bin                 int32 (n_docs): whitespace-separated words of each document's text
  split-{train,val,test}.bin  int64: the split's document indices, ascending
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seamkit.data.corpus import Corpus
from seamkit.data.documents import SPLITS
from seamkit.data.errors import DataError, TokenizerMismatch
from seamkit.data.prepare import check_output, check_sizes, prepare
from seamkit.data.tokencheck import (
    META,
    PER_DOC,
    check_arrays,
    check_checksums,
    check_meta,
    check_samples,
    check_shards,
)
from seamkit.data.tokenizers import get_tokenizer

__all__ = ["PER_DOC", "RELEASE_EVERY", "TokenCorpus", "check_output", "check_sizes", "open_corpus", "prepare"]

RELEASE_EVERY = 64  # documents read between two `TokenCorpus.release` calls; 0: never


@dataclass
class TokenCorpus(Corpus):
    """A `corpus.Corpus` whose arrays are memory-mapped token files; `doc(i)` reads one document.

    There is no single `tokens` array: the shards stay separate files. Pages of a mapped file
    that a process has read count in its RSS until it unmaps them, and the kernel maps far
    more than a document per read (whole large folios and their neighbours: about 300 KiB per
    2 kB document, measured by bench/data.py's author on Linux 6.18), so training would soon
    hold the corpus in RSS (clean page cache, but RSS all the same). Every RELEASE_EVERY
    documents read, `release` drops the shards' pages from this process's mapping (madvise
    MADV_DONTNEED; the page cache keeps them, so the next read is still a memory read).
    """
    shards: list = field(default_factory=list)  # np.memmap per shard
    shard_first_doc: np.ndarray = None  # int64 (n_shards,)
    shard_first_token: np.ndarray = None  # int64 (n_shards,)
    meta: dict = field(default_factory=dict)
    root: Path = None
    reads: int = 0  # documents read since the last release

    def doc(self, i) -> np.ndarray:
        s = int(np.searchsorted(self.shard_first_doc, i, side="right")) - 1
        base = self.shard_first_token[s]
        self.reads += 1
        if self.reads >= RELEASE_EVERY > 0:
            self.release()
        return self.shards[s][self.offsets[i] - base:self.offsets[i + 1] - base]

    def release(self) -> None:
        """Unmap the shards' resident pages from this process (they stay in the page cache).
        Safe between reads: a view returned by `doc` still reads correctly, from the file."""
        self.reads = 0
        for shard in self.shards:
            mm = getattr(shard, "_mmap", None)
            if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
                mm.madvise(mmap.MADV_DONTNEED)

    def n_tokens(self, split: str | None = None) -> int:
        if split is None:
            return int(self.meta["tokens"])
        self.split_docs(split)  # unknown or empty: DataError
        return int(self.meta["splits"][split]["tokens"])

    def token_counts(self, split: str, vocab: int, chunk: int = 1 << 24) -> np.ndarray:
        """np.bincount over a split's documents, reading the shards `chunk` tokens at a time with
        plain reads (not the memory map), so the scan leaves nothing resident."""
        in_split = np.zeros(self.n_docs, dtype=bool)
        in_split[self.split_docs(split)] = True
        counts = np.zeros(vocab, np.int64)
        dtype = np.dtype(self.meta["dtype"])
        for sh in self.meta["shards"]:
            d, end = sh["first_doc"], sh["first_doc"] + sh["docs"]
            with open(self.root / sh["file"], "rb") as f:
                while d < end:
                    stop = min(end, max(d + 1, int(np.searchsorted(self.offsets, self.offsets[d] + chunk, "right")) - 1))
                    lo, hi = int(self.offsets[d]), int(self.offsets[stop])
                    f.seek((lo - sh["first_token"]) * dtype.itemsize)
                    ids = np.fromfile(f, dtype, count=hi - lo)
                    mask = np.repeat(in_split[d:stop], np.diff(self.offsets[d:stop + 1]))
                    counts += np.bincount(ids[mask], minlength=vocab)[:vocab]
                    d = stop
        return counts

    def out_of_vocab(self, i: int, token_id: int) -> DataError:
        sh = self.meta["shards"][int(np.searchsorted(self.shard_first_doc, i, side="right")) - 1]
        return DataError(f"{self.root / sh['file']}: document {i} holds token id {token_id}, outside the "
                         f"{self.tokenizer.name} tokenizer's {self.tokenizer.n_vocab} ids: the shard changed after "
                         f"`seamkit data prepare` wrote it (`seamkit data check {self.root}` reads every shard)")

    def __repr__(self) -> str:
        return f"TokenCorpus({self.root}, {self.meta['tokens']:,} {self.tokenizer.name} tokens)"


def _no_tokens(self):
    raise DataError(f"corpus {self.name}: a token-file corpus has no single tokens array; read documents with "
                    f"corpus.doc(i) and counts with corpus.token_counts(split, vocab)")


TokenCorpus.tokens = property(_no_tokens, lambda self, value: None)


def open_corpus(root, tokenizer: str | None, full: bool = False, progress: bool = False) -> TokenCorpus:
    """Memory-map a token directory, checked first (seamkit.data.tokencheck): DataError in one
    line naming the file when meta.json is missing, incomplete or of another format, the
    corpus was prepared with another tokenizer (None: take the one it was prepared with), a
    file's size or checksum does not match meta.json, the arrays disagree (offsets past a
    shard, splits that do not partition), or a shard's sampled blocks hold an id outside the
    vocabulary or hash to another SHA-256. `full`: also read every shard (its SHA-256 and token
    ids), as long as the shards are big; `progress`: a bar over that read.
    """
    root = Path(root)
    path = root / META
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{root}: not a token corpus (no {META}; `seamkit data prepare` makes one)") from None
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read ({str(e).splitlines()[0]})") from None
    asked = None if tokenizer is None else get_tokenizer(tokenizer)

    def same(tok) -> bool:  # the tokenizer meta.json names: by name, or an hf: file of the same content elsewhere
        return tok is not None and (meta["tokenizer"] == tok.name or meta.get("tokenizer_key") == tok.key)

    check_meta(meta, path, lambda name: (asked if same(asked) else get_tokenizer(name)).n_vocab)
    tok = asked or get_tokenizer(meta["tokenizer"])
    if not same(tok):
        raise TokenizerMismatch(f"{root}: prepared with tokenizer {meta['tokenizer']}, the config asks for "
                                f"{tok.name}; --set data.tokenizer={meta['tokenizer']} (and a model.vocab to match)",
                                meta["tokenizer"])
    if meta.get("tokenizer_key", tok.key) != tok.key:  # an hf: tokenizer.json edited since prepare read it
        raise TokenizerMismatch(f"{root}: prepared with {meta['tokenizer']} as it was then (key "
                                f"{meta['tokenizer_key']}), the file now gives {tok.key}: its ids differ; "
                                f"prepare the corpus again with this tokenizer.json", meta["tokenizer"])
    dtype, n = np.dtype(meta["dtype"]), meta["documents"]

    def mapped(name: str, dt, length: int):
        path = root / name
        try:
            size = path.stat().st_size
        except OSError:
            raise DataError(f"{path}: missing from the token corpus") from None
        if size != length * np.dtype(dt).itemsize:
            raise DataError(f"{path}: {size} bytes, meta.json says {length} of {np.dtype(dt).name} "
                            f"({length * np.dtype(dt).itemsize} bytes): truncated or from another run")
        return np.memmap(path, dt, mode="r") if length else np.zeros(0, dt)

    per_doc = {name: mapped(f"{name}.bin", dt, n + (name == "offsets")) for name, dt in PER_DOC.items()}
    splits = {s: mapped(f"split-{s}.bin", np.int64, meta["splits"][s]["documents"]) for s in SPLITS}
    shards = [mapped(sh["file"], dtype, sh["tokens"]) for sh in meta["shards"]]
    try:
        check_checksums(root, meta)
        check_arrays(root, meta, per_doc, splits)
        check_samples(root, meta, tok.n_vocab)
        if full:
            check_shards(root, meta, tok.n_vocab, progress=progress)
    except OSError as e:
        raise DataError(f"{root}: cannot read ({e.strerror or e})") from None
    return TokenCorpus(name=root.name, tokenizer=tok, tokens=None, offsets=per_doc["offsets"],
                       prompt_len=per_doc["prompt_len"], words=per_doc["words"], splits=splits, shards=shards,
                       shard_first_doc=np.array([sh["first_doc"] for sh in meta["shards"]], np.int64),
                       shard_first_token=np.array([sh["first_token"] for sh in meta["shards"]], np.int64),
                       meta=meta, root=root)
