"""The one exception the data package raises."""

from seamkit.config import SeamkitError


class DataError(SeamkitError, ValueError):
    """A corpus or a request for batches that cannot work; the message is one line naming the file."""
