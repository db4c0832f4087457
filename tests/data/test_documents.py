"""seamkit.data.documents: corpus files of every format, their failures in one line, the shipped
corpus, and the seed-free train/val/test split."""

import gzip

import pytest

from seamkit.cli import main as cli_main
from seamkit.data import documents
from seamkit.data.documents import load_documents, split_documents
from seamkit.data.errors import DataError
from tests.data.corpora import (
    BROKEN,
    FORMATS,
    broken_file,
    good_bytes,
    lemma_docs,
    one_line_error,
)


def test_load_txt_and_jsonl(tmp_path):
    txt = "first: doc\nstill first\n\n\n  \nsecond: doc  \n\n\t\nthird\n"
    expect = ["first: doc\nstill first", "second: doc", "third"]
    (tmp_path / "a.txt").write_text(txt)
    with gzip.open(tmp_path / "a.txt.gz", "wt") as f:
        f.write(txt)
    jsonl = '{"text": "first: doc\\nstill first"}\n\n{"text": "second: doc", "id": 2}\n{"text": "third"}\n'
    (tmp_path / "a.jsonl").write_text(jsonl)
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write(jsonl)
    assert load_documents(str(tmp_path / "a.txt")) == expect
    assert load_documents(str(tmp_path / "a.txt.gz")) == expect
    assert load_documents(str(tmp_path / "a.jsonl")) == expect
    assert load_documents(str(tmp_path / "a.jsonl.gz")) == expect


def test_every_format_reads(tmp_path):
    """The good file of each format holds its documents: what FAULTS breaks is a working file."""
    docs = lemma_docs(40)
    for kind in FORMATS:
        path = tmp_path / f"ok.{kind}"
        path.write_bytes(good_bytes(kind, docs))
        assert documents.corpus_kind(path) == kind.removesuffix(".gz")
        assert load_documents(str(path)) == docs


@pytest.mark.parametrize("kind, fault", BROKEN)
def test_broken_corpus_file_is_one_line(tmp_path, kind, fault):
    """Every format, broken every way its reader can fail: one DataError line naming the file."""
    path = broken_file(tmp_path, kind, fault)
    with pytest.raises(DataError) as e:
        load_documents(str(path))
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kind, fault", BROKEN)
def test_train_on_a_broken_corpus_file(tmp_path, kind, fault, capsys):
    """`seamkit train --set data.corpus=FILE`: exit 2, one line naming the file, nothing written."""
    path, out = broken_file(tmp_path, kind, fault), tmp_path / "run"
    code = cli_main(["train", "--preset", "tiny", "--max-steps", "1", "--threads", "1", "--set",
                     f"data.corpus={path}", "--set", f"data.cache_dir={tmp_path / 'cache'}", "--out", str(out)])
    assert code == 2 and str(path) in one_line_error(capsys.readouterr().err, "train")
    assert not out.exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("name, content, match", [
    ("corpus.csv", "a,b\n", "unknown corpus format"),
    ("corpus.parquet.gz", "x", "unknown corpus format"),
    ("missing.txt", None, "no such corpus file"),
])
def test_bad_corpus_names_the_file(tmp_path, name, content, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=match) as e:
        load_documents(str(path))
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_shipped_wordnet():
    docs = load_documents("wordnet")
    assert len(docs) == 117659  # 82115 noun + 13767 verb + 18156 adj + 3621 adv synsets
    assert docs[0].startswith("entity: that which is perceived")
    assert all(": " in d and "_" not in d.split(":", 1)[0] for d in docs)
    sizes = {s: len(v) for s, v in split_documents(docs).items()}
    assert sizes == {"train": 115325, "val": 1167, "test": 1167}


def test_shipped_corpus_behind_a_link_git_wrote_as_text(tmp_path, monkeypatch):
    """A checkout without symlinks holds the link as a text file naming its target: data/ is read."""
    corpora, data_dir = tmp_path / "corpora", tmp_path / "data"
    corpora.mkdir()
    data_dir.mkdir()
    monkeypatch.setattr(documents, "CORPORA_DIR", corpora)
    monkeypatch.setattr(documents, "DATA_DIR", data_dir)
    with gzip.open(data_dir / "c.jsonl.gz", "wt") as f:
        f.write('{"text": "a: b"}\n')
    assert documents._shipped("c.jsonl.gz") == data_dir / "c.jsonl.gz"  # no file inside the package
    (corpora / "c.jsonl.gz").write_text("../../data/c.jsonl.gz")  # what git writes for the link
    assert documents._shipped("c.jsonl.gz") == data_dir / "c.jsonl.gz"
    assert load_documents(documents._shipped("c.jsonl.gz")) == ["a: b"]
    (corpora / "c.jsonl.gz").unlink()
    (corpora / "c.jsonl.gz").write_bytes((data_dir / "c.jsonl.gz").read_bytes())  # a wheel's copy
    assert documents._shipped("c.jsonl.gz") == corpora / "c.jsonl.gz"


# ----------------------------------------------------------------------------- split

def test_split_deterministic_disjoint_and_content_based():
    docs = [f"doc {i}: {i * 7919 % 1000}" for i in range(5000)]
    s = split_documents(docs)
    assert s == split_documents(list(docs))
    all_ids = s["train"] + s["val"] + s["test"]
    assert sorted(all_ids) == list(range(5000))  # disjoint and complete
    for ids in s.values():
        assert ids == sorted(ids)
    # about 1% each: the hash makes each count Binomial(5000, 0.01), sd 7, so 20..80 is > 4 sd
    assert 20 <= len(s["val"]) <= 80 and 20 <= len(s["test"]) <= 80
    # the split follows the text, not the position
    rev = split_documents(docs[::-1])
    for name in s:
        assert sorted(4999 - i for i in rev[name]) == s[name]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 10, 99, 100, 150])
def test_split_tiny_corpora(n):
    s = split_documents([f"d{i}" for i in range(n)])
    assert sorted(s["train"] + s["val"] + s["test"]) == list(range(n))
    if n >= 3:
        assert len(s["val"]) >= 1 and len(s["test"]) >= 1 and len(s["train"]) >= 1
    else:
        assert s["train"] == list(range(n))
