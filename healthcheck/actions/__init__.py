"""The Actions layer: a pure decision per node (``decision.decide``, a table of rules) and the
one edge that applies it to Slurm (``apply.apply``). Findings become causes in ``cause``."""
from .apply import Applied, apply  # noqa: F401
from .decision import KINDS, Decision, Policy, decide  # noqa: F401
