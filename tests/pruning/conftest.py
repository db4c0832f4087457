"""What the pruning tests share: a tiny model, a checkpoint two AdamW steps in, and its stepper."""

import pytest
import torch

from seamkit import checkpoint
from seamkit import config as C
from seamkit.model import GPT
from seamkit.optim import make_optimizer
from seamkit.pruning import rules as prune
from seamkit.pruning.step import Stepper
from tests.pruning.windows import WINDOWS


def tiny_cfg(**overrides):
    return C.override(C.tiny(), {"prune.windows": 2, "prune.samples": 2, "prune.warmup": 0,
                                 "prune.reference": "eager", **overrides})


@pytest.fixture(scope="session")
def model():
    torch.manual_seed(0)
    return GPT(C.tiny().model)


@pytest.fixture
def threads(request):
    """Run a test at request.param torch threads (the default run uses 2)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ckpt_path(tmp_path_factory):
    """A tiny checkpoint after two AdamW steps, so the optimizer state is not trivial."""
    cfg = tiny_cfg()
    torch.manual_seed(0)
    model = GPT(cfg.model)
    opt = make_optimizer(model, cfg.train)  # as the trainers build it
    for name in ("random", "completion"):
        prune.base_loss(model, WINDOWS[name]()).backward()
        opt.step()
        opt.zero_grad()
    path = tmp_path_factory.mktemp("ckpt") / "tiny.pt"
    checkpoint.save(path, model, opt, cfg, step=2)
    return path


@pytest.fixture(scope="session")
def stepper(ckpt_path):
    ck = checkpoint.load(ckpt_path)
    return Stepper(ck["run_config"].model, ck["model"], ck["optimizer"], tiny_cfg(), torch.float32,
                   torch.device("cpu"))
