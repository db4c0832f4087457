"""seamkit.data.tokenizers: a tokenizer.json of one's own ("hf:PATH"), the shipped one in
data/tokenizers/ first; its ids, its plain-text encoding, and the caches and token folders keyed
on its content."""

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from seamkit import config
from seamkit.data import prepare as P
from seamkit.data.corpus import check_vocab, encode_document
from seamkit.data.errors import DataError, TokenizerMismatch
from seamkit.data.load import load_corpus
from seamkit.data.tokenfiles import open_corpus
from seamkit.data.tokenizers import get_tokenizer
from tests.data.corpora import data_cfg, lemma_docs, write_corpus

pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "data" / "tokenizers" / "wordnet-bpe-2k.json"
NAME = f"hf:{SHIPPED}"
TEXTS = ["plain ascii", "héllo wörld — naïve café, 日本語, emoji 🙂🚀", "tab\tand\nnewline  two spaces",
         "a literal <|endoftext|> and <|im_start|> stay text", "<|endoftext|>", ""]


def wordnet_docs(n: int) -> list[str]:
    with gzip.open(ROOT / "data" / "wordnet.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(next(f))["text"] for _ in range(n)]


def test_shipped_tokenizer_ids_and_round_trip():
    """2,047 ids of its own, <|endoftext|> (id 0) ends documents, 2,047 pads, 2,048 rows; every text,
    WordNet's and non-ASCII alike, decodes to itself, its ids the file's own and never eod or pad.
    Planted: a pad inside the file's ids (pad = n_real - 1) fails the pad checks."""
    tok = get_tokenizer(NAME)
    assert tok is get_tokenizer(NAME)  # one instance while the file is unchanged
    assert (tok.eod, tok.pad, tok.n_vocab) == (0, 2047, 2048) == (0, 2047, config.tokenizer_vocab(NAME))
    for text in wordnet_docs(300) + TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert all(0 <= i < tok.pad for i in ids) and tok.eod not in ids
    doc, prompt = encode_document("lemma: a gloss, naïve", tok)
    assert doc[-1] == tok.eod and tok.eod not in doc[:-1] and tok.decode(doc[:prompt]) == "lemma:"
    assert tok.decode([tok.eod, tok.pad]) == "<|endoftext|>"  # the pad decodes to nothing


def _tokenizer_file(path: Path, specials: list[str]) -> Path:
    """The shipped tokenizer with more special tokens: a file of one's own as hubs hold them."""
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(str(SHIPPED))
    t.add_special_tokens(specials)
    t.save(str(path))
    return path


def test_special_token_text_stays_plain_text(tmp_path):
    """A document holding a special token's text is encoded as text: no special id, same text back.
    Planted: without `encode_special_tokens` the library turns "<|endoftext|>" into id 0 and fails."""
    path = _tokenizer_file(tmp_path / "t.json", ["<|im_start|>", "</s>"])
    tok = get_tokenizer(f"hf:{path}")
    specials = {tok.eod, 2047, 2048}  # <|endoftext|>, then the two added above
    assert tok.n_vocab == 2112 and tok.pad == 2049  # 2,049 ids and the pad, to a multiple of 64
    for text in ("see <|endoftext|> here", "<|im_start|>user</s>", "</s><|endoftext|><|im_start|>"):
        ids = tok.encode(text)
        assert not specials & set(ids), ids
        assert tok.decode(ids) == text


def test_named_end_of_document_token(tmp_path):
    """hf:PATH#TOKEN takes TOKEN's id as the end of a document, and that id keys the caches."""
    path = _tokenizer_file(tmp_path / "t.json", ["<doc>"])
    tok = get_tokenizer(f"hf:{path}#<doc>")
    assert tok.eod == 2047 and encode_document("a: b", tok)[0][-1] == 2047
    assert tok.key != get_tokenizer(f"hf:{path}").key


def test_a_folder_holding_tokenizer_json(tmp_path):
    shutil.copy(SHIPPED, tmp_path / "tokenizer.json")
    tok = get_tokenizer(f"hf:{tmp_path}")
    assert (tok.sha256, tok.n_vocab, tok.encode("gloss")) == (get_tokenizer(NAME).sha256, 2048,
                                                               get_tokenizer(NAME).encode("gloss"))


def _swap_ids(path: Path, a: str, b: str) -> None:
    """Edit a tokenizer.json so that the tokens a and b trade ids: the same text, other ids."""
    d = json.loads(path.read_text(encoding="utf-8"))
    vocab = d["model"]["vocab"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(d), encoding="utf-8")


def test_cache_follows_the_tokenizer_file(tmp_path):
    """A corpus cached under a tokenizer.json is tokenized again once the file changes (here two
    tokens trade ids), never read back with the old ids. Planted: the cache keyed on the
    tokenizer's name (hf:PATH) alone returns the old ids and fails."""
    path = tmp_path / "t.json"
    shutil.copy(SHIPPED, path)
    cfg = data_cfg(tmp_path, write_corpus(tmp_path / "c.jsonl", lemma_docs(60)), tokenizer=f"hf:{path}")
    before = load_corpus(cfg)
    old = get_tokenizer(cfg.tokenizer)
    _swap_ids(path, "a", "e")
    after = load_corpus(cfg)
    assert after.tokenizer.key != old.key and after.tokenizer.sha256 != old.sha256
    assert not np.array_equal(after.tokens, before.tokens)
    assert np.array_equal(after.tokens[after.offsets[0]:after.offsets[1]],
                          encode_document(lemma_docs(60)[0], after.tokenizer)[0])
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2
    assert after.summary()["tokenizer_sha256"] == after.tokenizer.sha256


def test_token_folder_records_the_tokenizer_file(tmp_path):
    """A token folder prepared with a tokenizer.json opens with that file, at its path or a copy
    elsewhere, holds uint16 ids below 2,048, and is refused in one line once the file changed.
    Planted: prepare not writing meta.json's tokenizer_key lets the changed file through."""
    path = tmp_path / "t.json"
    shutil.copy(SHIPPED, path)
    docs = lemma_docs(80)
    P.prepare([write_corpus(tmp_path / "c.jsonl", docs)], f"hf:{path}", tmp_path / "tok", workers=1, progress=False)
    c = open_corpus(tmp_path / "tok", f"hf:{path}")
    assert c.meta["dtype"] == "uint16" and max(sh["max_id"] for sh in c.meta["shards"]) < 2047
    ids = np.concatenate([c.doc(i) for i in range(c.n_docs)])
    check_vocab(c, ids, list(range(c.n_docs)), [c.doc(i) for i in range(c.n_docs)])
    assert c.tokenizer.decode(c.doc(5)[:-1]) == docs[5]
    shutil.copy(SHIPPED, tmp_path / "elsewhere.json")
    assert open_corpus(tmp_path / "tok", f"hf:{tmp_path / 'elsewhere.json'}").n_docs == 80
    with pytest.raises(TokenizerMismatch, match="prepared with tokenizer hf:"):
        open_corpus(tmp_path / "tok", "bytes")
    _swap_ids(path, "a", "e")
    for asked in (f"hf:{path}", None):  # what the config names, and `data check`'s own reading
        with pytest.raises(TokenizerMismatch, match="as it was then") as e:
            open_corpus(tmp_path / "tok", asked)
        assert "\n" not in str(e.value)


def test_workers_refuse_a_tokenizer_file_changed_midway(tmp_path):
    """A worker process reads the tokenizer.json again: if it changed since prepare started, the
    chunk is refused rather than written with other ids. Planted: no key check in _encode_chunk."""
    path = tmp_path / "t.json"
    shutil.copy(SHIPPED, path)
    key = get_tokenizer(f"hf:{path}").key
    assert P._encode_chunk(f"hf:{path}", key, ["a: b"])["tokens"][-1] == 0
    _swap_ids(path, "a", "e")
    with pytest.raises(DataError, match="the tokenizer file changed while data prepare ran"):
        P._encode_chunk(f"hf:{path}", key, ["a: b"])


def test_unreadable_tokenizer_is_a_data_error(tmp_path):
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    for name, says in ((f"hf:{tmp_path / 'none.json'}", "no such file"), (f"hf:{tmp_path / 'bad.json'}",
                                                                          r"is not a tokenizer.json \(")):
        with pytest.raises(DataError, match=says) as e:
            get_tokenizer(name)
        assert str(e.value).startswith(f"data.tokenizer={name}: ") and "\n" not in str(e.value)


def test_tiny_run_end_to_end(tmp_path):
    """The tiny preset with the shipped tokenizer.json and model.vocab from it: the config builds,
    a corpus loads, and a batch of it goes through the model to a finite loss."""
    import torch

    from seamkit.data.rows import RowLoader
    from seamkit.model import GPT, lm_loss
    cfg = config.override(config.tiny(), {"data.tokenizer": NAME, "model.vocab": config.tokenizer_vocab(NAME)})
    assert config.from_dict(cfg.to_dict()) == cfg  # what checkpoints and reports keep reads back
    data = data_cfg(tmp_path, write_corpus(tmp_path / "c.jsonl", wordnet_docs(200)), tokenizer=NAME)
    corpus = load_corpus(data)
    x, y = RowLoader(corpus, "train", cfg.data.batch, cfg.model.seq, seed=0).next()
    assert int(max(x.max(), y.max())) < corpus.tokenizer.pad and (x == corpus.tokenizer.eod).any()
    torch.manual_seed(0)
    assert torch.isfinite(lm_loss(GPT(cfg.model)(x), y))
