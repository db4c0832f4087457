"""Summary statistics every published interval comes from, and the two times to a target loss.

`stats` is the one summary of repeated measurements: the seams study's aggregate over seeds and
the sweep's summary of a grid point both come from it, with the same keys. Its 95% interval of
the mean uses the exact Student t quantile (`t_quantile`, from the closed-form CDF for integer
degrees of freedom: Abramowitz & Stegun 26.7.3 and 26.7.4), at any n.

Two different times to a target loss, named for what they measure:
- `held_out_time_to_target`: held-out evaluations (elapsed_s, loss), linearly interpolated
  between the point before the target and the first at or below it (the seams study);
- `train_curve_time_to_target`: the first point of the training-loss curve at or below the
  target, no interpolation (the sweep, which has only the reports' training curves).
"""

from __future__ import annotations

import math
import statistics


def _finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


# ----------------------------------------------------------------------------- Student t

def t_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer df (Abramowitz & Stegun 26.7.3 and 26.7.4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2 == 1:
        total, term = 0.0, c
        for k in range(1, (df - 1) // 2 + 1):  # c + 2/3 c^3 + 2*4/(3*5) c^5 + ...
            total += term
            term *= c * c * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + s * total) if df > 1 else 2 / math.pi * theta
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):  # 1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...
        total += term
        term *= c * c * (2 * k - 1) / (2 * k)
    return s * total


def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p (p > 0.5), by bisection on the exact CDF."""
    target = 2 * p - 1
    lo, hi = 0.0, 1.0
    while t_two_sided(hi, df) < target:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided(mid, df) < target else (lo, mid)
    return (lo + hi) / 2


# ----------------------------------------------------------------------------- the summary

def stats(values: list) -> dict | None:
    """n, mean, std (n-1), the 95% interval of the mean (Student t, n-1 df) and the finite values;
    std and ci95 are None for one value, and the whole summary None when no value is finite."""
    xs = _finite(values)
    if not xs:
        return None
    n, mean = len(xs), statistics.fmean(xs)
    if n < 2:
        return {"n": 1, "mean": mean, "std": None, "ci95": None, "values": xs}
    std = statistics.stdev(xs)
    half = t_quantile(0.975, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95": [mean - half, mean + half], "values": xs}


def difference(a: dict, b: dict) -> dict | None:
    """a's mean minus b's, two `stats` summaries of independent samples, with Welch's 95% interval
    (the Welch-Satterthwaite degrees of freedom, rounded down: the wider interval); None where
    either has no spread (one value)."""
    if not (a and b and a.get("std") is not None and b.get("std") is not None):
        return None
    va, vb = a["std"] ** 2 / a["n"], b["std"] ** 2 / b["n"]
    mean = a["mean"] - b["mean"]
    if va + vb == 0:
        return {"mean": mean, "ci95": [mean, mean]}
    df = (va + vb) ** 2 / (va ** 2 / (a["n"] - 1) + vb ** 2 / (b["n"] - 1))
    half = t_quantile(0.975, max(1, math.floor(df))) * math.sqrt(va + vb)
    return {"mean": mean, "ci95": [mean - half, mean + half], "df": df}


def interval(s: dict | None, spec: str, unit: str = "", missing: str = "-") -> str:
    """A `stats` summary as text: 'mean [lo, hi]' (its 95% interval), or the mean and n where it
    has no interval; `spec` formats each number, `unit` follows the mean."""
    if not s or s.get("mean") is None:
        return missing
    if s.get("ci95"):
        lo, hi = s["ci95"]
        return f"{s['mean']:{spec}}{unit} [{lo:{spec}}, {hi:{spec}}]"
    return f"{s['mean']:{spec}}{unit} (n={s['n']})"


# ----------------------------------------------------------------------------- time to a target loss

def held_out_time_to_target(points: list, target: float) -> float | None:
    """Seconds at which held-out points [(elapsed_s, loss)] first reach `target`, interpolated
    linearly from the point before (in time); None when no point reaches it."""
    prev = None
    for t, loss in sorted(points):
        if loss <= target:
            if prev is None or prev[1] <= loss:
                return t
            return prev[0] + (t - prev[0]) * (prev[1] - target) / (prev[1] - loss)
        prev = (t, loss)
    return None


def train_curve_time_to_target(elapsed_s: list, losses: list, target: float) -> float | None:
    """Seconds of training at the first training-loss curve point (in time) at or below `target`;
    None when the curve never reaches it or has no times. Points without a finite loss are skipped."""
    pairs = [(float(t), float(v)) for t, v in zip(elapsed_s, losses) if _finite([t]) and _finite([v])]
    for t, loss in sorted(pairs):
        if loss <= target:
            return t
    return None
