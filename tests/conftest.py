import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).resolve().parent / "reference"  # copies of ../shared/reference/*.json
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"

# Tests are small; one thread keeps them deterministic and leaves the other core free. The
# entry points that choose their own count (train.threads=0, seamkit.threads) take it from
# SEAMKIT_THREADS, here and in every process a test starts.
os.environ.setdefault("SEAMKIT_THREADS", os.environ.get("SEAMKIT_TEST_THREADS", "1"))
torch.set_num_threads(int(os.environ["SEAMKIT_THREADS"]))


@pytest.fixture
def reference_dir() -> Path:
    return REFERENCE
