"""Where seams sit, the segments between them, what each segment owns, and the traffic that
crosses them.

Seam i sits after block i (0-based): it is the cut a pipeline-parallel run sends the
activations h_BTC of block i's output across. The reference cuts after every block but the
last (n_blocks - 1 seams). Segment k is the run of blocks between seam k-1 and seam k; the
first segment also owns the token embedding, the last one the final norm and the LM head
(`segment_params`, what the segment chain updates and clips). Seams are parsed where the config
is built (`seamkit.config.parse_seams`, `segments`, re-exported here).

Traffic follows the reference's derivation (docs/reference.md; bf16 activations, 2 bytes a value):
  activation_bytes_per_seam = batch * seq * dim * 2
  e2e_per_step   = 2 * seams * activation   (activations forward, gradients back)
  local_per_step =     seams * activation   (activations forward only)
  e2e_allreduce_per_step = 4 * params       (fp32 gradients, data parallelism)
"""

from __future__ import annotations

import torch.nn as nn

from seamkit.config import ModelConfig, parse_seams, segments
from seamkit.model import param_counts

__all__ = ["ACT_BYTES", "keep_held", "owned_names", "parse_seams", "segment_params", "segments", "traffic_bytes", "traffic_ratios"]

ACT_BYTES = 2  # bf16 activations cross the seams


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


def owned_names(model, segs: list[list[int]]) -> list[list[str]]:
    """The GPT's parameter names each segment owns, in the GPT's order (`segment_params`)."""
    return [[n for n, _ in owned] for owned in segment_params(model, segs)]


def keep_held(model, names: list[str], blocks: list[int]):
    """The GPT with only the parts these names and blocks hold (the rest goes: a rank holds its share)."""
    keep = set(names)
    for i in range(len(model.blocks)):
        if i not in blocks:
            model.blocks[i] = nn.Identity()
    for part in ("embed", "norm", "head"):
        if f"{part}.weight" not in keep:
            setattr(model, part, None)
    return model
