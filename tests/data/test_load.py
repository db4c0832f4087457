"""seamkit.data.load: the corpus a run config names, a file in memory or a token directory."""

import pytest

from seamkit.data import tokenfiles
from seamkit.data.corpus import Corpus
from seamkit.data.errors import DataError
from seamkit.data.load import load_corpus
from tests.data.corpora import data_cfg, lemma_docs, write_corpus


def test_load_corpus_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such corpus file"):
        load_corpus(data_cfg(tmp_path, tmp_path / "nope.txt"))


def test_a_file_is_held_in_memory_and_a_folder_is_mapped(tmp_path, token_dir):
    """Planted fault this catches: a token folder read as a corpus file (or the reverse)."""
    mem = load_corpus(data_cfg(tmp_path, write_corpus(tmp_path / "c.txt", lemma_docs(30))))
    assert type(mem) is Corpus and mem.n_docs == 30
    mapped = load_corpus(data_cfg(tmp_path, token_dir))
    assert isinstance(mapped, tokenfiles.TokenCorpus) and mapped.root == token_dir
    with pytest.raises(DataError, match="prepared with tokenizer bytes, the config asks for qwen"):
        load_corpus(data_cfg(tmp_path, token_dir, tokenizer="qwen"))
