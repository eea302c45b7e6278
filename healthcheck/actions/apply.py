"""The one edge where a decision changes Slurm: ``apply(backend, decision)``.

It runs the scontrol call the decision names through the backend (``--dry-run``: it only says
what it would run) and never raises for Slurm's failures: the caller logs them and, because
nothing was applied, does not commit what it read (the next run decides again).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from ..slurm.backend import SlurmBackend, SlurmError
from ..watchdog import note
from .decision import Decision


@dataclass
class Applied:
    decision: Decision
    argv: Optional[List[str]]        # ["scontrol", "update", ...] run (or, dry run, that would run)
    done: bool                       # Slurm was changed
    dry_run: bool = False
    error: Optional[str] = None      # one line: why the change failed

    @property
    def settled(self) -> bool:
        """Nothing is left to do for this decision: applied, or nothing to apply."""
        return self.error is None and (self.done or not self.decision.changes_slurm)


def apply(backend: SlurmBackend, decision: Decision, dry_run: bool = False) -> Applied:
    argv = ["scontrol", *decision.scontrol] if decision.scontrol else None
    if not decision.changes_slurm:
        return Applied(decision, argv, done=False, dry_run=dry_run)
    if dry_run:
        return Applied(decision, argv, done=False, dry_run=True)
    # Said before the call: a watchdog that fires while scontrol runs cannot know whether Slurm
    # took the change, and the hook's exit must assume it did (healthcheck.watchdog).
    note(decision.kind, "applying")
    try:
        if decision.kind == "drain":
            backend.drain(decision.node, decision.reason or "")
        else:
            backend.resume(decision.node)
    except SlurmError as exc:
        note(decision.kind, "failed")
        return Applied(decision, argv, done=False, error=str(exc))
    note(decision.kind, "applied")
    return Applied(decision, argv, done=True)
