"""Documents: which file a corpus name means, the documents it holds, and the split.

- files: the shipped WordNet 3.0 glosses (data/README.md; a wheel carries them in
  seamkit/corpora/) or a user .txt / .jsonl(.gz) / .parquet file, streamed (`iter_documents`);
- `Source`: documents `data prepare` streams, from a file (`file_source`) or a dataset
  (seamkit.data.hfdata);
- the split: a seed-free train/val/test assignment from a hash of each document's text
  (`split_by_hash`), the same for in-memory and token-file corpora.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from seamkit.data.errors import DataError

DATA_DIR = Path(__file__).resolve().parents[2] / "data"  # a checkout's data/ (data/README.md)
CORPORA_DIR = Path(__file__).resolve().parents[1] / "corpora"  # inside the package, so installs have it too
GZIP_MAGIC = b"\x1f\x8b"  # every shipped corpus is gzipped


def _shipped(name: str) -> Path:
    """seamkit/corpora/<name>: a link to data/<name> in a checkout, the file itself in a wheel.

    Where links are not checked out (git's core.symlinks=false, the default on Windows), git
    writes the link as a small text file holding the target's path; that file, or a missing
    one, falls back to data/<name>. Only a file that starts like gzip is the corpus itself.
    """
    inside = CORPORA_DIR / name
    try:
        with open(inside, "rb") as f:
            real = f.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    except OSError:
        real = False
    return inside if real else DATA_DIR / name


SHIPPED = {"wordnet": _shipped("wordnet.jsonl.gz")}
SPLITS = ("train", "val", "test")


def corpus_path(corpus: str | Path) -> Path:
    """The file behind a corpus name: a shipped corpus ("wordnet") or a user path (a Path is always one)."""
    return SHIPPED.get(corpus, Path(corpus).expanduser())


def corpus_kind(path: Path) -> str:
    """"txt", "jsonl" or "parquet" from a file name (.gz allowed for txt and jsonl); else DataError."""
    name = path.name.removesuffix(".gz")
    kind = name.rsplit(".", 1)[-1] if "." in name else ""
    if kind not in ("txt", "jsonl", "parquet") or (kind == "parquet" and path.name.endswith(".gz")):
        raise DataError(f"{path}: unknown corpus format; expected .txt, .jsonl (optionally .gz) or .parquet")
    return kind


def iter_documents(path: Path, text_column: str = "text"):
    """Yield (document, bytes of the file read so far) one document at a time, in file order.

    `.txt`: documents separated by one or more blank lines, each stripped.
    `.jsonl`: one JSON object per line with a "text" string, kept verbatim; blank lines skipped.
    Either may be gzipped (`.txt.gz`, `.jsonl.gz`). `.parquet`: the `text_column` string
    column, read one record batch at a time (null rows skipped). Only one document (or one
    parquet batch) is held at a time, so a corpus larger than memory streams.
    """
    kind = corpus_kind(path)
    if kind == "parquet":
        yield from _iter_parquet(path, text_column)
        return
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such corpus file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read corpus: {e}") from None
    with raw:
        f = gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw
        lines = _decoded_lines(f, path)
        if kind == "jsonl":
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: line {n} is not valid JSON ({e.msg})") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise DataError(f"{path}: line {n} has no \"text\" string")
                yield obj["text"], raw.tell()
        else:
            doc: list[str] = []
            for line in lines:
                if _BLANK.fullmatch(line.rstrip("\n")):
                    if "".join(doc).strip():
                        yield "".join(doc).strip(), raw.tell()
                    doc = []
                else:
                    doc.append(line)
            if "".join(doc).strip():
                yield "".join(doc).strip(), raw.tell()


_BLANK = re.compile(r"[ \t]*")


@dataclass(frozen=True)
class Source:
    """Documents `data prepare` streams: a corpus file, or a dataset (seamkit.data.hfdata)."""
    label: str  # names it in errors and in meta.json's "sources"
    size: int | None  # progress units in all (None: not known before reading)
    unit: str  # "B": a file's bytes; "row": a dataset's rows
    documents: Callable[[], Iterator[tuple[str, int]]]  # (document, units read so far), in order


def file_source(path: Path, text_column: str = "text") -> Source:
    return Source(str(path), path.stat().st_size, "B", lambda: iter_documents(path, text_column))


def _decoded_lines(f, path: Path):
    """Lines of a binary file as str (with their "\n"); read and decode errors name the file."""
    try:
        for n, b in enumerate(f, 1):
            try:
                line = b.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: cannot read corpus: line {n} is not UTF-8 ({e.reason})") from None
            if "\r" in line:  # universal newlines, as text mode reads them
                *parts, last = line.replace("\r\n", "\n").replace("\r", "\n").split("\n")
                yield from (p + "\n" for p in parts)
                if last:
                    yield last
            else:
                yield line
    except (OSError, EOFError) as e:  # e.g. a truncated .gz
        raise DataError(f"{path}: cannot read corpus: {e}") from None


def _iter_parquet(path: Path, text_column: str):
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        pf = pq.ParquetFile(path)
    except FileNotFoundError:
        raise DataError(f"{path}: no such corpus file") from None
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: cannot read parquet: {str(e).splitlines()[0]}") from None
    field = pf.schema_arrow.get_field_index(text_column)
    if field < 0 or not (pa.types.is_string(pf.schema_arrow.field(field).type)
                         or pa.types.is_large_string(pf.schema_arrow.field(field).type)):
        raise DataError(f"{path}: no string column {text_column!r} (columns: {', '.join(pf.schema_arrow.names)})")
    size, rows = path.stat().st_size, max(1, pf.metadata.num_rows)
    done = 0
    try:
        for batch in pf.iter_batches(batch_size=1024, columns=[text_column]):
            for text in batch.column(0).to_pylist():
                done += 1
                if text is not None:
                    yield text, size * done // rows
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: cannot read parquet: {str(e).splitlines()[0]}") from None


def load_documents(corpus: str | Path) -> list[str]:
    """All documents of a corpus file, in file order (see `iter_documents` for the formats)."""
    path = corpus_path(corpus)
    docs = [d for d, _ in iter_documents(path)]
    if not docs:
        raise DataError(f"{path}: no documents")
    return docs


def doc_hash(text: str) -> float:
    """u in [0, 1) from a hash of a document's text: what the split is decided on."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") / 2.0 ** 64


def split_documents(docs: list[str]) -> dict[str, list[int]]:
    """Seed-free train/val/test split of documents: `split_by_hash` of each one's `doc_hash`."""
    u = np.array([doc_hash(d) for d in docs], dtype=np.float64)
    return {s: ids.tolist() for s, ids in split_by_hash(u).items()}


def split_by_hash(u: np.ndarray) -> dict[str, np.ndarray]:
    """Seed-free train/val/test split: about 1% val, 1% test, the rest train.

    Each document gets u in [0, 1) from a hash of its text (`doc_hash`), so the split does
    not depend on any seed or on the file's order, and duplicate documents land in the same
    split (ties are broken by index). val takes the documents with u < 0.01, test those with
    0.01 <= u < 0.02. A corpus of 3 or more documents always gets at least one document in
    val and in test (the lowest u values), and keeps at least one for train. Each split is
    returned in ascending index order (int64 arrays). Token-file corpora (seamkit.data.tokenfiles) use the same
    function on the hashes they collect while streaming.
    """
    n = len(u)
    order = np.lexsort((np.arange(n), u))  # by u, then index
    n_val, n_test = int((u < 0.01).sum()), int(((u >= 0.01) & (u < 0.02)).sum())
    if n >= 3:
        n_val, n_test = max(n_val, 1), max(n_test, 1)
        if n_val + n_test >= n:
            n_val = n_test = 1
    return {"val": np.sort(order[:n_val]), "test": np.sort(order[n_val:n_val + n_test]),
            "train": np.sort(order[n_val + n_test:])}
