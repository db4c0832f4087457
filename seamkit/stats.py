"""Summary statistics every published interval comes from.
"""

from __future__ import annotations

import math
import statistics

# two-sided 95% Student t quantiles by degrees of freedom (1..30); beyond, the normal's 1.96
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def stats(values: list) -> dict | None:
    """mean, std (n-1), 95% interval of the mean (Student t), n and the values; None if none."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return None
    n, mean = len(xs), statistics.fmean(xs)
    std = statistics.stdev(xs) if n > 1 else None
    half = (T95[n - 2] if n - 1 <= len(T95) else 1.96) * std / math.sqrt(n) if std is not None else None
    return {"mean": mean, "std": std, "ci95": [mean - half, mean + half] if half is not None else None,
            "n": n, "values": xs}
