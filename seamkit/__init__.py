"""seamkit: end-to-end vs local training across pipeline seams, and exact pruning of a training step."""

__version__ = "0.1.0"
