"""seamkit.accel: each block compiled in place, one graph for them all, the math kept."""

import torch

from seamkit import accel
from seamkit import config as C
from seamkit.model import GPT, lm_loss


def test_compile_model_compiles_each_block_once_and_keeps_the_math():
    """Compiled blocks give eager's loss and gradients, from one graph for the four blocks.

    Compiled with aot_eager: dynamo's capture and AOTAutograd's joint graph as `train.compile`
    has them, run with aten's kernels, so the math is eager's bit for bit and no C++ is built
    (inductor's own rounding is the compiled pruning reference's test, tests/pruning/test_reference.py).
    Planted fault this catches: `compile_model` leaving the blocks eager (no graph), or compiling
    each block as a code object of its own (a graph per block)."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()  # other tests compile too
    cfg = C.tiny()
    torch.manual_seed(0)
    eager = GPT(cfg.model)
    compiled = GPT(cfg.model)
    compiled.load_state_dict(eager.state_dict())
    assert accel.compile_model(compiled, backend="aot_eager") is compiled
    x = torch.randint(0, cfg.model.vocab, (2, cfg.model.seq))
    y = torch.randint(0, cfg.model.vocab, (2, cfg.model.seq))
    losses = []
    for m in (eager, compiled):
        loss = lm_loss(m(x), y)
        loss.backward()
        losses.append(loss)
    assert counters["stats"]["unique_graphs"] == 1  # 4 blocks, one compiled graph
    assert torch.equal(losses[1], losses[0])
    for (n, a), b in zip(eager.named_parameters(), compiled.parameters()):
        assert torch.equal(b.grad, a.grad), n
