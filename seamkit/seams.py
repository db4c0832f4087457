"""Where seams sit, the segments between them, and the traffic that crosses them.

Seam i sits after block i (0-based): it is the cut a pipeline-parallel run sends the
activations h_BTC of block i's output across. The reference cuts after every block but the
last (n_blocks - 1 seams). Segment k is the run of blocks between seam k-1 and seam k; the
first segment also owns the token embedding, the last one the final norm and the LM head.

Traffic follows shared/reference/README.md exactly (bf16 activations, 2 bytes a value):
  activation_bytes_per_seam = batch * seq * dim * 2
  e2e_per_step   = 2 * seams * activation   (activations forward, gradients back)
  local_per_step =     seams * activation   (activations forward only)
  e2e_allreduce_per_step = 4 * params       (fp32 gradients, data parallelism)

Local training detaches h_BTC at every seam, so each segment learns from its own loss
(`segment_losses`): an AuxHead of its own (`aux_head`), the final norm and LM head read with
detached weights (`detached_head`), or the shared final norm and LM head (`shared_head`).
What the last two add to the traffic is `objective_bytes`, kept apart from the bytes block.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ConfigError, ModelConfig
from .model import lm_loss, param_counts

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


# ----------------------------------------------------------------------------- ownership

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


# ----------------------------------------------------------------------------- local objectives

class AuxHead(nn.Module):
    """A non-final segment's own read-out: weight-only RMSNorm, then dim -> K+1 classes (no bias).

    Classes are the K most frequent training tokens plus one "other" class (`class_map`).
    """

    def __init__(self, dim: int, n_classes: int, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.head = nn.Linear(dim, n_classes, bias=False)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator) -> None:
        """norm 1, head N(0, 0.02) from `generator`, so the GPT's own init is left untouched."""
        self.norm.weight.fill_(1.0)
        w = torch.empty(self.head.weight.shape, dtype=torch.float32).normal_(0.0, 0.02, generator=generator)
        self.head.weight.copy_(w)

    def forward(self, h_BTC: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(h_BTC))


def class_map(counts, k: int) -> torch.Tensor:
    """int64 (vocab,): token id -> class; the k most frequent tokens get 0..k-1 (most frequent
    first, ties by id), every other token the "other" class k."""
    counts = np.asarray(counts)
    k = min(k, len(counts))
    top = np.argsort(-counts, kind="stable")[:k]
    m = torch.full((len(counts),), k, dtype=torch.int64)
    m[torch.from_numpy(top.astype(np.int64))] = torch.arange(k)
    return m


def make_aux_heads(cfg: ModelConfig, n_heads: int, k: int, seed: int) -> nn.ModuleList:
    """One AuxHead per non-final segment, k+1 classes each, initialised from their own generator."""
    heads = nn.ModuleList([AuxHead(cfg.dim, min(k, cfg.vocab) + 1, cfg.norm_eps) for _ in range(n_heads)])
    g = torch.Generator().manual_seed(seed + 1)  # not the GPT's stream: both arms get the same GPT init
    for h in heads:
        h.reset_parameters(g)
    return heads


def segment_losses(model, x_BT: torch.Tensor, y_BT: torch.Tensor, segs: list[list[int]], objective: str,
                   heads: nn.ModuleList | None = None, classes: torch.Tensor | None = None,
                   detach: bool = True, autocast=contextlib.nullcontext):
    """Yield each segment's loss in order, each on its own graph: the input of segment k > 0 is
    the detached output h_BTC of segment k-1, so no gradient crosses a seam.

    A generator, so a trainer can call backward on segment k's loss before segment k+1 runs
    and free k's activations (where local training saves memory). The last segment's loss is
    the model's own LM loss; a non-final one depends on `objective`:
      aux_head       its own AuxHead over `classes` (the map from `class_map`);
      detached_head  the current final norm and LM head with their weights detached;
      shared_head    the final norm and LM head themselves (they learn from every segment).
    `detach=False` exists only to show that the gradient tests can fail.
    """
    last = len(segs) - 1
    h_BTC = None
    for k, blocks in enumerate(segs):
        with autocast():
            if k == 0:
                h_BTC = model.embed(x_BT)
                ctx = model.context(x_BT.shape[1], x_BT.device, h_BTC.dtype)
            elif detach:
                h_BTC = h_BTC.detach()
            for i in blocks:
                h_BTC = model.blocks[i](h_BTC, ctx)
            if k == last:
                loss = lm_loss(model.head(model.norm(h_BTC)), y_BT)
            elif objective == "aux_head":
                loss = lm_loss(heads[k](h_BTC), classes[y_BT])
            elif objective == "detached_head":
                n = model.norm
                z = F.rms_norm(h_BTC, n.normalized_shape, n.weight.detach(), n.eps)
                loss = lm_loss(F.linear(z, model.head.weight.detach()), y_BT)
            elif objective == "shared_head":
                loss = lm_loss(model.head(model.norm(h_BTC)), y_BT)
            else:
                raise ConfigError(f"unknown local objective {objective!r}")
        yield loss


def objective_bytes(cfg: ModelConfig, n_seams: int, objective: str, weight_bytes: int = 4) -> dict:
    """What a local objective adds to `local_per_step`, beside the reference's bytes block.

    aux_head: nothing (each stage owns its head; the fixed class map ships once).
    detached_head: every non-final stage needs the current final norm + LM head each step.
    shared_head: the same weights out, and their gradients back to the last stage.
    Weights and gradients count fp32 (4 bytes), as the reference's allreduce does.
    """
    head_params = cfg.vocab * cfg.dim + cfg.dim
    weights = n_seams * head_params * weight_bytes if objective in ("detached_head", "shared_head") else 0
    grads = n_seams * head_params * weight_bytes if objective == "shared_head" else 0
    return {"objective": objective, "head_params": head_params, "head_weight_bytes_per_step": weights,
            "head_gradient_bytes_per_step": grads, "extra_per_step": weights + grads}


def objective_ratios(b: dict, extra: dict) -> dict:
    """e2e/local traffic once local also pays its objective's head traffic."""
    local = b["local_per_step"] + extra["extra_per_step"]
    if local == 0:
        return {"traffic_ratio_with_objective": 0.0, "traffic_ratio_with_objective_no_allreduce": 0.0}
    return {
        "traffic_ratio_with_objective": round((b["e2e_per_step"] + b["e2e_allreduce_per_step"]) / local, 1),
        "traffic_ratio_with_objective_no_allreduce": round(b["e2e_per_step"] / local, 1),
    }
