"""seams.inflight: a kept forward's graph and what it holds, and the RNG state a rebuilt graph
draws from. The chain's use of them is tests/seams/test_chain.py (what the delayed arm keeps,
rebuilt bit for bit)."""

import torch

from seamkit.seams import inflight as F


def test_a_kept_forward_is_the_forward_and_counts_what_its_graph_holds_besides_its_own():
    """Output and gradients as the plain forward's; the graph's storages are the output and
    what was saved for backward, never the weights or the input. Planted fault this catches:
    the weights counted into the graph (every kept graph a weight copy too big)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    weights = {n: p.detach().clone().requires_grad_() for n, p in lin.named_parameters()}
    out, graph = F.kept_forward(lin, weights, (x,))
    assert torch.equal(out, lin(x))
    own = {t.untyped_storage().data_ptr() for t in [x, *weights.values()]}
    assert out.untyped_storage().data_ptr() in graph and not own & graph.keys()
    g = torch.autograd.grad(out.tanh().sum(), list(weights.values()))
    assert all(torch.equal(a, b) for a, b in zip(g, torch.autograd.grad(lin(x).tanh().sum(), list(lin.parameters()))))
    entry = {"input": x, "weights": weights, "graph": graph}
    assert F.kept_bytes([[entry]], [[{"grad": torch.zeros(3)}]]) == (
        x.nbytes + sum(w.nbytes for w in weights.values()) + 12 + F.graph_bytes([[entry]], [x, *weights.values()]))


def test_a_rebuild_draws_what_its_forward_drew_and_leaves_the_rng_alone():
    """Planted fault this catches: under_rng without fork_rng (the process's RNG left at the
    kept state: an arm resumed draws other dropout masks than one never stopped)."""
    torch.manual_seed(1)
    state = F.rng_of(torch.device("cpu"))
    first = torch.rand(5)
    after = torch.get_rng_state()
    with F.under_rng(state, torch.device("cpu")):
        again = torch.rand(5)
        torch.rand(3)  # the rebuild's other draws stay inside it
    assert torch.equal(first, again) and torch.equal(torch.get_rng_state(), after)


def test_an_entry_rides_in_a_checkpoint_without_its_graph():
    w = {"w": torch.ones(2, requires_grad=True)}
    e = {"batch": 3, "input": torch.ones(2), "weights": w, "rng": {"cpu": torch.get_rng_state()}, "out": torch.ones(1),
         "graph": {1: (4, torch.ones(1))}}
    plain = F.entry_to_cpu(e)
    assert set(plain) == {"batch", "input", "weights", "rng"} and not plain["weights"]["w"].requires_grad
    back = F.entry_to(plain, torch.device("cpu"))
    assert back["batch"] == 3 and torch.equal(back["rng"]["cpu"], e["rng"]["cpu"])
