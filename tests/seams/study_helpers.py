"""What the seams studies the tests run measure once: the matmul peak (a study times it for a
second, for the report's MFU, which these tests do not check) and each config's per-token costs
(a function of the config and its corpus alone, counted on one real step per arm)."""

from __future__ import annotations

import json

from seamkit.flops import matmul_peak
from seamkit.seams import study as S
from seamkit.seams.per_token import arm_costs

_COSTS: dict[str, dict] = {}


def _costs(cfg, corpus) -> dict:
    key = json.dumps(cfg.to_dict(), sort_keys=True)
    if key not in _COSTS:
        _COSTS[key] = arm_costs(cfg, corpus)
    return _COSTS[key]


def measure_once(mp) -> None:
    """Through `mp` (a pytest MonkeyPatch): the study's peak timed for 0.05 s, its costs counted
    once per config."""
    mp.setattr(S, "matmul_peak", lambda device: matmul_peak(device, seconds=0.05))
    mp.setattr(S, "arm_costs", _costs)
