"""seamkit.stats: the one summary of repeated measurements (the seams study's aggregate and the
sweep's grid points: tests/sweep/test_stats.py holds the sweep to it), its exact Student t quantile,
and the two times to a target loss."""

import math

import pytest

from seamkit.stats import (
    difference,
    held_out_time_to_target,
    stats,
    t_quantile,
    train_curve_time_to_target,
)

# two-sided 95% Student t quantiles t_{0.975, df}, from any printed t table
T_TABLE = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 10: 2.2281, 30: 2.0423, 39: 2.0227, 60: 2.0003}


def test_t_quantiles_match_the_table():
    for df, t in T_TABLE.items():
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)


def test_three_values_by_hand():
    s = stats([1.0, 2.0, 3.0])  # mean 2, std 1, half-width t_{0.975, 2} / sqrt(3) = 4.3027 / 1.7321 = 2.4841
    assert s["n"] == 3 and s["mean"] == 2.0 and s["std"] == 1.0 and s["values"] == [1.0, 2.0, 3.0]
    assert s["ci95"] == pytest.approx([-0.4841, 4.4841], abs=1e-4)
    assert stats([5.0]) == {"n": 1, "mean": 5.0, "std": None, "ci95": None, "values": [5.0]}
    assert stats([None, float("nan"), True]) is None  # nothing finite (a bool is not a measurement)


def test_more_than_31_values_use_the_exact_t_quantile():
    xs = [float(k % 7) for k in range(40)]  # 39 degrees of freedom: t = 2.0227, the normal's 1.96 is 3% short
    s = stats(xs)
    half = (s["ci95"][1] - s["ci95"][0]) / 2
    assert half / (s["std"] / math.sqrt(40)) == pytest.approx(T_TABLE[39], abs=1e-4)


def test_held_out_time_to_target_interpolates_in_time_order():
    # the study lists the final evaluation first, then the equal-token marks: not in time order
    e2e = [(3.0, 1.5), (1.0, 3.0), (2.0, 2.0)]
    assert held_out_time_to_target(e2e, 1.8) == pytest.approx(2.0 + 1.0 * (2.0 - 1.8) / (2.0 - 1.5))
    assert held_out_time_to_target([(4.0, 1.8), (1.0, 2.5)], 1.8) == pytest.approx(4.0)  # reached exactly
    assert held_out_time_to_target([(1.0, 1.0), (2.0, 3.0)], 1.5) == 1.0  # the first point already there
    assert held_out_time_to_target([(1.0, 3.0)], 1.0) is None


def test_train_curve_time_to_target_takes_the_first_point_in_time():
    elapsed, losses = [9.0, 0.0, 4.0, 6.0], [1.0, 5.0, 2.0, float("nan")]
    assert train_curve_time_to_target(elapsed, losses, 2.5) == 4.0  # no interpolation
    assert train_curve_time_to_target(elapsed, losses, 0.5) is None
    assert train_curve_time_to_target([], [], 2.5) is None  # a report without curve times


def test_difference_is_welchs_interval_of_two_means():
    """[1, 2, 3] minus [4, 6, 8]: variances of the means 1/3 and 4/3, Welch-Satterthwaite df
    (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = 2.94, rounded down to 2 (t = 4.303). Planted faults this
    catches: the df rounded up (t = 3.182), a pooled variance, the sign of the difference."""
    d = difference(stats([1, 2, 3]), stats([4, 6, 8]))
    half = 4.302652729911275 * math.sqrt(5 / 3)
    assert d["mean"] == -4.0 and abs(d["df"] - 50 / 17) < 1e-12
    assert all(abs(x - y) < 1e-9 for x, y in zip(d["ci95"], [-4 - half, -4 + half]))
    assert difference(stats([1.0]), stats([1, 2])) is None  # one value: no spread
    assert difference(stats([2, 2]), stats([1, 1]))["ci95"] == [1.0, 1.0]
