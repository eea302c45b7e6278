"""The lab: a real Slurm cluster (munged, MariaDB, slurmdbd, slurmctld, three slurmd) on
this one machine, with this project's hooks installed, a scenario runner and the demo.

Everything lives under one lab directory (``--dir``, ``$SLURM_GPU_LAB_DIR``, default
``/var/tmp/slurm-gpu-lab``); see ``docs/lab.md``.
"""


class LabError(Exception):
    """Something the lab cannot do, said in one line (the CLI prints it and exits non-zero)."""
