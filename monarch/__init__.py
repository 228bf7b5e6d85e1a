"""Monarch: hierarchical data staging for deep-learning training on HPC clusters."""

__version__ = "0.1.0"
