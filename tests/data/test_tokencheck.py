"""seamkit.data.tokencheck: every way a token folder can be damaged is found when it is opened,
and named in one line, before any training step."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from seamkit import cli
from seamkit.data import tokencheck
from seamkit.data import tokenfiles as tokens
from seamkit.data.documents import SPLITS
from seamkit.data.errors import DataError
from tests.data.corpora import one_line_error


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
        size = np.dtype(tokencheck.PER_DOC.get(name.removesuffix(".bin"), np.int64 if name.startswith("split")
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
        dt = tokencheck.PER_DOC.get(name.removesuffix(".bin"), np.int64)
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
