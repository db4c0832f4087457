"""`seamkit data prepare` (`prepare`): corpus files tokenized once into a token directory, the
format `seamkit.data.tokenfiles` reads through np.memmap (its docstring holds the layout).

`prepare` streams documents from .txt, .jsonl (either optionally .gz) and .parquet files with a
text column (the format of FineWeb and most hub corpora), or from a Hugging Face `datasets`
dataset on disk (`hf`, seamkit.data.hfdata), tokenizes them in several processes,
and appends the ids to token shards. Nothing holds more than a few chunks of text at once; what
grows with the corpus is 8 bytes per document (its split hash) until the split is decided at
the end. Documents are encoded exactly as an in-memory corpus encodes them
(`corpus.encode_document`) and split by the same hash (`documents.split_by_hash`), so a file and
its token directory hold the same documents in the same splits.

`prepare` writes into a temporary folder beside DIR and renames it to DIR at the end, so a
failed or interrupted run leaves nothing behind and DIR, once it exists, is complete.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from seamkit.data.corpus import encode_document
from seamkit.data.documents import (
    SPLITS,
    Source,
    corpus_kind,
    doc_hash,
    file_source,
    split_by_hash,
)
from seamkit.data.errors import DataError
from seamkit.data.hfdata import open_dataset
from seamkit.data.tokencheck import (
    FORMAT,
    META,
    PER_DOC,
    SAMPLE,
    sample_sha256,
    token_dtype,
)
from seamkit.data.tokenizers import get_tokenizer
from seamkit.report import atomic_write_text

CHUNK_CHARS = 1 << 20  # text per tokenizing task: large enough to amortize the hand-over to a worker
SHARD_TOKENS = 1 << 28  # 256M tokens: 512 MB (bytes) or 1 GB (qwen) per shard


def _encode_chunk(tokenizer: str, key: str, docs: list[str]) -> dict[str, np.ndarray]:
    """A worker's task: the arrays of a run of documents (see the module docstring). `key`: the
    tokenizer's when prepare started; an hf: tokenizer.json edited since would give other ids."""
    tok = get_tokenizer(tokenizer)
    if tok.key != key:
        raise DataError(f"{tokenizer}: the tokenizer file changed while data prepare ran")
    pieces, lens, prompt = [], np.empty(len(docs), np.int64), np.empty(len(docs), np.int32)
    for i, text in enumerate(docs):
        ids, prompt[i] = encode_document(text, tok)
        pieces.append(np.asarray(ids, token_dtype(tok.n_vocab)))
        lens[i] = len(ids)
    return {"tokens": np.concatenate(pieces), "lens": lens, "prompt_len": prompt,
            "words": np.array([len(d.split()) for d in docs], np.int32),
            "hash": np.array([doc_hash(d) for d in docs], np.float64)}


def _chunks(sources: list[Source], bar):
    """Runs of documents of about CHUNK_CHARS characters, from every source in turn."""
    chunk, chars, done = [], 0, 0
    for source in sources:
        read = 0
        for doc, position in source.documents():
            chunk.append(doc)
            chars += len(doc)
            bar.update(position - read)
            read = position
            if chars >= CHUNK_CHARS:
                yield chunk
                chunk, chars = [], 0
        done += read if source.size is None else source.size
        bar.update(done - bar.n)
    if chunk:
        yield chunk


