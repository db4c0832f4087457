"""seamkit: end-to-end vs local training across pipeline seams, and exact pruning of a training step."""

import os as _os

# OpenMP threads that spin while waiting take the cores a busy neighbour (JupyterLab, a browser,
# another arm) needs; passive waiting keeps most of the throughput there and costs little when
# quiet (bench/seams.py --part threads). OpenMP reads this once, when torch loads: every entry
# point (the CLI, a notebook kernel, the arms' spawned processes) imports seamkit first. A value
# the user set is kept.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
