"""The tokenized corpus: `Corpus`, and the in-memory one built from a file and cached on disk.

Every document is tokenized once as `encode(prompt) + encode(completion) + [eod]`. A document
`lemma: gloss` is a completion task: the prompt is the text up to and including the first
':', the completion is the rest. The prompt and the completion are tokenized separately, so
the boundary is a token boundary and the "completion" loss policy can score exactly the gloss
tokens. Token-file corpora (seamkit.data.tokenfiles) subclass `Corpus` and encode documents
with the same `encode_document`.
"""

from __future__ import annotations

import hashlib
import itertools
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from seamkit.data.documents import SPLITS, load_documents, split_documents
from seamkit.data.errors import DataError
from seamkit.data.tokenizers import Tokenizer
from seamkit.report import atomic_file

CACHE_VERSION = 1  # bump when the cached arrays change meaning; old cache files are then ignored
CACHE_KEYS = {"tokens", "offsets", "prompt_len", "words"} | {f"split_{s}" for s in SPLITS}


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

    def out_of_vocab(self, i: int, token_id: int) -> DataError:
        """The one-line error for document i holding `token_id`, outside the tokenizer's ids."""
        return DataError(f"corpus {self.name}: document {i} holds token id {token_id}, outside the "
                         f"{self.tokenizer.name} tokenizer's {self.tokenizer.n_vocab} ids")

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
        """What a report records about the corpus: its name, tokenizer (and its file's SHA-256, where it
        has a file) and size per split."""
        sha = {"tokenizer_sha256": self.tokenizer.sha256} if self.tokenizer.sha256 else {}
        return {"name": self.name, "tokenizer": self.tokenizer.name, **sha, "documents": self.n_docs,
                "tokens": self.n_tokens(), "split_tokens": {s: self.n_tokens(s) for s in SPLITS if len(self.splits[s])}}


def check_vocab(corpus: Corpus, ids: np.ndarray, docs: list[int], pieces: list[np.ndarray]) -> None:
    """Every id of a batch lies in the tokenizer's vocabulary, or DataError naming the first
    document that holds one outside it. `ids`: the batch's tokens, `pieces` of documents `docs`
    back to back. One max over `ids` when all is well, before the ids reach the model, whose
    embedding would raise IndexError on them (a shard changed where no open check reads)."""
    if corpus.tokenizer is None:  # ids made up without a tokenizer (a synthetic corpus): no vocabulary to hold
        return
    n_vocab = corpus.tokenizer.n_vocab
    if len(ids) == 0 or ids.max() < n_vocab:
        return
    for i, piece in zip(docs, pieces):
        if len(piece) and piece.max() >= n_vocab:
            raise corpus.out_of_vocab(i, int(piece[np.argmax(piece >= n_vocab)]))


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


def cached_corpus(path: Path, tok: Tokenizer, cache_dir) -> Corpus:
    """The in-memory corpus of a document file: tokenized with `tok`, or loaded from `cache_dir`.

    The cache key is the sha256 of the file's bytes, the tokenizer's key (an hf: tokenizer's holds
    its file's sha256) and CACHE_VERSION, so an edited corpus or tokenizer.json is tokenized
    again and a cached one loads without reading the text.
    """
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        raise DataError(f"{path}: no such corpus file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read corpus: {e}") from None
    stem = path.name.split(".")[0]
    cache = Path(cache_dir).expanduser() / f"{stem}-{tok.key}-v{CACHE_VERSION}-{digest[:16]}.npz"

    arrays = _read_cache(cache)
    if arrays is None:
        docs = load_documents(path)
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
