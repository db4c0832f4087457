"""The local objectives: what each segment learns from when its input is detached at the seam.

Local training detaches h_BTC at every seam, so each segment learns from its own loss
(`local_loss`, which the segment chain calls): an AuxHead of its own (`aux_head`), the final norm and LM head read with
detached weights (`detached_head`), the shared final norm and LM head (`shared_head`), a private
transformer block before its own AuxHead (`aux_block`, after AugLocal: Ma et al., "Scaling
Supervised Local Learning with Augmented Auxiliary Networks", ICLR 2024), or a private copy of
the final norm and LM head (`own_head`). Every non-final segment's private module is one entry
of the arm's `heads` (`make_aux_heads`, `make_aux_blocks`, `make_own_heads`).
What detached_head and shared_head add to the traffic is `objective_bytes`, kept apart from the
bytes block.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from seamkit.config import ConfigError, ModelConfig
from seamkit.losses import linear_cross_entropy
from seamkit.model import GPT, Block

PRIVATE = ("aux_head", "aux_block", "own_head")  # objectives whose non-final segments own a module (any rank can hold it)


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

    def forward(self, h_BTC: torch.Tensor, y_BT: torch.Tensor | None = None) -> torch.Tensor:
        """The logits; with class ids y_BT, the read-out's cross-entropy against them instead, chunk by
        chunk (`losses.linear_cross_entropy`), never the full logits. (A module call either way, so
        the FLOP counter's per-module table finds the head's work under its class name.)"""
        z = self.norm(h_BTC)
        return self.head(z) if y_BT is None else linear_cross_entropy(z, self.head.weight, y_BT)


class AuxBlock(nn.Module):
    """aux_block's read-out: one transformer block of the model's shape (`model.Block`), then an
    AuxHead over the same classes as aux_head's."""

    def __init__(self, cfg: ModelConfig, n_classes: int):
        super().__init__()
        self.n_blocks = cfg.n_blocks  # the GPT's residual-projection scale, so the block starts as the model's do
        self.block = Block(cfg)
        self.out = AuxHead(cfg.dim, n_classes, cfg.norm_eps)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator) -> None:
        """The GPT's init rule (`GPT.reset_parameters`) for the block, AuxHead's for the read-out,
        every draw from `generator`."""
        for name, p in self.block.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * self.n_blocks) if name.endswith("proj.weight") else 0.02
                p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=generator))
        self.out.reset_parameters(generator)

    def forward(self, h_BTC: torch.Tensor, ctx, y_BT: torch.Tensor | None = None) -> torch.Tensor:
        return self.out(self.block(h_BTC, ctx), y_BT)


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


def make_aux_blocks(cfg: ModelConfig, n_heads: int, k: int, seed: int) -> nn.ModuleList:
    """One AuxBlock per non-final segment, k+1 classes each, initialised from their own generator."""
    with torch.random.fork_rng(devices=[]):  # nn.Linear's own init draws from the global RNG (dropout's)
        blocks = nn.ModuleList([AuxBlock(cfg, min(k, cfg.vocab) + 1) for _ in range(n_heads)])
    g = torch.Generator().manual_seed(seed + 1)  # not the GPT's stream, as make_aux_heads
    for b in blocks:
        b.reset_parameters(g)
    return blocks


@torch.no_grad()
def make_own_heads(model: GPT, n_heads: int) -> nn.ModuleList:
    """own_head: one copy of the model's final norm and LM head per non-final segment (an AuxHead
    over the vocabulary), each starting as the model's and then learning on its own."""
    cfg = model.cfg
    with torch.random.fork_rng(devices=[]):  # as make_aux_blocks: the global RNG is left as it was
        heads = nn.ModuleList([AuxHead(cfg.dim, cfg.vocab, cfg.norm_eps) for _ in range(n_heads)])
    for h in heads:
        h.norm.weight.copy_(model.norm.weight)
        h.head.weight.copy_(model.head.weight)
    return heads


def private_modules(objective: str | None, cfg, model: GPT, corpus, n: int) -> tuple[dict, torch.Tensor | None]:
    """The private module of each of the n non-final segments the objective gives one ({k: module};
    aux_head, aux_block, own_head), from the seeds one process uses, and the class map the aux
    objectives read (None otherwise). `model` is the whole GPT as built from the seed: own_head
    copies its final norm and LM head."""
    if objective not in PRIVATE or n < 1:
        return {}, None
    k, seed = cfg.seams.aux_classes, cfg.train.seed
    heads = (make_aux_heads(cfg.model, n, k, seed) if objective == "aux_head" else
             make_aux_blocks(cfg.model, n, k, seed) if objective == "aux_block" else make_own_heads(model, n))
    classes = None if objective == "own_head" else class_map(corpus.token_counts("train", cfg.model.vocab), k)
    return dict(enumerate(heads)), classes


def local_loss(objective: str, h_BTC: torch.Tensor, y_BT: torch.Tensor, c_BT: torch.Tensor | None, head, ctx,
               model) -> torch.Tensor:
    """A non-final segment's loss on its output h_BTC (whose input was detached at the seam), every
    read-out's cross-entropy chunked (`losses.linear_cross_entropy`):
      aux_head       its own AuxHead against c_BT, the targets' classes (`class_map` of y_BT, taken
                     once a step for every segment);
      aux_block      its own AuxBlock (a transformer block, then an AuxHead) against c_BT;
      own_head       its own copy of the final norm and LM head, on the next tokens;
      detached_head  the current final norm and LM head with their weights detached;
      shared_head    the final norm and LM head themselves (they learn from every segment)."""
    if objective == "aux_head":
        return head(h_BTC, c_BT)
    if objective == "aux_block":
        return head(h_BTC, ctx, c_BT)
    if objective == "own_head":
        return head(h_BTC, y_BT)
    if objective == "detached_head":
        n = model.norm
        z = F.rms_norm(h_BTC, n.normalized_shape, n.weight.detach(), n.eps)
        return linear_cross_entropy(z, model.head.weight.detach(), y_BT)
    if objective == "shared_head":
        return model.loss(h_BTC, y_BT)
    raise ConfigError(f"unknown local objective {objective!r}")


def objective_bytes(cfg: ModelConfig, n_seams: int, objective: str, weight_bytes: int = 4) -> dict:
    """What a local objective adds to `local_per_step`, beside the reference's bytes block.

    aux_head, aux_block: nothing (each stage owns its module; the fixed class map ships once).
    own_head: nothing (each stage copies the final norm and LM head of the GPT it builds from
    the shared seed, then trains its copy alone).
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
