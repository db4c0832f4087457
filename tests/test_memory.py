"""memory.py: the peak resets, and growth is measured over the phase's own baseline."""

import numpy as np
import pytest
import torch

from seamkit import memory as M

MiB = 2 ** 20


@pytest.mark.skipif(M.rss_bytes() is None, reason="no /proc/self/status here")
def test_reset_restarts_the_peak_and_growth_is_over_the_baseline():
    """Planted fault this catches: a reset that leaves the peak (VmHWM) where it was."""
    big = np.ones(300 * MiB // 8)  # touched: 300 MiB resident
    del big
    before = M.peak_rss_bytes()
    base = M.Baseline.start(torch.device("cpu"))
    assert base.measure()["peak_rss_bytes"] < before - 200 * MiB  # the 300 MiB are gone from the peak
    small = np.ones(100 * MiB // 8)
    got = base.measure()
    assert 90 * MiB <= got["rss_growth_bytes"] <= 140 * MiB  # what this phase added, not what the process holds
    assert got["peak_rss_bytes"] > got["rss_growth_bytes"]  # torch and the interpreter are the baseline
    del small
