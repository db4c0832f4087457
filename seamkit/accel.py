"""Speed options for CUDA runs that leave the math alone: torch.compile of the training step.

`compile_model` compiles every block of a GPT in place (`nn.Module.compile`), so the forward
and, through AOTAutograd, the backward of each block run as fused kernels. Blocks are the
unit because every arm runs them, segment by segment (seams.chain), so one compiled block
serves them all and a seam never cuts through a compiled graph. All blocks share one code object and, with dynamo's inlined nn.Modules
(the default since torch 2.5), one graph: compiling 16 blocks costs one compile, not 16.
The embedding, the final norm, the LM head and the loss stay eager.

The trainer applies it where `train.compile` says (`compiles`: by default on CUDA), after the
model is on its device, and compiles it before its clock starts (`seams.chain.Chain.warm_up`), so
the budget holds training alone. torch.compile works on the CPU too but costs about 15 s per
compile there and gains little.
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn


def deterministic(device: torch.device) -> None:
    """Kernels that repeat bit for bit on CUDA (`train.deterministic`): cuBLAS's fixed workspace,
    set before its first GEMM in this process, and torch's deterministic algorithms, which raise
    on an op that has none (a one-line error naming it) rather than run a nondeterministic one."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def compiles(compile: str, device: torch.device) -> bool:
    """Whether `train.compile` compiles on this device: on, or auto on CUDA."""
    return compile == "on" or (compile == "auto" and device.type == "cuda")


def compile_model(model: nn.Module, mode: str | None = None, backend: str = "inductor") -> nn.Module:
    """Compile each of `model.blocks` in place (shapes are fixed per run: dynamic=False); returns model.
    `backend`: torch.compile's; "aot_eager" captures the same graphs and runs them with aten's kernels,
    no code generated (a test of the capture that costs no C++ build)."""
    for block in model.blocks:
        block.compile(backend=backend, mode=mode, dynamic=False)
    return model


def warm_up(chain) -> None:
    """Compile what a segment chain's training runs (`seams.chain.Chain`: each held segment's
    forward and backward, in train mode, under the run's autocast) on made-up inputs of the
    step's shape: no update, the gradients and every RNG as they were. The budget loop calls it
    before its clock starts."""
    if not chain.compiled:
        return
    B, T, C = chain.shape
    device = chain.device
    g = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for k in chain.mine:
            x = torch.randint(0, chain.model.cfg.vocab, (B, T), generator=g).to(device) if k == 0 else None
            h = None if k == 0 else torch.randn(B, T, C, generator=g).to(device, chain.dtype).requires_grad_()
            with chain.autocast():
                out = chain.run(k, x, h)
            out.float().square().mean().backward()
    for p in [*chain.model.parameters(), *chain.heads.parameters()]:
        p.grad = None
