"""The seams study: cut a GPT between blocks, train it end to end or locally, compare at equal
wall-clock.

- `cuts`: where seams sit, the segments between them, what each segment owns, the traffic.
- `objectives`: the local objectives (aux heads, the model's own head) and the per-segment losses.
- `arm`: one arm (e2e or local) built, stepped and run for its budget on the shared loop.
- `run`: `seamkit train`, one e2e run with its checkpoint and summary.
- `processes`: each arm in a process of its own, taking turns in slices.
- `study`: seeds, the interleaved arms, the held-out views; `report` builds and prints the report.
- `costs`: each arm's parameters and FLOPs per token, counted on one real step (MFU: `seamkit.costs`).
- `pipeline/`: the same arms as real pipeline stages on torch.distributed.
"""
