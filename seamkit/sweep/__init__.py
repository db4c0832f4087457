"""`seamkit sweep`: a study's notebook run once per grid point and seed, then aggregated.

- `run`: the plan, running the points as papermill children, their status, collecting.
- `stats`: each point's key figures and, per grid point, the summary across seeds.
- `plots`: the sweep's table and figures, and the notebook panel that shows them.
"""
