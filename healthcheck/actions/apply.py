"""The edge that applies a decision to Slurm lives in the drain gate (``gate.apply``); this name
stays for its callers."""
from .gate import Applied, apply  # noqa: F401
