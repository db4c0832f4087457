import fcntl
import os
import signal
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).resolve().parent / "reference"  # byte copies of the reference reports (SHA256SUMS)
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"

# Tests are small; one thread keeps them deterministic and leaves the other core free. The
# entry points that choose their own count (train.threads=0, seamkit.threads) take it from
# SEAMKIT_THREADS, here and in every process a test starts.
os.environ.setdefault("SEAMKIT_THREADS", os.environ.get("SEAMKIT_TEST_THREADS", "1"))
torch.set_num_threads(int(os.environ["SEAMKIT_THREADS"]))


# `make test` runs the suite on two pytest-xdist workers (`--dist loadfile`). A file's tests go to
# one worker, so its module fixtures are built once; the files that share a costly session fixture
# form one group (`SHARED`) and go to one worker too. Groups start in the order of `FIRST`, the
# longest first, so that none starts last while the other worker idles; then in collection order.
SHARED = {"tests/sweep/": "sweep", "tests/test_notebooks.py": "reproduce", "tests/test_reproduce.py": "reproduce",
          "tests/test_schema_doc.py": "reproduce"}
SESSION = {"swept": "sweep", "reproduced": "reproduce"}  # the costly session fixtures and their groups
FIRST = ("tests/test_findings.py", "sweep", "tests/test_gpu_check.py", "reproduce", "tests/seams/test_study.py",
         "tests/seams/test_bounds.py", "tests/seams/test_stages.py")


def group_of(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return next((g for prefix, g in SHARED.items() if path.startswith(prefix)), path)


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, group in SESSION.items():
            if fixture in getattr(item, "fixturenames", ()) and group_of(item.nodeid) != group:
                raise pytest.UsageError(f"{item.nodeid} uses the session fixture {fixture}: put its file in "
                                        f"tests/conftest.py's SHARED group {group!r}, or each worker builds it")
    rank = {g: i for i, g in enumerate(FIRST)}
    items.sort(key=lambda it: rank.get(group_of(it.nodeid), len(FIRST)))  # stable: collection order within


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Groups(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)
    return Groups(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under xdist, a test marked `alone` (it measures the machine's load) runs while the other
    workers wait: it holds the run's lock exclusively, every other test shares it."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return (yield)
    # each worker's temporary folder lies in the run's, which pytest prunes like any other
    lock = item.config._tmp_path_factory.getbasetemp().parent / "alone.lock"
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if item.get_closest_marker("alone") else fcntl.LOCK_SH)
        return (yield)


@pytest.fixture
def reference_dir() -> Path:
    return REFERENCE


@pytest.fixture(scope="session")
def reproduced(tmp_path_factory):
    """`seamkit reproduce` at the tiny preset, run once for the session: both notebooks under
    papermill, the pruning one on the checkpoint the seams one left (tests/test_reproduce.py,
    tests/test_notebooks.py)."""
    from seamkit.reproduce import reproduce
    out = tmp_path_factory.mktemp("reproduce") / "reports"
    return out, reproduce(preset="tiny", out_dir=out, overrides=REPRODUCE_TINY, parameters=REPRODUCE_PARAMETERS,
                          echo=False)


# the smallest run that still runs every cell: one device (nothing to calibrate), one window and
# sample, the eager pruning reference (the one inductor compile is tests/pruning/test_reference.py's),
# the forecast at N=1 alone
REPRODUCE_TINY = {"train.budget_seconds": 1.0, "seams.devices": 1, "prune.windows": 1, "prune.samples": 1,
                  "prune.warmup": 0, "prune.reference": "eager"}
REPRODUCE_PARAMETERS = {"forecast_devices": "1"}


def default_sigint() -> None:
    """`preexec_fn` for a child a test sends Ctrl-C to: SIGINT at its default, whatever this
    process inherited (a suite started in the background from a script ignores SIGINT, and so
    would every child it starts)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, multiprocessing's resource tracker and fork server aside
    (a rank forked by the fork server is its child, and shares its command line)."""
    def cmdline(p: int) -> bytes:
        try:
            return Path(f"/proc/{p}/cmdline").read_bytes()
        except FileNotFoundError:
            return b""
    out, todo = [], [(pid, False)]
    while todo:
        p, in_server = todo.pop()
        try:
            kids = [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except FileNotFoundError:
            continue
        for c in kids:
            cmd = cmdline(c)
            server = b"forkserver" in cmd and not in_server
            todo.append((c, server))
            if not server and b"resource_tracker" not in cmd:
                out.append(c)
    return out
