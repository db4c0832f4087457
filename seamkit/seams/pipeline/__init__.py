"""Seams as real pipeline stages on torch.distributed: measured traffic, the best e2e schedule,
asynchronous local training.

The one-process seams study (`seams.study`) counts the traffic across seams on paper. Here the two arms run as a
real pipeline, one process per rank, and every message that crosses a seam is counted.

What runs where (plan.py). The local arm trains the config's seams (`seams.seams`, default "all":
a seam after every block), as one process does: its segments are grouped into S contiguous runs,
one per rank, balanced by block count, so every stage boundary is a seam (fewer segments than
stages is refused before a process starts). The e2e arm runs a
torch.distributed.pipelining schedule (`seams.pipeline_schedule`: gpipe, 1f1b, interleaved1f1b,
interleavedzb, zbv, dualpipev) with `seams.micro_batches` M per step; the multi-stage schedules
cut the model into 2S segments and put two on every rank. Every rank builds the whole GPT from
`train.seed` and keeps its segments, so the weights are those of the single-process arms.
Backend gloo on CPU, NCCL on CUDA (one GPU per rank: a 2-rank NCCL run needs two GPUs).

The arms:
- e2e (e2e.py): the schedule's forwards and backwards, then one small all_reduce (gradient
  norms, loss, non-finite flags, stop flag), a global-norm clip exactly as one process clips,
  and one update. Equal to one process doing the same micro-batched step.
- local (local.py): activations go forward only, at most `queue` steps of sends in flight; each
  segment learns from its own loss and no rank waits for a gradient. Equal to the
  single-process local arm with the same seams.

What crosses and how it is counted (wire.py): every P2P op is counted by kind (activation,
gradient, control, fault, eval, allreduce) and boundary; `measured_bytes` must equal the analytic
bytes of the arm's crossings. Wait time is timed where a rank blocks; compute is timed apart.

How ranks start, fail and stop (launch.py): `launch` runs each arm on fresh processes (memory
from each arm's own baseline); a non-finite loss ends the arm on every rank at once with
`failed`, the rank and the step; a rank that raises or dies stops the run within a poll, and the
report still says which rank, arm and step. Ctrl-C writes an `interrupted` report.

Entry points:
  torchrun --nproc-per-node S -m seamkit.seams.pipeline --preset tiny --max-steps 5 --out r.json
  python -m seamkit.seams.pipeline --stages S --schedule 1f1b --micro-batches 8 ...
  seamkit seams --stages S --schedule zbv --micro-batches 8 ...
  seamkit.seams.pipeline.launch(cfg, out_path, stages)     (from a notebook; returns the report)
"""

from seamkit.seams.pipeline.assemble import summary
from seamkit.seams.pipeline.launch import DistError, launch
from seamkit.seams.pipeline.plan import make_plan

__all__ = ["DistError", "launch", "make_plan", "summary"]
