"""seamkit.pruning.timing: a timed step's seconds and memory, and the CPU's peak of live tensors."""

import pytest
import torch

from seamkit.pruning.step import mode_loss
from seamkit.pruning.timing import PRECISIONS, GiB, dispatched_ops, profiled_peak_bytes, static_bytes, timed_sample
from tests.pruning.windows import WINDOWS


def test_profiled_peak_sees_what_pruning_saves(stepper):
    """The allocated figure of the report: the profiler's peak of live tensor bytes over the
    parameters and state. Rule A drops whole tails here, so the pruned step holds less.

    Planted fault this catches: a peak read from the parameters alone (both modes equal), or
    allocation events summed without their frees (a peak far above what any step holds)."""
    w = WINDOWS["tails"]()
    base = profiled_peak_bytes(stepper, mode_loss("base", w))
    pruned = profiled_peak_bytes(stepper, mode_loss("prune_exact", w))
    assert static_bytes(stepper) < pruned < base
    assert profiled_peak_bytes(stepper, mode_loss("base", w)) == base  # the same step, the same peak
    assert base < 20 * static_bytes(stepper)  # a tiny window's activations, not a running sum


def test_timed_sample(stepper):
    s = timed_sample(stepper, mode_loss("base", WINDOWS["tails"]()), words=29, device=torch.device("cpu"))
    assert set(s) == {"seconds", "words_per_second", "reserved_GiB"}
    assert s["seconds"] > 0 and s["words_per_second"] == pytest.approx(29 / s["seconds"])
    assert 0 <= s["reserved_GiB"] < 64 and GiB == 2 ** 30


def test_pruned_step_dispatches_about_as_many_ops_as_base(stepper):
    """The pruned step, plan included, dispatches at most 1.25x the ops of the unpruned step on
    the same window (each op a kernel launch on an accelerator), and as many on a window of 8
    documents as on one of 5: one attention call a block, whatever the documents.

    Planted fault this catches: attention run segment by segment (an SDPA call, its mask and
    q/k/v slices per segment of whole documents, each slice's backward a zero-filled gradient)."""
    counts = {}
    for name in ("long", "tails"):  # 8 documents of 90-200 positions; 5 of 1-60
        w = WINDOWS[name]()
        counts[name] = tuple(dispatched_ops(stepper, mode_loss(m, w)) for m in ("base", "prune_exact"))
    base, pruned = counts["long"]
    assert base > 100 * stepper.model.cfg.n_blocks  # the counter sees the step's ops
    assert pruned <= 1.25 * base, counts
    assert counts["tails"][1] == pruned, counts


def test_timed_sample_runs_in_the_precision_asked(stepper):
    """fp32 times the float32 step; bf16 times it under bf16 autocast (here the CPU's), as training
    runs on CUDA: the LM head's logits come out in the precision asked.

    Planted fault this catches: the precision ignored (every timing in fp32, whatever it says)."""
    seen = []
    hook = stepper.model.head.register_forward_hook(lambda mod, args, y: seen.append(y.dtype))
    try:
        for name in PRECISIONS:
            timed_sample(stepper, mode_loss("prune_exact", WINDOWS["tails"]()), 29, torch.device("cpu"), name)
    finally:
        hook.remove()
    assert seen == [torch.float32, torch.bfloat16] and PRECISIONS == ("fp32", "bf16")
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        timed_sample(stepper, mode_loss("base", WINDOWS["tails"]()), 29, torch.device("cpu"), "fp8")
