"""What a token directory must hold, checked when it is opened: meta.json's fields, the files'
sizes and checksums, and arrays that agree with each other (seamkit.data.tokenfiles).

Every check raises `DataError` in one line naming the file at fault. What is checked on every
open costs a read of the per-document arrays (20 bytes a document) and a sample of each shard:
`blocks` blocks of `block_bytes` (meta.json's "sample"; the first, the last and the rest evenly
between), whose token ids must lie in the vocabulary and at most the shard's recorded largest id,
and whose SHA-256 must match the one prepare recorded. A change outside the sample passes that;
reading every shard (SHA-256 and token ids) is `full=True`, `seamkit data check DIR`. A folder
prepared before shards had a sample still opens: its sample's ids are checked, nothing more.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from seamkit.data.documents import SPLITS
from seamkit.data.errors import DataError

FORMAT = 2  # a token directory of another format is refused, naming `seamkit data prepare`
META = "meta.json"
PER_DOC = {"offsets": np.int64, "prompt_len": np.int32, "words": np.int32}
# meta.json's fields that a reader needs, with their JSON types; prepare writes more (sources, ...)
META_FIELDS = {"format": int, "tokenizer": str, "dtype": str, "documents": int, "tokens": int,
               "shards": list, "splits": dict, "checksums": dict}
SHARD_FIELDS = {"file": str, "first_doc": int, "first_token": int, "docs": int, "tokens": int, "sha256": str}
SPLIT_FIELDS = {"documents": int, "tokens": int}
# the sample every open reads of each shard (see the module docstring), in meta.json's "sample";
# a folder without one is read at these sizes for its token ids alone
SAMPLE = {"blocks": 8, "block_bytes": 1 << 16}
SAMPLE_SHARD_FIELDS = {"sample_sha256": str, "max_id": int}
SHARD_NAME = re.compile(r"tokens-\d{5}\.bin")  # a bare name: meta.json never points outside its directory
SHA256 = re.compile(r"[0-9a-f]{64}")


def token_dtype(n_vocab: int) -> np.dtype:
    return np.dtype(np.uint16 if n_vocab <= 1 << 16 else np.uint32)


def checked_files() -> list[str]:
    """The files whose SHA-256 meta.json's "checksums" holds and every open verifies."""
    return [f"{name}.bin" for name in PER_DOC] + [f"split-{s}.bin" for s in SPLITS]


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


_JSON = {int: "integer", str: "string", list: "array", dict: "object"}


def _typed(value, kind) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _fields(where: str, obj, fields: dict, path: Path) -> None:
    if not isinstance(obj, dict):
        raise DataError(f"{path}: {where} is not an object")
    for name, kind in fields.items():
        if name not in obj:
            raise DataError(f"{path}: {'' if where == 'meta' else where + ' has '}no {name!r} field; "
                            f"`seamkit data prepare` writes it")
        label = name if where == "meta" else f"{where}.{name}"
        if not _typed(obj[name], kind):
            raise DataError(f"{path}: {label} is {obj[name]!r}, not a JSON {_JSON[kind]}")
        if kind is int and obj[name] < 0:
            raise DataError(f"{path}: {label} is {obj[name]}, negative")


def check_meta(meta, path: Path, n_vocab) -> None:
    """meta.json holds every field a reader needs, of its type and in range. `n_vocab(name)`:
    the tokenizer's vocabulary (DataError for an unknown tokenizer)."""
    if not isinstance(meta, dict):
        raise DataError(f"{path}: not a seamkit token corpus (a JSON {type(meta).__name__}, not an object)")
    if meta.get("format") != FORMAT:
        raise DataError(f"{path}: format {meta.get('format')!r}, this seamkit reads token corpora of format "
                        f"{FORMAT}; run `seamkit data prepare` on its sources again")
    _fields("meta", meta, META_FIELDS, path)
    try:
        want = token_dtype(n_vocab(meta["tokenizer"])).name
    except DataError as e:
        raise DataError(f"{path}: {e}") from None
    if meta["dtype"] != want:
        raise DataError(f"{path}: dtype {meta['dtype']!r}, tokenizer {meta['tokenizer']} has {want} tokens")
    if meta["documents"] < 1 or not meta["shards"]:
        raise DataError(f"{path}: a token corpus without documents")
    for k, shard in enumerate(meta["shards"]):
        _fields(f"shards[{k}]", shard, SHARD_FIELDS, path)
        if not SHARD_NAME.fullmatch(shard["file"]):
            raise DataError(f"{path}: shards[{k}].file {shard['file']!r} is not a shard name like tokens-00000.bin")
    for s in SPLITS:
        if s not in meta["splits"]:
            raise DataError(f"{path}: splits has no {s!r} split")
        _fields(f"splits.{s}", meta["splits"][s], SPLIT_FIELDS, path)
    for name in checked_files():
        if not (isinstance(meta["checksums"].get(name), str) and SHA256.fullmatch(meta["checksums"][name])):
            raise DataError(f"{path}: checksums has no SHA-256 of {name}")
    if "sample" in meta:
        _check_sample_meta(meta, path, int(n_vocab(meta["tokenizer"])))


