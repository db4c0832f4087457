"""seamkit.pruning.timing: a timed step's seconds and memory, and the CPU's peak of live tensors."""

import pytest
import torch

from seamkit.pruning.step import mode_loss
from seamkit.pruning.timing import GiB, profiled_peak_bytes, static_bytes, timed_sample
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
