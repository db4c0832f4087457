"""The pruning study: skip the work of a training step that provably cannot reach the loss, and
prove it against a compiled, unpruned reference step.

Modules, each importing only those above it:
- `tiles`: the pruned step's attention layout: whole documents in padded tiles, one SDPA call a block.
- `rules`: which positions reach the loss, the plan (built on the host, one copy to the device),
  the pruned step (exact in arithmetic), FLOPs.
- `gemm`: the bitwise step's GEMMs (weight gradients in the BLAS's token blocks, row subsets tried).
- `bitwise`: the pruned step arranged to match the unpruned step bit for bit on this CPU.
- `step`: one training step from the checkpoint (`Stepper`), and the step each mode runs.
- `compare`: the four differences between two steps, and what a step ran (`stats`).
- `reference`: the compiled reference step, and the determinism compared steps run under.
- `probes`: the rules tested bitwise in the unpruned step (tokens and query-side inputs changed).
- `timing`: a timed step's seconds, memory, precision and dispatched ops, and the CPU's peak of
  live tensor bytes.
- `report`: the study's report: its fields, a window's pattern, the verdicts, the printed table.
- `study`: `prune-check`: both modes against the reference, window by window, filling the report.
"""