def _check_sample_meta(meta: dict, path: Path, n_vocab: int) -> None:
    _fields("sample", meta["sample"], {name: int for name in SAMPLE}, path)
    blocks, block_bytes = meta["sample"]["blocks"], meta["sample"]["block_bytes"]
    if blocks < 2 or block_bytes < 1 or block_bytes % np.dtype(meta["dtype"]).itemsize:
        raise DataError(f"{path}: sample is {meta['sample']}; it needs 2 or more blocks of a whole number of "
                        f"{meta['dtype']} ids")
    for k, shard in enumerate(meta["shards"]):
        _fields(f"shards[{k}]", shard, SAMPLE_SHARD_FIELDS, path)
        if not SHA256.fullmatch(shard["sample_sha256"]):
            raise DataError(f"{path}: shards[{k}].sample_sha256 is not a SHA-256")
        if shard["max_id"] >= n_vocab:
            raise DataError(f"{path}: shards[{k}].max_id {shard['max_id']} is outside the tokenizer's {n_vocab} ids")


def check_checksums(root: Path, meta: dict) -> None:
    for name in checked_files():
        if sha256_file(root / name) != meta["checksums"][name]:
            raise DataError(f"{root / name}: SHA-256 differs from the one meta.json holds: the file changed "
                            f"after `seamkit data prepare` wrote it")


def check_arrays(root: Path, meta: dict, per_doc: dict, splits: dict) -> None:
    """The arrays agree with each other and with meta.json: offsets start at 0, grow and end at
    the corpus's tokens; each shard holds the documents its offsets say; prompts fit their
    documents; the splits partition the documents and hold the tokens meta.json says."""
    offsets, n = per_doc["offsets"], meta["documents"]
    lens = np.diff(offsets)
    if offsets[0] != 0:
        raise DataError(f"{root / 'offsets.bin'}: the first offset is {int(offsets[0])}, not 0")
    if (lens < 1).any():
        i = int(np.argmax(lens < 1))
        raise DataError(f"{root / 'offsets.bin'}: document {i} spans {int(offsets[i])}..{int(offsets[i + 1])}; "
                        f"offsets must grow by at least one token a document")
    if offsets[-1] != meta["tokens"]:
        raise DataError(f"{root / 'offsets.bin'}: the documents end at token {int(offsets[-1])}, meta.json's "
                        f"tokens says {meta['tokens']}")
    doc = tok = 0
    for shard in meta["shards"]:
        end = doc + shard["docs"]
        if (shard["first_doc"] != doc or shard["first_token"] != tok or shard["docs"] < 1 or end > n
                or offsets[end] - offsets[doc] != shard["tokens"]):
            raise DataError(f"{root / 'offsets.bin'}: documents {doc}..{end} do not fit shard {shard['file']} "
                            f"({shard['tokens']} tokens from token {shard['first_token']}): offsets point past "
                            f"the shard or meta.json's shards disagree with them")
        doc, tok = end, tok + shard["tokens"]
    if doc != n:
        raise DataError(f"{root / META}: shards hold {doc} documents, documents says {n}")
    prompt = per_doc["prompt_len"]
    if ((prompt < 0) | (prompt >= lens)).any():
        i = int(np.argmax((prompt < 0) | (prompt >= lens)))
        raise DataError(f"{root / 'prompt_len.bin'}: document {i}'s prompt of {int(prompt[i])} tokens does not "
                        f"fit its {int(lens[i])} tokens")
    if (per_doc["words"] < 0).any():
        raise DataError(f"{root / 'words.bin'}: negative word counts")
    seen = np.zeros(n, np.int64)
    for s in SPLITS:
        ids, name = splits[s], root / f"split-{s}.bin"
        if len(ids) and (ids[0] < 0 or ids[-1] >= n or (np.diff(ids) < 1).any()):
            raise DataError(f"{name}: document indices must ascend within 0..{n - 1}")
        seen[ids] += 1
        if int(lens[ids].sum()) != meta["splits"][s]["tokens"]:
            raise DataError(f"{name}: its documents hold {int(lens[ids].sum())} tokens, meta.json's "
                            f"splits.{s}.tokens says {meta['splits'][s]['tokens']}")
    if (seen != 1).any():
        raise DataError(f"{root}: document {int(np.argmax(seen != 1))} is in {int(seen[np.argmax(seen != 1)])} "
                        f"splits; the splits must partition the documents")


