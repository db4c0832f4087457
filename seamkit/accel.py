"""Speed options for CUDA runs that leave the math alone: torch.compile of the training step.

`compile_model` compiles every block of a GPT in place (`nn.Module.compile`), so the forward
and, through AOTAutograd, the backward of each block run as fused kernels. Blocks are the
unit because every arm runs them, segment by segment (seams.chain), so one compiled block
serves them all and a seam never cuts through a compiled graph. All blocks share one code object and, with dynamo's inlined nn.Modules
(the default since torch 2.5), one graph: compiling 16 blocks costs one compile, not 16.
The embedding, the final norm, the LM head and the loss stay eager.

The trainer applies it when `train.compile` is true, after the model is on its device.
torch.compile works on CPU too but costs about 15 s per compile there; it is meant for CUDA.
"""

from __future__ import annotations

import torch.nn as nn


def compile_model(model: nn.Module, mode: str | None = None, backend: str = "inductor") -> nn.Module:
    """Compile each of `model.blocks` in place (shapes are fixed per run: dynamic=False); returns model.
    `backend`: torch.compile's; "aot_eager" captures the same graphs and runs them with aten's kernels,
    no code generated (a test of the capture that costs no C++ build)."""
    for block in model.blocks:
        block.compile(backend=backend, mode=mode, dynamic=False)
    return model
