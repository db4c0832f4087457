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
