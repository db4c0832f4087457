"""seamkit: end-to-end vs local training across pipeline seams, and exact pruning of a training step."""

import os as _os
import sys as _sys

# OpenMP threads that spin while they wait take the core a busy neighbour needs: beside one
# CPU-bound process, 2 spinning threads kept 0.23x of their quiet tokens/s, 2 passive ones 0.80x,
# but passive waiting cost about half when the machine was quiet (bench/results/seams_threads.json).
# A run's thread count is chosen at its start from the load then (seamkit.threads); a browser
# beside a notebook kernel wakes up later, while training runs. So: passive in an interactive
# notebook kernel (the arms it spawns inherit it), OpenMP's default on the command line and in
# headless runs (`seamkit reproduce` and every sweep point set HEADLESS_ENV for their kernels).
# OpenMP reads this once, when torch loads; every entry point imports seamkit first. A value the
# user set is kept. Placement calibrations are keyed on the policy: a two-thread process waiting
# passively runs about a third slower, so a speed measured under one policy does not stand for
# the other (seamkit.seams.calibration).
HEADLESS_ENV = "SEAMKIT_HEADLESS"
if "ipykernel" in _sys.modules and not _os.environ.get(HEADLESS_ENV):
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
