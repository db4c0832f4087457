"""seamkit.data.tokenizers: the "bytes" and "qwen" tokenizers."""

import pytest

from seamkit import config
from seamkit.data.errors import DataError
from seamkit.data.tokenizers import get_tokenizer

TEXTS = ["plain ascii", "héllo wörld — naïve café, 日本語, emoji 🙂🚀", "tab\tand\nnewline",
         "a literal <|endoftext|> and <|im_start|> stay text", ""]


@pytest.mark.parametrize("name", ["bytes", "qwen"])
def test_tokenizer_round_trip(name):
    tok = get_tokenizer(name)
    assert tok is get_tokenizer(name)  # one shared instance
    assert tok.n_vocab == config.tokenizer_vocab(name)
    assert 0 <= tok.eod < tok.n_vocab and 0 <= tok.pad < tok.n_vocab and tok.eod != tok.pad
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert tok.eod not in ids and tok.pad not in ids
        assert all(0 <= i < tok.n_vocab for i in ids)
    # eod and pad decode to nothing the text could be confused with
    assert tok.decode(tok.encode("ab") + [tok.pad]).startswith("ab")


def test_qwen_ids():
    tok = get_tokenizer("qwen")
    assert (tok.eod, tok.pad, tok.n_vocab) == (151643, 151935, 151936)
    assert tok.encode("<|endoftext|>") != [tok.eod]
    assert tok.decode([tok.eod]) == "<|endoftext|>"  # the special id itself still decodes


def test_unknown_tokenizer():
    with pytest.raises(DataError, match="unknown tokenizer"):
        get_tokenizer("gpt2")