def sample_blocks(f, size: int, itemsize: int, sample: dict):
    """(byte offset, bytes) of each sampled block of an open shard of `size` bytes: `blocks`
    blocks of `block_bytes` from the first byte to the last, evenly spaced (on whole ids), or
    the whole shard when it is no longer than the blocks together. Depends on the size alone,
    so prepare and every later open read the same bytes."""
    blocks, block = sample["blocks"], sample["block_bytes"]
    if size <= blocks * block:
        starts = [0]
        block = size
    else:
        starts = [k * (size - block) // (blocks - 1) // itemsize * itemsize for k in range(blocks)]
    for start in starts:
        f.seek(start)
        yield start, f.read(block)


def sample_sha256(path: Path, dtype: np.dtype, sample: dict) -> str:
    """The SHA-256 of a shard's sampled blocks, back to back."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for _, block in sample_blocks(f, path.stat().st_size, dtype.itemsize, sample):
            h.update(block)
    return h.hexdigest()


def _id_error(path: Path, ids: np.ndarray, first: int, top: int, what: str) -> DataError:
    """The first id of `ids` (read from token `first` of the shard) above `top`, in one line;
    `what` says what `top` is."""
    i = int(np.argmax(ids > top))
    return DataError(f"{path}: token id {int(ids[i])} is {what} (token {first + i:,} of the shard): the shard "
                     f"changed after `seamkit data prepare` wrote it")


def _vocab(n_vocab: int) -> str:
    return f"outside the tokenizer's {n_vocab} ids"


def check_samples(root: Path, meta: dict, n_vocab: int) -> None:
    """The check of every open: each shard's sampled blocks hold ids in the vocabulary and at most
    the shard's recorded largest id, and hash to the recorded SHA-256 (when meta.json has them)."""
    dtype, sample = np.dtype(meta["dtype"]), meta.get("sample", SAMPLE)
    for shard in meta["shards"]:
        path, h = root / shard["file"], hashlib.sha256()
        with open(path, "rb") as f:
            for start, block in sample_blocks(f, path.stat().st_size, dtype.itemsize, sample):
                ids, first = np.frombuffer(block, dtype), start // dtype.itemsize
                top = int(ids.max()) if len(ids) else -1
                if top >= n_vocab:
                    raise _id_error(path, ids, first, n_vocab - 1, _vocab(n_vocab))
                if top > shard.get("max_id", top):
                    raise _id_error(path, ids, first, shard["max_id"],
                                    f"above {shard['max_id']}, the shard's largest id in meta.json")
                h.update(block)
        if "sample_sha256" in shard and h.hexdigest() != shard["sample_sha256"]:
            raise DataError(f"{path}: SHA-256 of its sampled blocks differs from the one meta.json holds: the shard "
                            f"changed after `seamkit data prepare` wrote it")


def check_shards(root: Path, meta: dict, n_vocab: int, chunk: int = 1 << 24, progress: bool = False) -> None:
    """The full check: each shard's SHA-256, and no token id outside the vocabulary. Plain reads
    of `chunk` bytes, so the scan leaves nothing resident; `progress`: a bar over the bytes."""
    dtype = np.dtype(meta["dtype"])
    total = sum(shard["tokens"] for shard in meta["shards"]) * dtype.itemsize
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"data check {root.name}", disable=not progress,
              mininterval=1.0) as bar:
        try:
            for shard in meta["shards"]:
                _check_shard(root / shard["file"], shard, dtype, n_vocab, chunk - chunk % dtype.itemsize, bar)
        except BaseException:
            bar.leave = False  # the error line alone, not a bar stopped part way
            raise


def _check_shard(path: Path, shard: dict, dtype: np.dtype, n_vocab: int, chunk: int, bar) -> None:
    h, done = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            ids = np.frombuffer(block, dtype)
            if ids.max() >= n_vocab:
                raise _id_error(path, ids, done, n_vocab - 1, _vocab(n_vocab))
            h.update(block)
            done += len(ids)
            bar.update(len(block))
    if h.hexdigest() != shard["sha256"]:
        raise DataError(f"{path}: SHA-256 differs from the one meta.json holds: the shard changed after "
                        f"`seamkit data prepare` wrote it")
