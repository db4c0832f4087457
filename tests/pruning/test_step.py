"""seamkit.pruning.step: a training step from the checkpoint, reset before each, in either mode."""

import pytest
import torch

from seamkit import checkpoint
from seamkit.flops import measured_flops
from seamkit.pruning import rules as prune
from seamkit.pruning.compare import compare, differences_zero, stats, within
from seamkit.pruning.step import MODES, CheckError, Stepper, mode_loss
from tests.pruning.conftest import tiny_cfg
from tests.pruning.windows import WINDOWS


def test_steps_start_from_the_checkpoint_and_never_change_it(ckpt_path):
    """Planted fault this catches: a Stepper that steps the checkpoint's own tensors (the second
    step would start where the first ended, and the checkpoint would change)."""
    ck = checkpoint.load(ckpt_path)
    before = checkpoint.tensor_id(ck["model"], ck["optimizer"])
    st = Stepper(ck["run_config"].model, ck["model"], ck["optimizer"], tiny_cfg(), torch.float32,
                 torch.device("cpu"))
    w = WINDOWS["completion"]()
    r1 = st.step(mode_loss("prune_exact", w, "bitwise"))
    r2 = st.step(mode_loss("prune_exact", w, "bitwise"))
    assert differences_zero(compare(r1, r2))
    assert checkpoint.tensor_id(ck["model"], ck["optimizer"]) == before
    assert all(float(s["step"]) == 3.0 for s in r1.state.values())  # 2 checkpoint steps + this one


@pytest.mark.parametrize("threads", [1, 2])
def test_pruned_steps_with_optimizer(ckpt_path, threads):
    """Both exactness modes through the whole step (AdamW from the checkpoint's state), at 1 and 2
    threads: bitwise equals base bit for bit in float32; arithmetic stays within 1e-12 in float64.

    Planted fault this catches: the arithmetic pruned step run where bitwise is asked for."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ck = checkpoint.load(ckpt_path)
        for dtype, exact in ((torch.float32, "bitwise"), (torch.float64, "arithmetic")):
            st = Stepper(ck["run_config"].model, ck["model"], ck["optimizer"], tiny_cfg(), dtype,
                         torch.device("cpu"))
            for name in ("tails", "random"):
                w = WINDOWS[name]()
                base, ran = st.step(mode_loss("base", w)), {}
                pruned = st.step(mode_loss("prune_exact", w, exact, ran))
                d = compare(base, pruned)
                assert differences_zero(d) if exact == "bitwise" else within(d, 1e-12), (name, d)
                s = stats(pruned, "prune_exact", w, ran)
                assert s["kept"] + s["skipped"] == w.positions and s["kept"] == s["targets"]
                assert s["projected"] < stats(base, "base", w, {})["projected"]
    finally:
        torch.set_num_threads(before)


def test_mode_flops_save_what_the_plan_promises(stepper):
    """The study's default prune_exact step, counted with FlopCounterMode, saves at least what the
    plan promises. (Bitwise mode is not held to it: it runs attention backward on all rows, and
    its calibration's GEMMs count too.)

    Planted fault this catches: prune_exact running the unpruned step."""
    w = WINDOWS["tails"]()
    planned = prune.plan_flops(stepper.model.cfg, prune.plan(w))
    flops = {}
    for m in MODES:
        stepper.reset()
        flops[m] = measured_flops(lambda m=m: mode_loss(m, w)(stepper.model))
    assert flops["base"] - flops["prune_exact"] >= planned["base"] - planned["pruned"] > 0


def test_unknown_mode_and_exactness():
    w = WINDOWS["tails"]()
    with pytest.raises(CheckError, match="unknown mode 'fast'"):
        mode_loss("fast", w)
    with pytest.raises(CheckError, match="unknown exactness 'roughly'"):
        mode_loss("prune_exact", w, "roughly")
