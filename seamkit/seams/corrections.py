"""The delayed arm's staleness corrections: PipeMare's learning-rate rescheduling
(`seams.lr_delay_steps`, `rescale_lr`) and weight prediction (`seams.weight_prediction`,
`seams.prediction_decay`, `Prediction`).

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
"""

from __future__ import annotations

import torch


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

    def before_update(self) -> dict:
        """The predicting segments' weights before an update (what `after_update` differences)."""
        return {k: [p.detach().clone() for _, p in self.owned[k]] for k in self.v}

    @torch.no_grad()
    def after_update(self, before: dict) -> None:
        for k, old in before.items():
            for (n, p), w in zip(self.owned[k], old):
                self.v[k][n].mul_(self.decay).add_(p - w, alpha=1.0 - self.decay)

    def nbytes(self) -> int:
        return sum(t.nbytes for v in self.v.values() for t in v.values())

    def state(self) -> dict:
        return {k: {n: t.detach().cpu() for n, t in v.items()} for k, v in self.v.items()}

    def load(self, state: dict | None) -> None:
        """`state` back (None: a checkpoint from before prediction existed, which had none)."""
        for k, v in (state or {}).items():
            for n, t in (v.items() if k in self.v else ()):
                self.v[k][n].copy_(t)
