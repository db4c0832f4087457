"""seamkit.data.errors: the package's one exception, which the command line prints as one line."""

import pytest

from seamkit.config import SeamkitError
from seamkit.data import tokenfiles
from seamkit.data.errors import DataError, TokenizerMismatch


def test_a_tokenizer_mismatch_names_the_tokenizer_a_folder_was_prepared_with(token_dir):
    """What a caller needs to say what would work (prune-check names the checkpoint's tokenizer)
    travels with the error, beside a message that is a DataError like any other.

    Planted fault this catches: `open_corpus` raising a plain DataError for the mismatch (the
    pruning study could then only pass its text on, not say which corpus would do)."""
    with pytest.raises(TokenizerMismatch) as e:
        tokenfiles.open_corpus(token_dir, "qwen")
    assert e.value.prepared == "bytes" and isinstance(e.value, DataError) and isinstance(e.value, SeamkitError)
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    assert str(e.value).startswith(f"{token_dir}: prepared with tokenizer bytes, the config asks for qwen")
