"""Token folders shared by the data tests: prepared once for the session."""

import shutil

import pytest

from seamkit.data import prepare as P
from seamkit.data import tokenfiles
from seamkit.data.load import load_corpus
from tests.data.corpora import (
    data_cfg,
    lemma_docs,
    sampled,
    set_tokens,
    write_corpus,
    write_sources,
)

SMALL_SAMPLE = {"blocks": 3, "block_bytes": 256}  # 768 of a shard's 6 kB: the first, middle and last 256


@pytest.fixture(scope="session")
def docs():
    return lemma_docs(900, seed=4)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, docs):
    """The same documents prepared in this process and by 2 worker processes, in small shards of
    which every open reads a small sample (so a shard has bytes that only a full check reads)."""
    tmp = tmp_path_factory.mktemp("tok")
    files = write_sources(tmp, docs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(P, "CHUNK_CHARS", 2000)  # many tasks, so the workers' results must come back in order
        mp.setattr(P, "SAMPLE", SMALL_SAMPLE)
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


@pytest.fixture
def past_vocab(token_dir, tmp_path):
    """A copy of `token_dir` where one train document of shard 2, outside every sampled block,
    starts with id 300 (past the bytes vocabulary): (folder, document, shard)."""
    root = tmp_path / "tok"
    shutil.copytree(token_dir, root)
    c = tokenfiles.open_corpus(root, "bytes")
    shard = c.meta["shards"][2]
    unread = ~sampled(root, shard["file"])
    i = next(int(i) for i in c.splits["train"] if shard["first_doc"] <= i < shard["first_doc"] + shard["docs"]
             and unread[c.offsets[i] - shard["first_token"]:c.offsets[i + 1] - shard["first_token"]].all())
    set_tokens(root, shard["file"], int(c.offsets[i] - shard["first_token"]), 300)
    return root, i, shard["file"]
