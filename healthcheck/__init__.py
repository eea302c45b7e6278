"""Node-side GPU, NVLink and InfiniBand health: probes gather facts, checks judge them.

Never imports ``slurm_hooks``: the dependency points the other way.
"""
__version__ = "0.1.0"