class _Writer:
    """Appends encoded chunks to the shards and the per-document files of an output directory,
    hashing every byte it writes (the checksums of meta.json); each shard also gets its largest
    token id and the SHA-256 of the blocks `sample` picks (what every open checks)."""

    def __init__(self, out: Path, dtype: np.dtype, shard_tokens: int, sample: dict):
        self.out, self.dtype, self.shard_tokens, self.sample = out, dtype, shard_tokens, sample
        self.files = {name: open(out / f"{name}.bin", "wb") for name in PER_DOC}
        self.sha = {name: hashlib.sha256() for name in PER_DOC}
        self._put("offsets", np.zeros(1, np.int64))
        self.shards: list[dict] = []
        self.shard = self.shard_sha = None
        self.n_docs = self.n_tokens = 0
        self.hashes: list[np.ndarray] = []

    def _put(self, name: str, a: np.ndarray) -> None:
        self.files[name].write(a.tobytes())
        self.sha[name].update(a.tobytes())

    def write(self, c: dict[str, np.ndarray]) -> None:
        if self.shard is None or self.shards[-1]["tokens"] >= self.shard_tokens:
            self._close_shard()
            name = f"tokens-{len(self.shards):05d}.bin"
            self.shard, self.shard_sha = open(self.out / name, "wb"), hashlib.sha256()
            self.shards.append({"file": name, "first_doc": self.n_docs, "first_token": self.n_tokens,
                                "docs": 0, "tokens": 0, "max_id": 0})
        self.shard.write(c["tokens"].tobytes())
        self.shard_sha.update(c["tokens"].tobytes())
        self._put("offsets", (self.n_tokens + np.cumsum(c["lens"])).astype(np.int64))
        self._put("prompt_len", c["prompt_len"])
        self._put("words", c["words"])
        self.hashes.append(c["hash"])
        n = len(c["lens"])
        self.shards[-1]["docs"] += n
        self.shards[-1]["tokens"] += len(c["tokens"])
        self.shards[-1]["max_id"] = max(self.shards[-1]["max_id"], int(c["tokens"].max()))
        self.n_docs, self.n_tokens = self.n_docs + n, self.n_tokens + len(c["tokens"])

    def _close_shard(self) -> None:
        if self.shard is not None:
            _sync_close(self.shard)
            self.shards[-1]["sha256"] = self.shard_sha.hexdigest()
            self.shards[-1]["sample_sha256"] = sample_sha256(self.out / self.shards[-1]["file"], self.dtype,
                                                             self.sample)
            self.shard = None

    def finish(self) -> dict[str, str]:
        """Close and sync every file; the SHA-256 of each per-document file."""
        self._close_shard()
        for f in self.files.values():
            _sync_close(f)
        return {f"{name}.bin": h.hexdigest() for name, h in self.sha.items()}

    def abandon(self) -> None:
        for f in [*self.files.values(), *([self.shard] if self.shard else [])]:
            f.close()


