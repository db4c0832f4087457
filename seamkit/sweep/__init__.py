"""`seamkit sweep`: a study's notebook run once per grid point and seed, then aggregated.

- `plan`: the grid, every point with its papermill parameters, every request checked before any work.
- `folder`: where a sweep's plan and each point's files go, a point's shell command, the plan read back.
- `status`: a point's status, read from its files (complete, failed, interrupted or pending).
- `stats`: each point's key figures as numbers and, per grid point, the summary across seeds.
- `plots`: the sweep's table and figures, and the notebook panel that shows them (from the
  collected sweep dict only; `collect` calls them, they never call back).
- `collect`: every point's status and numbers into sweep.json, the CSV tables and the figures.
- `run`: running the points here as papermill children (signals, stops), or emitting their commands.
"""
