"""podracer-hpc: massively parallel deep RL pods on Slurm GPU clusters."""

__version__ = "0.1.0"
