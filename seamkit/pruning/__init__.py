"""The pruning study: skip the work of a training step that provably cannot reach the loss, and
prove it against a compiled, unpruned reference step.

- `rules`: which positions reach the loss, the plan, the pruned step (exact in arithmetic).
- `bitwise`: the pruned step arranged to match the unpruned step bit for bit on this CPU.
- `study`: `prune-check`: both modes against the reference, the rule probes, the timings, the report.
"""
