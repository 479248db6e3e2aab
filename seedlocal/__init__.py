"""seedlocal: SEED-RL-style central inference and GPU neuroevolution on one workstation."""

__version__ = "0.1.0"
