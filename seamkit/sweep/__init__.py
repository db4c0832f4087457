"""`seamkit sweep`: a study's notebook run once per grid point and seed, then aggregated.

- `plan`: the grid, every point with its papermill parameters, its folder and shell command.
- `run`: running the points as papermill children, their status, collecting the sweep.
- `stats`: each point's key figures and, per grid point, the summary across seeds.
- `plots`: the sweep's table and figures, and the notebook panel that shows them (from the
  collected sweep dict only; `run.collect` calls them, they never call back).
"""
