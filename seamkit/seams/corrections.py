"""The delayed arm's staleness corrections: PipeMare's learning-rate rescheduling
(`seams.lr_delay_steps`, `rescale_lr`), weight prediction (`seams.weight_prediction`,
`seams.prediction_decay`, `Prediction`) and error feedback on the updates
(`seams.error_feedback`, `Feedback`); the fourth, Nesterov look-ahead (`seams.nesterov_momentum`),
is the arm's optimizer (`optim.make_optimizer`: NAdamW).

Weight prediction. A segment whose gradient comes tau steps late computes it at one set of weights and applies it
to another: its forward of batch t ran at w_t, and the update lands on w_{t+tau}. Each late
segment keeps v, an exponential average of its own per-step updates (v <- g*v + (1-g)*(w' - w),
g = `prediction_decay`), and extrapolates along it by s*tau steps (s = `weight_prediction`):

- with weight stashing the forward (and so the backward through its kept graph) runs at
  w + s*tau*v, the weights the gradient will be applied to (weight prediction: Chen et al.,
  "Efficient and Robust Parallel DNN Training through Model Parallelism on Multi-GPU Platform",
  2018, SpecTrain);
- without stashing the late backward runs again at w - s*tau*v, the weights batch t's forward
  used (PipeMare's discrepancy correction: Yang et al., MLSys 2021).

With s = 0 nothing is kept and nothing changes. v is state: it rides in checkpoints beside what
is in flight and counts in the arm's kept bytes.

Error feedback. The update u_t a late segment's optimizer makes at step t answers a gradient of
weights tau steps old; the error it carries is what the direction has turned since, and the newest
turn the segment can see is u_t - u_{t-1}. Each late segment keeps its last update and adds
e*tau*(u_t - u_{t-1}) to the new one (e = `error_feedback`): the update extrapolated tau steps
along its own change, whatever optimizer made it. This is the kit's form of the error-feedback
correction of one-step-delayed optimisation (Zmushko et al., "One-Step Gradient Delay is Not a
Barrier for Large-Scale Asynchronous Pipeline Parallel LLM Pretraining", 2026), carried to a delay
of tau steps. A segment's first update is kept, not corrected (there is no turn yet to feed back).
With e = 0 nothing is kept and nothing changes; the kept updates ride in checkpoints.
"""

from __future__ import annotations

import torch


def late_weights(owned: dict, corrections: list) -> dict:
    """The weights of every segment one of `corrections` keeps state for, copied once before an
    update: what each correction's `after_update` differences."""
    keys = sorted(set().union(*(c.segments for c in corrections)))
    return {k: [p.detach().clone() for _, p in owned[k]] for k in keys}


def rescale_lr(opt, steps: int, t: int, taus: list[int]) -> None:
    """PipeMare's rescheduling (Yang et al., MLSys 2021): at step t a segment whose gradient is
    tau steps late runs at lr / tau**p, p = 1 - t/steps falling to 0, so the stalest segments
    start slowest and all end at lr. `opt`'s groups carry their segment's index into `taus`."""
    p = max(0.0, 1.0 - t / steps)
    for g in opt.param_groups:
        tau = taus[g["segment"]]
        g["lr_scale"] = tau ** -p if tau > 0 else 1.0


class Prediction:
    """The late segments' update averages; `owned` {segment: [(name, parameter)]}, `delays` {segment: tau}."""

    def __init__(self, strength: float, decay: float, owned: dict, delays: dict):
        self.s, self.decay, self.owned, self.delays = strength, decay, owned, delays
        self.v = {k: {n: torch.zeros_like(p, memory_format=torch.preserve_format) for n, p in ps}
                  for k, ps in owned.items() if strength > 0 and delays[k] > 0}

    def __bool__(self) -> bool:
        return bool(self.v)

    def weights(self, k: int, ahead: bool) -> dict | None:
        """Segment k's weights moved s*tau steps along v (ahead: +, else -), detached leaves
        requiring grad; None where segment k predicts nothing."""
        if k not in self.v:
            return None
        step = self.s * self.delays[k] * (1.0 if ahead else -1.0)
        v = self.v[k]
        return {n: torch.add(p.detach(), v[n], alpha=step).requires_grad_() for n, p in self.owned[k]}

    @property
    def segments(self):
        return self.v.keys()

    @torch.no_grad()
    def after_update(self, before: dict, found_inf: torch.Tensor, has=None) -> None:
        """The optimizer has moved each late segment from `before`: fold the move into v (where
        `found_inf` is up the step made no update, and v stays as it was)."""
        up = found_inf > 0
        for k in self.v:
            for (n, p), w in zip(self.owned[k], before[k]):
                v = self.v[k][n]
                torch.where(up, v, torch.add(v * self.decay, p - w, alpha=1.0 - self.decay), out=v)

    def nbytes(self) -> int:
        return sum(t.nbytes for v in self.v.values() for t in v.values())

    def state(self) -> dict:
        return {k: {n: t.detach().cpu() for n, t in v.items()} for k, v in self.v.items()}

    def load(self, state: dict | None) -> None:
        """`state` back (None: a checkpoint from before prediction existed, which had none)."""
        for k, v in (state or {}).items():
            for n, t in (v.items() if k in self.v else ()):
                self.v[k][n].copy_(t)


class Feedback:
    """The late segments' last updates, fed back into the next; `owned` {segment: [(name, parameter)]},
    `delays` {segment: tau}."""

    def __init__(self, strength: float, owned: dict, delays: dict):
        self.e, self.owned, self.delays = strength, owned, delays
        self.u = {k: {n: torch.zeros_like(p, memory_format=torch.preserve_format) for n, p in ps}
                  for k, ps in owned.items() if strength > 0 and delays[k] > 0}
        self.seen = {k: False for k in self.u}  # has segment k made an update yet (a nonzero one)

    def __bool__(self) -> bool:
        return bool(self.u)

    @property
    def segments(self):
        return self.u.keys()

    @torch.no_grad()
    def after_update(self, before: dict, found_inf: torch.Tensor, has) -> None:
        """The optimizer has moved each late segment from `before` by u: add e*tau*(u - u_prev).
        Where `found_inf` is up the step made no update, and nothing moves or is kept. `has(k,
        False)`: segment k had a gradient this step (`Chain.has_grad`): its gradients come late,
        and until its first one its updates are zero, with nothing to feed back."""
        up = found_inf > 0
        for k in self.u:
            new = [p - w for (_, p), w in zip(self.owned[k], before[k])]
            if self.seen[k]:
                step = self.e * self.delays[k]
                for (n, p), u in zip(self.owned[k], new):
                    torch.where(up, p, torch.add(p, u - self.u[k][n], alpha=step), out=p)
            else:
                self.seen[k] = has(k, False)
            for (n, _), u in zip(self.owned[k], new):
                torch.where(up, self.u[k][n], u, out=self.u[k][n])

    def nbytes(self) -> int:
        return sum(t.nbytes for u in self.u.values() for t in u.values())

    def state(self) -> dict:
        return {k: {"seen": self.seen[k], "u": {n: t.detach().cpu() for n, t in u.items()}}
                for k, u in self.u.items()}

    def load(self, state: dict | None) -> None:
        """`state` back (None: a checkpoint from before error feedback existed, which had none)."""
        for k, entry in (state or {}).items():
            if k in self.u:
                self.seen[k] = entry["seen"]
                for n, t in entry["u"].items():
                    self.u[k][n].copy_(t)
