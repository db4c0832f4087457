import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).resolve().parent / "reference"  # copies of ../shared/reference/*.json
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"

# Tests are small; one thread keeps them deterministic and leaves the other core free.
torch.set_num_threads(int(os.environ.get("SEAMKIT_TEST_THREADS", "1")))


@pytest.fixture
def reference_dir() -> Path:
    return REFERENCE
