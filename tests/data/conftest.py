"""Token folders shared by the data tests: prepared once for the session."""

import pytest

from seamkit.data import prepare as P
from seamkit.data import tokenfiles
from seamkit.data.load import load_corpus
from tests.data.corpora import data_cfg, lemma_docs, write_corpus, write_sources


@pytest.fixture(scope="session")
def docs():
    return lemma_docs(900, seed=4)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, docs):
    """The same documents prepared in this process and by 2 worker processes, in small shards."""
    tmp = tmp_path_factory.mktemp("tok")
    files = write_sources(tmp, docs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(P, "CHUNK_CHARS", 2000)  # many tasks, so the workers' results must come back in order
        out = []
        for workers in (1, 2):
            P.prepare(files, "bytes", tmp / f"w{workers}", workers=workers, shard_tokens=3000, progress=False)
            out.append(tokenfiles.open_corpus(tmp / f"w{workers}", "bytes"))
    return tuple(out)


@pytest.fixture(scope="session")
def token_dir(prepared):
    """A good token folder of several shards, to copy and break."""
    return prepared[0].root


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A 400-document bytes corpus (about 4 val and 4 test documents), in memory."""
    tmp = tmp_path_factory.mktemp("corpus")
    return load_corpus(data_cfg(tmp, write_corpus(tmp / "c.jsonl", lemma_docs(400))))
