"""seamkit.data.corpus: a corpus's arrays, and the on-disk cache of an in-memory corpus."""

import numpy as np
import pytest

from seamkit.data.documents import SPLITS, split_documents
from seamkit.data.load import load_corpus
from seamkit.data.tokenizers import get_tokenizer
from tests.data.corpora import data_cfg, lemma_docs, write_corpus


@pytest.mark.parametrize("tokenizer", ["bytes", "qwen"])
def test_corpus_layout(tmp_path, tokenizer):
    docs = lemma_docs(60) + ["no colon here", "two: colons: here", "<|endoftext|>: literal"]
    cfg = data_cfg(tmp_path, write_corpus(tmp_path / "c.jsonl", docs), tokenizer)
    c = load_corpus(cfg)
    tok = c.tokenizer
    assert c.name == "c" and c.n_docs == len(docs) and tok is get_tokenizer(tokenizer)
    assert c.tokens.dtype == np.int32 and c.offsets.dtype == np.int64
    assert c.prompt_len.dtype == np.int32 and c.words.dtype == np.int32
    assert c.offsets[0] == 0 and c.offsets[-1] == len(c.tokens)
    for i, text in enumerate(docs):
        k = text.find(":") + 1
        prompt = tok.encode(text[:k]) if k else []
        assert c.doc(i).tolist() == prompt + tok.encode(text[k:]) + [tok.eod]
        assert c.prompt_len[i] == len(prompt)
        assert c.words[i] == len(text.split())
        assert tok.decode(c.doc(i)[:-1]) == text
        assert (c.doc(i) == tok.eod).sum() == 1  # the literal "<|endoftext|>" is not eod
    assert c.prompt_len[docs.index("no colon here")] == 0
    split = split_documents(docs)
    for name in SPLITS:
        assert c.splits[name].dtype == np.int64 and c.splits[name].tolist() == split[name]


def test_cache_hit_skips_tokenizing(tmp_path, monkeypatch):
    path = write_corpus(tmp_path / "c.txt", lemma_docs(50))
    cfg = data_cfg(tmp_path, path)
    first = load_corpus(cfg)

    def boom(text):
        raise AssertionError("tokenized again despite the cache")
    monkeypatch.setattr(get_tokenizer("bytes"), "encode", boom)
    second = load_corpus(cfg)
    for f in ("tokens", "offsets", "prompt_len", "words"):
        assert np.array_equal(getattr(first, f), getattr(second, f))
    assert all(np.array_equal(first.splits[s], second.splits[s]) for s in SPLITS)
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.suffix != ".npz"] == []  # no tmp left

    write_corpus(path, lemma_docs(51))  # edited corpus -> new key -> tokenized again
    with pytest.raises(AssertionError, match="tokenized again"):
        load_corpus(cfg)


def test_damaged_cache_is_rebuilt(tmp_path):
    cfg = data_cfg(tmp_path, write_corpus(tmp_path / "c.txt", lemma_docs(20)))
    first = load_corpus(cfg)
    (cache,) = (tmp_path / "cache").glob("*.npz")
    cache.write_bytes(cache.read_bytes()[:100])
    assert np.array_equal(load_corpus(cfg).tokens, first.tokens)
