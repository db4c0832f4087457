"""`load_corpus`: the corpus a run config names, a document file held in memory or a token directory."""

from __future__ import annotations

from seamkit.config import DataConfig
from seamkit.data.corpus import Corpus, cached_corpus
from seamkit.data.documents import corpus_path
from seamkit.data.tokenfiles import open_corpus
from seamkit.data.tokenizers import get_tokenizer


def load_corpus(cfg: DataConfig) -> Corpus:
    """Tokenize `cfg.corpus` with `cfg.tokenizer`, or load it from `cfg.cache_dir` (`cached_corpus`).

    A directory is a token-file corpus from `seamkit data prepare`: it is memory-mapped, not
    loaded (seamkit.data.tokenfiles).
    """
    tok = get_tokenizer(cfg.tokenizer)
    path = corpus_path(cfg.corpus)
    if path.is_dir():
        return open_corpus(path, tok.name)
    return cached_corpus(path, tok, cfg.cache_dir)
