"""What a segment chain holds between steps when its gradients come back late (the delayed point
of `seams.policy`), how much memory that is, and how it rides in a checkpoint.

A segment whose output-gradient for batch t arrives later keeps a stash entry: its input and,
with weight stashing, the autograd graph of its forward run over a detached copy of the weights
it used (`kept_forward`), so the late backward meets the activations and weights that forward
used, as PipeDream keeps them. Output-gradients wait in the segment's inbox until they are due.

A graph cannot be saved: a kept entry rides in a checkpoint as its input, stashed weights and
the RNG state its forward drew from (dropout), and is rebuilt by running that forward again,
the same values bit for bit (`Chain.load_inflight`).
"""

from __future__ import annotations

import contextlib

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.func import functional_call


def kept_forward(fn, weights: dict, args: tuple) -> tuple[torch.Tensor, dict]:
    """fn(*args) run over `weights` (`functional_call`) with grad enabled, its graph kept; returns
    its output and the storages the graph holds besides `weights` and `args`: those of the tensors
    the forward saved for backward (an activation, a cast of a weight) and of its output, each
    whole (a view keeps all of it) and with a tensor on it, so what `graph_bytes` counts is held."""
    saved = []

    def pack(t):
        saved.append(t)
        return t
    with torch.enable_grad(), saved_tensors_hooks(pack, lambda t: t):
        out = functional_call(fn, weights, args)
    own = {t.untyped_storage().data_ptr() for t in [*weights.values(), *args] if t is not None}
    graph = {}
    for t in [out, *saved]:
        s = t.untyped_storage()
        if s.data_ptr() not in own:
            graph[s.data_ptr()] = (s.nbytes(), t)
    return out, graph


def graph_bytes(stash, held: list[torch.Tensor]) -> int:
    """Bytes the kept graphs of `stash`'s entries hold that `held` does not, each storage once."""
    seen = {t.untyped_storage().data_ptr() for t in held}
    n = 0
    for q in stash:
        for e in q:
            for ptr, (nbytes, _) in e.get("graph", {}).items():
                if ptr not in seen:
                    seen.add(ptr)
                    n += nbytes
    return n


def kept_bytes(stash, inbox, sending: list[torch.Tensor] = ()) -> int:
    """Bytes held in flight: kept inputs, stashed weights, output-gradients in an inbox or still
    being sent (each its own bytes), and what the kept graphs hold besides them."""
    held = [t for q in stash for e in q for t in (e["input"], *(e["weights"] or {}).values())]
    held += [e["grad"] for q in inbox for e in q] + list(sending)
    return sum(t.nbytes for t in held) + graph_bytes(stash, held)


def rng_of(device: torch.device) -> dict:
    """The RNG state a forward on `device` draws from (dropout): kept with a kept graph, so the
    graph rebuilt from a checkpoint draws the same masks."""
    return {"cpu": torch.get_rng_state(),
            **({"cuda": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {})}


@contextlib.contextmanager
def under_rng(state: dict, device: torch.device):
    """Run under `rng_of`'s `state`, leaving this process's RNG as it was (a rebuild draws nothing
    an arm never stopped would not have drawn)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.set_rng_state(state["cpu"])
        if "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], device)
        yield


def entry_to_cpu(e: dict) -> dict:
    """A stash or inbox entry as plain data for a checkpoint (tensors on the CPU); a kept graph's
    output and graph are left out: its input, weights and RNG state rebuild them."""
    return {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else
                {n: t.detach().cpu() for n, t in v.items()} if isinstance(v, dict) else v)
            for k, v in e.items() if k not in ("out", "graph")}


def entry_to(e: dict, device: torch.device) -> dict:
    """`entry_to_cpu`'s entry back on `device` (an RNG state stays on the CPU, where torch reads it)."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else
                {n: t.to(device) for n, t in v.items()} if isinstance(v, dict) and k != "rng" else v)
            for k, v in e.items()}
