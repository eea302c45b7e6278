"""Expedited requeue (Slurm 25.11+): whether the node epilog exits non-zero so that Slurm
requeues a job submitted with ``--requeue=expedite`` at once, as the highest-priority job, after
a hardware fault on one of the job's own GPUs. Pure.

Opt-in (``[records] expedite_on_hardware``): a non-zero Epilog exit is also an "Epilog error"
drain in Slurm, so only a hardware class (``job-classes.toml`` ``hardware_precedence``) whose
evidence names a GPU the job was given qualifies; the application's own faults, a fault on a GPU
the job did not have, and the links (NVLink, InfiniBand: no GPU of the job's named) never do.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional


def expedite(enabled: bool, cls: str, cause: Optional[Mapping[str, Any]], job_gpus: Optional[Iterable[int]]) -> bool:
    from .classify import rules

    if not enabled or cause is None or job_gpus is None or cls not in rules()["hardware_precedence"]:
        return False
    gpu = cause.get("gpu")
    return isinstance(gpu, int) and not isinstance(gpu, bool) and gpu in set(job_gpus)
