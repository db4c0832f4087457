"""What the ui tests draw and show: a checkpoint two steps in, and a pruning report made from it."""

import pytest

from seamkit import config as C
from seamkit.pruning.study import prune_check
from seamkit.seams.arm import ArmSpec, run_arm

PRUNING = {"prune.windows": 2, "prune.samples": 1, "prune.reference": "eager"}


@pytest.fixture(scope="session")
def two_step_checkpoint(tmp_path_factory):
    """The e2e arm's checkpoint after two steps, trained here (one process)."""
    cfg = C.override(C.tiny(), {"train.max_steps": 2, "seams.devices": 1})
    path = tmp_path_factory.mktemp("two_steps") / "ck.pt"
    run_arm(ArmSpec("e2e", cfg, C.Placement("single"), 1, path, own_process=False))
    return path


@pytest.fixture(scope="session")
def pruning_report(two_step_checkpoint, tmp_path_factory):
    """The pruning study on it: two windows, one sample, the eager reference."""
    out = tmp_path_factory.mktemp("pruning") / "pruning.json"
    return prune_check(C.override(C.tiny(), PRUNING), two_step_checkpoint, out, progress=False)
