import pytest

from seamkit import config as C
from seamkit.data.load import load_corpus


@pytest.fixture(scope="session")
def corpus():
    """The tiny preset's corpus, loaded once for every test of seams/."""
    return load_corpus(C.tiny().data)
