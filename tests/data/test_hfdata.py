"""seamkit.data.hfdata: `seamkit data prepare --hf PATH[:SPLIT]`, a `datasets` dataset on disk
through the writer corpus files go through: the same token folder as the same documents in a
file, every bad input one line with nothing left behind."""

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from seamkit import cli
from seamkit.data import prepare as P
from seamkit.data import tokenfiles
from seamkit.data.hfdata import NEEDS
from tests.data.corpora import lemma_docs, one_line_error, write_corpus

datasets = pytest.importorskip("datasets")

DOCS = lemma_docs(120, seed=7)
TEST_DOCS = lemma_docs(30, seed=8)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Every kind of folder --hf reads, and ones it must refuse."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    root = tmp_path_factory.mktemp("hf")
    train = datasets.Dataset.from_dict({"id": list(range(len(DOCS) + 1)), "text": DOCS[:40] + [None] + DOCS[40:]})
    test = datasets.Dataset.from_dict({"body": TEST_DOCS, "lang": ["en"] * len(TEST_DOCS)})
    with _quiet():
        train.save_to_disk(str(root / "saved"))
        datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(root / "dict"))
        # rows filtered away (a dataset built empty is saved without a shard, which load_from_disk refuses)
        datasets.Dataset.from_dict({"text": ["x"]}).filter(lambda r: False, keep_in_memory=True).save_to_disk(
            str(root / "empty"))
    (root / "hub" / "data").mkdir(parents=True)  # the Hub's layout: the split in each file's name
    pq.write_table(pa.table({"content": DOCS[:60], "n": list(range(60))}),
                   root / "hub" / "data" / "train-00000-of-00002.parquet")
    pq.write_table(pa.table({"content": DOCS[60:], "n": list(range(60))}),
                   root / "hub" / "data" / "train-00001-of-00002.parquet")
    pq.write_table(pa.table({"content": TEST_DOCS, "n": list(range(30))}),
                   root / "hub" / "data" / "test-00000-of-00001.parquet")
    (root / "arrow").mkdir()  # save_to_disk's Arrow file alone: a folder of .arrow files
    shutil.copy(next((root / "saved").glob("*.arrow")), root / "arrow" / "part.arrow")
    (root / "two").mkdir()
    pq.write_table(pa.table({"title": DOCS[:5], "body": DOCS[5:10]}), root / "two" / "x.parquet")
    (root / "titled").mkdir()  # more than one string column, one of them named text
    pq.write_table(pa.table({"title": DOCS[10:15], "text": DOCS[:5], "url": ["u"] * 5}), root / "titled" / "x.parquet")
    (root / "numbers").mkdir()
    pq.write_table(pa.table({"n": [1, 2]}), root / "numbers" / "x.parquet")
    (root / "text").mkdir()
    (root / "text" / "a.txt").write_text("not a dataset\n")
    return root


class _quiet:
    def __enter__(self):
        datasets.utils.disable_progress_bars()

    def __exit__(self, *exc):
        datasets.utils.enable_progress_bars()


def _docs(root: Path) -> list[str]:
    c = tokenfiles.open_corpus(root, "bytes")
    return [c.tokenizer.decode(c.doc(i)[:-1]) for i in range(c.n_docs)]


def test_saved_dataset_is_the_same_folder_as_its_file(folders, tmp_path):
    """A saved Dataset prepares into the token folder its documents make as a .jsonl file, shard for
    shard and split for split, the null row skipped. Planted: a reader that yields the row index
    instead of the text, or that drops the last batch, fails the equality."""
    P.prepare(None, "bytes", tmp_path / "hf", workers=1, progress=False, hf=str(folders / "saved"))
    P.prepare([write_corpus(tmp_path / "c.jsonl", DOCS)], "bytes", tmp_path / "file", workers=1, progress=False)
    hf, file = (tokenfiles.open_corpus(tmp_path / name, "bytes") for name in ("hf", "file"))
    assert hf.meta["sources"] == [str(folders / "saved")] and hf.meta["text_column"] == "text"
    for name in ("tokens-00000.bin", "offsets.bin", "prompt_len.bin", "words.bin",
                 "split-train.bin", "split-val.bin", "split-test.bin"):
        assert (tmp_path / "hf" / name).read_bytes() == (tmp_path / "file" / name).read_bytes(), name
    assert {s: len(hf.splits[s]) for s in hf.splits} == {s: len(file.splits[s]) for s in file.splits}


@pytest.mark.parametrize("spec, docs, column, named", [
    ("dict", DOCS, "text", None), ("dict:test", TEST_DOCS, "body", "body"), ("hub", DOCS, "content", None),
    ("hub:test", TEST_DOCS, "content", None), ("arrow", DOCS, "text", None), ("two", DOCS[5:10], "body", "body"),
    ("titled", DOCS[:5], "text", None)])
