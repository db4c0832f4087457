"""Where seams sit, the segments between them, what each segment owns, and the traffic that
crosses them.

Seam i sits after block i (0-based): it is the cut a pipeline-parallel run sends the
activations h_BTC of block i's output across. The reference cuts after every block but the
last (n_blocks - 1 seams). Segment k is the run of blocks between seam k-1 and seam k; the
first segment also owns the token embedding, the last one the final norm and the LM head.

Traffic follows the reference's derivation (docs/reference.md; bf16 activations, 2 bytes a value):
  activation_bytes_per_seam = batch * seq * dim * 2
  e2e_per_step   = 2 * seams * activation   (activations forward, gradients back)
  local_per_step =     seams * activation   (activations forward only)
  e2e_allreduce_per_step = 4 * params       (fp32 gradients, data parallelism)
"""

from __future__ import annotations

import torch.nn as nn

from seamkit.config import ConfigError, ModelConfig
from seamkit.model import param_counts

ACT_BYTES = 2  # bf16 activations cross the seams


def parse_seams(spec: str | int | list, n_blocks: int) -> list[int]:
    """Seam positions (block indices a seam follows) from "all", a count "3", or "1,3,5".

    A count k spreads k seams evenly; "none" or "0" gives no seam. Seams after the last
    block are meaningless and rejected.
    """
    if isinstance(spec, list):
        seams = [int(s) for s in spec]
    else:
        spec = str(spec).strip().lower()
        if spec == "all":
            seams = list(range(n_blocks - 1))
        elif spec in ("none", "0", ""):
            seams = []
        elif "," in spec or spec.startswith("["):
            try:
                seams = [int(s) for s in spec.strip("[]").split(",") if s.strip()]
            except ValueError:
                raise ConfigError(f"seams.seams={spec!r}: expected 'all', a count, or block indices like '1,3,5'")
        else:
            try:
                k = int(spec)
            except ValueError:
                raise ConfigError(f"seams.seams={spec!r}: expected 'all', a count, or block indices like '1,3,5'")
            if not 0 <= k <= n_blocks - 1:
                raise ConfigError(f"seams.seams={k}: a model of {n_blocks} blocks has room for 0..{n_blocks - 1} seams")
            # k seams, evenly: segment boundaries at round((i+1)*n_blocks/(k+1)) - 1
            seams = [round((i + 1) * n_blocks / (k + 1)) - 1 for i in range(k)]
    if sorted(set(seams)) != seams:
        raise ConfigError(f"seams {seams} must be increasing and distinct")
    if seams and (seams[0] < 0 or seams[-1] > n_blocks - 2):
        raise ConfigError(f"seams {seams}: a seam must follow one of blocks 0..{n_blocks - 2}")
    return seams


def segments(seams: list[int], n_blocks: int) -> list[list[int]]:
    """Block indices of each segment: seams [1, 3] over 6 blocks -> [[0, 1], [2, 3], [4, 5]]."""
    bounds = [-1] + list(seams) + [n_blocks - 1]
    return [list(range(bounds[k] + 1, bounds[k + 1] + 1)) for k in range(len(bounds) - 1)]


def traffic_bytes(cfg: ModelConfig, batch: int, n_seams: int, act_bytes: int = ACT_BYTES) -> dict:
    """The reference report's `bytes` block."""
    counts = param_counts(cfg)
    act = batch * cfg.seq * cfg.dim * act_bytes
    return {
        "activation_bytes_per_seam": act,
        "seams": n_seams,
        "e2e_per_step": 2 * n_seams * act,
        "local_per_step": n_seams * act,
        "e2e_allreduce_per_step": 4 * counts["params"],
        "e2e_allreduce_non_embed": 4 * counts["params_non_embed"],
        "params": counts["params"],
        "params_non_embed": counts["params_non_embed"],
        "embed_share": round(1 - counts["params_non_embed"] / counts["params"], 3),
    }


def traffic_ratios(b: dict) -> dict:
    """e2e/local traffic with the allreduce (the reference's figure) and without it."""
    if b["local_per_step"] == 0:
        return {"traffic_ratio_e2e_over_local": 0.0, "traffic_ratio_no_allreduce": 0.0}
    return {
        "traffic_ratio_e2e_over_local": round((b["e2e_per_step"] + b["e2e_allreduce_per_step"]) / b["local_per_step"], 1),
        "traffic_ratio_no_allreduce": round(b["e2e_per_step"] / b["local_per_step"], 1),
    }


def segment_params(model, segs: list[list[int]]) -> list[list[tuple[str, nn.Parameter]]]:
    """(name, parameter) pairs each segment owns, in `model.named_parameters()` order.

    Segment 0 also owns the embedding, the last segment the final norm and the LM head, so with
    one segment the list is exactly `model.named_parameters()` (what keeps local == e2e).
    """
    owner = {}
    for k, blocks in enumerate(segs):
        for i in blocks:
            owner[f"blocks.{i}."] = k
    out = [[] for _ in segs]
    for name, p in model.named_parameters():
        if name.startswith("embed."):
            k = 0
        elif name.startswith("blocks."):
            k = owner[".".join(name.split(".")[:2]) + "."]
        else:  # norm., head.
            k = len(segs) - 1
        out[k].append((name, p))
    return out
