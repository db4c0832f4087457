"""The one exception the data package raises."""

from seamkit.config import SeamkitError


class DataError(SeamkitError, ValueError):
    """A corpus or a request for batches that cannot work; the message is one line naming the file."""


class TokenizerMismatch(DataError):
    """A token corpus prepared with another tokenizer than the one asked for."""

    def __init__(self, message: str, prepared: str):
        super().__init__(message)
        self.prepared = prepared  # the tokenizer the corpus was prepared with
