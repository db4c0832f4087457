"""The seams study: cut a GPT between blocks, train it end to end, locally or with delayed
gradients, and compare at equal wall-clock on the same hardware.

Design. An arm is a point of one seam policy (`policy`): what comes back across a seam, the
gradient at once (e2e), the gradient `delay` steps later (delayed), or nothing (local). One
segment chain (`chain`) trains every point, in one process and as one rank loop on stages;
torch's pipeline schedules (`schedules`) and DDP (`ddp`) are e2e-only placements that share the
step's clip, update and non-finite handling (`update`). A placement (`placement`: the one
definition, for the study, its calibration and the forecast) says where the segments run; one
budget loop drives any placement's step on every rank (`ranks`), and one launcher starts the
ranks (`launch`) for the study's arms (`processes`, taking `turns`); under torchrun each rank runs
one arm (`torchrun`).

- `policy`: the arms as points of the seam policy.
- `cuts`, `objectives`: what each segment owns and the traffic across seams; the local objectives
  and private modules.
- `chain`, `inflight`, `update`: the one training step, what it keeps in flight, its end;
  `corrections`: the delayed arm's staleness corrections.
- `stages`, `schedules`, `ddp`: each placement kind's step around it; `wire`: counted P2P.
- `placement`, `calibration`: where each arm runs and how fast each candidate is on this host.
- `ranks`, `words`, `turns`: the budget loop on a rank, rank 0's words, the study's turns.
- `arm`: one arm on one rank, built, trained, evaluated, checkpointed; `launch`: the launcher;
  `torchrun`: one arm under torchrun, on one machine or several.
- `processes`, `study`, `report`, `result`, `resume`, `snapshots`, `per_token`: the study.
- `run`: `seamkit train`, one e2e run with its checkpoint and summary.
"""
