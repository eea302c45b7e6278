"""The classes a job ending falls into (a contract: the summary's ``by_cause`` keys and
``slurm-gpu job``'s ``class``). Hardware classes name what broke; the others are Slurm's view."""
from __future__ import annotations

# Slurm's own endings (sacct State words, plus REQUEUED for an incarnation that was requeued).
SLURM_CLASSES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "REQUEUED",
                 "NODE_FAIL", "OUT_OF_MEMORY")
# Hardware causes: the job ended (or was hurt) because the node's hardware failed under it.
HARDWARE_CLASSES = ("GPU_LOST", "GPU_XID", "GPU_ECC", "NVLINK", "INFINIBAND")
# Application causes: the job's own fault, named from evidence (GPU_OOM: a CUDA allocation
# failed). Not the node's fault: never a reason to drain, never a hardware culprit.
APPLICATION_CLASSES = ("GPU_OOM",)
CLASSES = SLURM_CLASSES + HARDWARE_CLASSES + APPLICATION_CLASSES
UNKNOWN = "UNKNOWN"


def is_hardware(cls: str) -> bool:
    return cls in HARDWARE_CLASSES


def is_application(cls: str) -> bool:
    return cls in APPLICATION_CLASSES
