"""seamkit.data.tokencheck: every way a token folder can be damaged is found when it is opened,
and named in one line, before any training step."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from seamkit import cli
from seamkit.data import tokencheck
from seamkit.data import tokenfiles as tokens
from seamkit.data.documents import SPLITS
from seamkit.data.errors import DataError
from tests.data.corpora import one_line_error, sampled, set_tokens


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


def _in_sample(shard: str, value):
    """A shard changed in place at a token every open reads (in the middle sampled block)."""
    def fault(root: Path):
        at = np.flatnonzero(sampled(root, shard))
        set_tokens(root, shard, at[len(at) // 2], value)
    return fault


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
    for name, kind in tokencheck.SAMPLE_SHARD_FIELDS.items():
        faults += [(f"shard without {name}", "meta.json", _del(("shards", 1, name))),
                   (f"shard {name} of another type", "meta.json", _set(("shards", 1, name), _wrong_type(kind)))]
    for name in tokencheck.SAMPLE:
        faults += [(f"sample without {name}", "meta.json", _del(("sample", name))),
                   (f"sample {name} of another type", "meta.json", _set(("sample", name), "seven"))]
    faults += [("a sample of one block", "meta.json", _set(("sample", "blocks"), 1)),
               ("sample blocks of half an id", "meta.json", _set(("sample", "block_bytes"), 3)),
               ("a sample SHA-256 that is not one", "meta.json", _set(("shards", 1, "sample_sha256"), "x" * 64)),
               ("a largest id outside the vocabulary", "meta.json", _set(("shards", 1, "max_id"), 258)),
               ("a largest id below the shard's ids", "tokens-00001.bin", _set(("shards", 1, "max_id"), 100)),
               ("a sampled token past the vocabulary", "tokens-00001.bin", _in_sample("tokens-00001.bin", 300)),
               ("a sampled token above the shard's largest", "tokens-00001.bin", _in_sample("tokens-00001.bin", 257)),
               ("a sampled token changed in range", "tokens-00001.bin",
                _in_sample("tokens-00001.bin", lambda t: (t + 1) % 256))]
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


def _outside_sample(shard: str, value, seal: bool = False):
    """A shard changed in place at a token no open reads; `seal`: its SHA-256 in meta.json then
    updated, so that only a scan of its ids can tell."""
    def fault(root: Path):
        at = np.flatnonzero(~sampled(root, shard))
        set_tokens(root, shard, at[len(at) // 2], value)
        if seal:
            _set(("shards", int(shard[7:12]), "sha256"), tokencheck.sha256_file(root / shard))(root)
    return fault


def test_data_check_reads_what_the_sample_does_not(token_dir, tmp_path, capsys):
    """A change where no open reads passes the open; `seamkit data check DIR` reads every shard
    and exits 1 on one line naming it: a changed byte by the shard's SHA-256, a token id past the
    vocabulary by its scan of the ids even under a SHA-256 updated to match.

    Planted faults this catches: `data check` not reading the shards (`full` ignored), and the
    full check's id scan removed (the sealed shard passes)."""
    prepared = tokens.open_corpus(token_dir, "bytes")
    assert cli.main(["data", "check", str(token_dir)]) == 0
    assert capsys.readouterr().out == f"ok: {len(prepared.shards)} shards, {prepared.n_tokens():,} tokens\n"
    for where, fault, want in [
            ("a", _outside_sample("tokens-00002.bin", lambda t: (t + 1) % 256), "SHA-256 differs"),
            ("b", _outside_sample("tokens-00002.bin", 258, seal=True), "token id 258 is outside the tokenizer's 258")]:
        root = _broken_copy(token_dir, tmp_path / where, fault)
        tokens.open_corpus(root, "bytes")
        assert cli.main(["data", "check", str(root)]) == 1
        captured = capsys.readouterr()
        line = one_line_error(captured.err, "data check")
        assert f"{root / 'tokens-00002.bin'}: {want}" in line and captured.out == "", line


def test_a_folder_prepared_without_a_sample_opens(token_dir, tmp_path):
    """A folder whose meta.json predates the sample (no "sample", no per-shard sample_sha256 or
    max_id) opens, and its shards' ids are still checked where the default sample reads.

    Planted faults this catches: the sample's fields required of every meta.json, and the id
    check skipped without them."""
    def old(meta):
        del meta["sample"]
        for shard in meta["shards"]:
            del shard["sample_sha256"], shard["max_id"]

    root = _broken_copy(token_dir, tmp_path / "a", _edit_meta(old))
    assert tokens.open_corpus(root, "bytes").n_docs == tokens.open_corpus(token_dir, "bytes").n_docs
    set_tokens(root, "tokens-00003.bin", 0, 300)
    with pytest.raises(DataError, match="^" + re.escape(f"{root / 'tokens-00003.bin'}: token id 300 is outside")):
        tokens.open_corpus(root, "bytes")


def test_training_on_ids_past_the_vocabulary_where_no_open_reads_is_one_line(token_dir, tmp_path, capsys):
    """`seamkit train` on a folder whose shards hold ids past the vocabulary outside the sample:
    the batch that holds one stops the run in one line naming the shard, before any step, so
    no checkpoint is left behind.

    Planted fault this catches: the batch check removed (`corpus.check_vocab`): an IndexError
    traceback from the embedding."""
    def everywhere(root):
        for shard in sorted(root.glob("tokens-*.bin")):
            set_tokens(root, shard.name, ~sampled(root, shard.name), 300)

    root = _broken_copy(token_dir, tmp_path, everywhere)
    tokens.open_corpus(root, "bytes")
    out = tmp_path / "run"
    code = cli.main(["train", "--preset", "tiny", "--max-steps", "1", "--threads", "1",
                     "--set", f"data.corpus={root}", "--out", str(out)])
    line = one_line_error(capsys.readouterr().err, "train")
    assert code == 2 and "holds token id 300, outside the bytes tokenizer's 258 ids" in line, line
    assert not out.exists()
