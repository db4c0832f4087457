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


def test_compiled_before_the_clock_and_training_unchanged(tmp_path, monkeypatch):
    """train.compile=on (aot_eager here: eager's math, no C++ build): the chain's blocks compile in
    `accel.warm_up`, before the clock, and training compiles nothing more; the arm trains torch.equal to an
    uncompiled one (the warm-up's made-up batch leaves the RNG, the gradients and the weights as they
    were) and reports its compile seconds, None when not compiled. Planted faults this catches: the
    warm-up drawing from the global RNG (dropout's stream) or leaving its gradients in place (the
    first update adds them)."""
    from functools import partial

    from torch._dynamo.utils import counters

    from seamkit.data.load import load_corpus
    from seamkit.seams import chain as CH
    from seamkit.seams.arm import ArmSpec, run_arm
    monkeypatch.setattr(CH, "compile_model", partial(accel.compile_model, backend="aot_eager"))
    torch._dynamo.reset()
    counters.clear()
    graphs = {}
    warm = accel.warm_up

    def counted(chain):
        warm(chain)
        graphs["warm"] = counters["stats"]["unique_graphs"]
    monkeypatch.setattr(accel, "warm_up", counted)
    cfg = C.override(C.tiny(), {"train.max_steps": 3, "train.budget_seconds": 0.0, "model.dropout": 0.1})
    corpus = load_corpus(cfg.data)
    results = {}
    for mode in ("on", "off"):
        c = C.override(cfg, {"train.compile": mode})
        results[mode] = run_arm(ArmSpec("local", c, C.Placement("single"), 1, str(tmp_path / f"{mode}.pt"),
                                        own_process=False), corpus=corpus)
    assert graphs["warm"] >= 1 and counters["stats"]["unique_graphs"] == graphs["warm"]
    assert results["on"].compile_s > 0 and results["off"].compile_s is None
    a, b = (torch.load(tmp_path / f"{m}.pt", weights_only=True)["model"] for m in ("on", "off"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert accel.compiles("auto", torch.device("cuda")) and not accel.compiles("auto", torch.device("cpu"))