def _sync_close(f) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _ignore_sigint() -> None:
    # a worker's Ctrl-C is the parent's to handle: it removes the output and ends the pool
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def check_output(out) -> None:
    """DataError, before any work and creating nothing, when `out` cannot become a token
    directory: it exists and is not an empty directory, or the nearest existing folder above
    it is not a writable directory."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"{out}: output exists and is not an empty directory")
    up = next(p for p in out.absolute().parents if p.exists())
    if not up.is_dir():
        raise DataError(f"cannot write {out}: {up} is not a directory")
    if not os.access(up, os.W_OK | os.X_OK):
        raise DataError(f"cannot write {out}: {up} is not writable")


def check_sizes(workers: int, shard_tokens: int) -> None:
    """`workers` >= 0 (0: one per CPU) and `shard_tokens` >= 1, or DataError naming the flag."""
    for flag, value, low in (("--workers", workers, 0), ("--shard-tokens", shard_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise DataError(f"{flag} must be an integer >= {low}, got {value!r}"
                            + ("; 0 means one process per CPU" if flag == "--workers" else ""))


def prepare(paths, tokenizer: str, out_dir, workers: int = 0, shard_tokens: int = SHARD_TOKENS,
            text_column: str | None = None, progress: bool = True, hf: str | None = None) -> dict:
    """Tokenize corpus files, or a dataset on disk, into a token directory (module docstring);
    returns its meta.json.

    `paths`: files, or directories whose .txt/.jsonl(.gz)/.parquet files are taken in name
    order; or `hf` instead, "PATH[:SPLIT]" of a `datasets` dataset (seamkit.data.hfdata).
    `text_column`: a parquet file's or the dataset's text column (default "text"; for a
    dataset, found). `workers`: tokenizing processes (0: one per CPU, 1: in this process).
    `out_dir` must be new or empty. Everything is written into a temporary folder beside it,
    renamed to `out_dir` at the end: any failure, Ctrl-C included, removes it and every folder
    above `out_dir` that this call created.
    """
    tok = get_tokenizer(tokenizer)
    check_sizes(workers, shard_tokens)
    out = Path(out_dir)
    check_output(out)
    if (hf is None) == (not paths):
        raise DataError("data prepare: give corpus files or a dataset (--hf), one of them")
    with contextlib.ExitStack() as stack:
        if hf is None:
            column = text_column or "text"
            sources = [file_source(p, column) for p in _corpus_files(paths)]
        else:
            source, column = stack.enter_context(open_dataset(hf, text_column))
            sources = [source]
        return _prepare(sources, column, tok, out, workers or os.cpu_count() or 1, shard_tokens, progress)


def _prepare(sources: list[Source], text_column: str, tok, out: Path, workers: int, shard_tokens: int,
             progress: bool) -> dict:
    """`prepare` once its inputs are checked: into a temporary folder, renamed at the end."""
    made = [p for p in reversed(out.absolute().parents) if not p.exists()]  # outermost first
    tmp = None
    try:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        except OSError as e:
            raise DataError(f"cannot write {out}: {e.strerror or e}") from None
        meta = _write(sources, tok, tmp, workers, shard_tokens, text_column, progress)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes 0700; give the folder the permissions mkdir would
        try:
            os.replace(tmp, out)  # onto a missing or empty directory
        except OSError as e:
            raise DataError(f"cannot write {out}: {e.strerror or e}") from None
        return meta
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for p in reversed(made):  # innermost first; a folder someone else filled meanwhile stays
            try:
                p.rmdir()
            except OSError:
                break
        raise


def _write(sources: list[Source], tok, tmp: Path, workers: int, shard_tokens: int, text_column: str,
           progress: bool) -> dict:
    """Every document of `sources` into the token directory `tmp`; its meta.json, written last."""
    try:
        writer = _Writer(tmp, token_dtype(tok.n_vocab), shard_tokens, dict(SAMPLE))
    except OSError as e:
        raise DataError(f"cannot write {tmp}: {e.strerror or e}") from None
    sizes = [s.size for s in sources]
    total = None if None in sizes else sum(sizes)
    try:
        with tqdm(total=total, unit=sources[0].unit, unit_scale=True, disable=not progress, mininterval=1.0,
                  desc=f"data prepare ({tok.name}, {workers} workers)") as bar:
            try:
                _encode_all(sources, tok, writer, workers, bar)
                if writer.n_docs == 0:
                    raise DataError(f"{', '.join(s.label for s in sources)}: no documents")
            except BaseException:
                bar.leave = False  # the error line alone, not a bar stopped part way
                raise
        checksums = writer.finish()
        splits = split_by_hash(np.concatenate(writer.hashes))
        offsets = np.memmap(tmp / "offsets.bin", np.int64, mode="r")
        meta = {"format": FORMAT, "tokenizer": tok.name, "dtype": writer.dtype.name, "documents": writer.n_docs,
                "tokens": writer.n_tokens, "shards": writer.shards, "splits": {}, "checksums": checksums,
                "sample": writer.sample,
                "sources": [s.label for s in sources], "text_column": text_column,
                **({"tokenizer_key": tok.key} if tok.key != tok.name else {})}
        for s in SPLITS:
            ids = splits[s].astype(np.int64)
            with open(tmp / f"split-{s}.bin", "wb") as f:
                f.write(ids.tobytes())
                f.flush()
                os.fsync(f.fileno())
            meta["checksums"][f"split-{s}.bin"] = hashlib.sha256(ids.tobytes()).hexdigest()
            meta["splits"][s] = {"documents": len(ids), "tokens": int((offsets[ids + 1] - offsets[ids]).sum())}
        del offsets
        atomic_write_text(tmp / META, json.dumps(meta, indent=2) + "\n")
    except OSError as e:  # reading errors are DataErrors already (documents.iter_documents)
        raise DataError(f"cannot write {tmp}: {e.strerror or e}") from None
    finally:
        writer.abandon()
    return meta


def _encode_all(sources: list[Source], tok, writer: _Writer, workers: int, bar) -> None:
    chunks = _chunks(sources, bar)
    if workers == 1:
        for chunk in chunks:
            writer.write(_encode_chunk(tok.name, tok.key, chunk))
            bar.set_postfix(tokens=f"{writer.n_tokens:,}", refresh=False)
        return
    # at most 2 tasks per worker in flight: reading never runs far ahead of tokenizing
    with mp.get_context("spawn").Pool(workers, initializer=_ignore_sigint) as pool:
        pending = collections.deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_chunk, (tok.name, tok.key, chunk)))
            while len(pending) > 2 * workers:
                writer.write(pending.popleft().get())
                bar.set_postfix(tokens=f"{writer.n_tokens:,}", refresh=False)
        while pending:
            writer.write(pending.popleft().get())


def _corpus_files(paths) -> list[Path]:
    files = []
    for p in map(Path, paths if not isinstance(paths, (str, os.PathLike)) else [paths]):
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and _is_corpus_file(q))
            if not found:
                raise DataError(f"{p}: no .txt, .jsonl(.gz) or .parquet files in this directory")
            files += found
        elif not p.exists():
            raise DataError(f"{p}: no such corpus file")
        else:
            corpus_kind(p)  # an unknown format fails now, before any work
            files.append(p)
    if not files:
        raise DataError("data prepare: no corpus files given")
    return files


def _is_corpus_file(p: Path) -> bool:
    try:
        corpus_kind(p)
        return True
    except DataError:
        return False
