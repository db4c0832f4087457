"""The arms of the seams study, as points of one seam policy.

A seam hands its segment's output forward. What comes back across it is the policy:
- e2e: the gradient, at once (delay 0);
- delayed: the gradient, `seams.delay` steps later, as an asynchronous pipeline delivers it
  (with weight stashing, PipeDream's update: Narayanan et al., SOSP 2019; without, PipeMare's:
  Yang et al., MLSys 2021), optionally mixed with a local loss, its staleness optionally
  corrected (`seams.lr_delay_steps`, `seams.weight_prediction`, `seams.error_feedback`,
  `seams.nesterov_momentum`: `corrections`);
- local: nothing; each segment learns from its local objective alone, with weight 1.

One segment chain (`seams.chain`) runs every point of the policy, in one process and as one rank
loop on stages, so a new arm is a new point here and never a new step. What follows from a
point: whether a gradient crosses at all (`crosses`), and with it whether segments clip together
(a global norm, as one backprop clips) or each on its own (independent learners need no
collective).
"""

from __future__ import annotations

from dataclasses import dataclass

ARMS = ("e2e", "local", "delayed")  # every arm a study may run, in the one order reports use


@dataclass(frozen=True)
class Policy:
    arm: str  # the point's name, one of ARMS
    delay: int | None  # steps an output-gradient takes to cross each seam backwards; None: it never crosses
    objective: str | None  # what a non-final segment learns from locally (seams.objectives); None: nothing
    local_weight: float  # the weight of that local loss's gradient
    stashing: bool  # a late backward runs under the weights its forward used

    @property
    def crosses(self) -> bool:
        """A gradient crosses the seams (e2e, delayed): the segments learn as one model and clip
        by one global norm. None crosses (local): each segment clips what it owns."""
        return self.delay is not None


def policy(arm: str, seams) -> Policy:
    """The point of the policy `arm` names, with the knobs of `seams` (a SeamsConfig)."""
    if arm == "e2e":
        return Policy("e2e", 0, None, 0.0, False)
    if arm == "local":
        return Policy("local", None, seams.objective, 1.0, False)
    if arm == "delayed":
        w = seams.local_weight
        return Policy("delayed", seams.delay, "aux_head" if w > 0 else None, w, seams.weight_stashing)
    raise ValueError(f"unknown arm {arm!r}; one of {', '.join(ARMS)}")