def test_splits_and_text_columns(folders, tmp_path, spec, docs, column, named):
    """A DatasetDict's train split unless :SPLIT names another; a folder of parquet (split by file
    names) or arrow files, streamed; the text column named, or found: text, else content, else the
    only string column. Planted: the name ignored (titled has three string columns) fails."""
    P.prepare(None, "bytes", tmp_path / "tok", workers=1, progress=False, hf=str(folders / spec), text_column=named)
    assert _docs(tmp_path / "tok") == docs
    assert tokenfiles.open_corpus(tmp_path / "tok", "bytes").meta["text_column"] == column


def test_hf_with_an_hf_tokenizer(folders, tmp_path, capsys):
    """The CLI end to end with the shipped tokenizer.json, and the line it prints to train from."""
    shipped = Path(__file__).resolve().parents[2] / "data" / "tokenizers" / "wordnet-bpe-2k.json"
    pytest.importorskip("tokenizers")
    out = tmp_path / "tok"
    assert cli.main(["data", "prepare", "--hf", f"{folders / 'dict'}:test", "--tokenizer", f"hf:{shipped}",
                     "--out", str(out), "--workers", "1", "--text-column", "body"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (f"train from it: --set data.corpus={out} --set "
                                                        f"data.tokenizer=hf:{shipped} --set model.vocab=2048")
    c = tokenfiles.open_corpus(out, f"hf:{shipped}")
    assert [c.tokenizer.decode(c.doc(i)[:-1]) for i in range(c.n_docs)] == TEST_DOCS
    assert np.concatenate([c.doc(i) for i in range(c.n_docs)]).max() < 2047


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


BAD = {"missing folder": ("nowhere", [], "nowhere: no such folder"),
       "a file": ("text/a.txt", [], "not a folder; --hf takes"),
       "not a dataset": ("text", [], "not a dataset: save_to_disk did not write it"),
       "no such split": ("dict:valid", [], "no split 'valid'; its splits: train, test"),
       "split of a single dataset": ("saved:train", [], "a single dataset, without splits; drop :train"),
       "no text column": ("numbers", [], "no text column: none of its columns holds strings (columns: n)"),
       "two string columns": ("two", [], "which column is the text? It has string columns title, body"),
       "named column missing": ("dict", ["--text-column", "body"], "no string column 'body' (columns: id, text)"),
       "empty dataset": ("empty", [], "no documents (0 rows)")}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_leaves_nothing(folders, tmp_path, monkeypatch, case, capsys):
    """Exit 2, one line naming the problem, no output folder (nor the folders above it), and no
    datasets cache left in the temporary folder or in datasets' own cache."""
    spec, flags, says = BAD[case]
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    (tmp_path / "tmp").mkdir()
    before = _listing(tmp_path)
    argv = ["data", "prepare", "--hf", str(folders / spec), "--tokenizer", "bytes",
            "--out", str(tmp_path / "new" / "tok"), "--workers", "1", *flags]
    assert cli.main(argv) == 2
    assert says in one_line_error(capsys.readouterr().err, "data")
    assert _listing(tmp_path) == before


def test_streamed_folder_leaves_no_cache(folders, tmp_path, monkeypatch):
    """A streamed folder writes datasets' cache (its locks) into a temporary folder, removed after:
    nothing in ~/.cache/huggingface. Planted: load_dataset without cache_dir fills HF_DATASETS_CACHE."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    (tmp_path / "tmp").mkdir()
    P.prepare(None, "bytes", tmp_path / "tok", workers=1, progress=False, hf=str(folders / "hub"))
    assert not (tmp_path / "hf-cache").exists() or not any((tmp_path / "hf-cache").iterdir())
    assert not any((tmp_path / "tmp").iterdir())


def test_interrupted_hf_prepare_leaves_nothing(folders, tmp_path, monkeypatch, capsys):
    """Ctrl-C after the first chunk is written: exit 130, no output, no temporary folder."""
    monkeypatch.setattr(P, "CHUNK_CHARS", 300)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    write = P._Writer.write

    def interrupted(self, c):
        write(self, c)
        raise KeyboardInterrupt

    monkeypatch.setattr(P._Writer, "write", interrupted)
    before = _listing(tmp_path)
    assert cli.main(["data", "prepare", "--hf", str(folders / "hub"), "--tokenizer", "bytes",
                     "--out", str(tmp_path / "tok"), "--workers", "1"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert _listing(tmp_path) == before


def test_missing_datasets_package_is_one_line(folders, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    assert cli.main(["data", "prepare", "--hf", str(folders / "saved"), "--tokenizer", "bytes",
                     "--out", str(tmp_path / "tok")]) == 2
    assert one_line_error(capsys.readouterr().err, "data") == f"seamkit data: error: {NEEDS}"
    assert not (tmp_path / "tok").exists()


def test_corpus_and_hf_exclude_each_other(folders, tmp_path, capsys):
    good = write_corpus(tmp_path / "c.jsonl", DOCS)
    with pytest.raises(SystemExit) as e:
        cli.main(["data", "prepare", "--corpus", str(good), "--hf", str(folders / "saved"), "--out", str(tmp_path / "t")])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
