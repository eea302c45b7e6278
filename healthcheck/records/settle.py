"""Settling an ending that Slurm's live view could not tell apart from another.

From inside an epilog, a job that ran to its end and a job scancel'd before its batch step's end
reached slurmctld read the same: JobState COMPLETING, Reason None, ExitCode 0:0, exit variables
0:0 (seen on 22.05 in CI: the EpilogSlurmctld of a job cancelled 1 s after it started wrote
COMPLETED while sacct said ``CANCELLED by 0``). Accounting already has the final State then:
slurmctld sends it before it runs the epilogs.

So the epilog writes such an ending as COMPLETED with ``slurm_settled: false`` (``SlurmEnding.settled``),
and the delivery, which talks to accounting anyway, reads the job's final State before it writes
the entry (``outbox``). ``settled`` here is the pure decision: the record as accounting settles it.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from .classify import SlurmView, final_state, reclassify, slurm_ending

# scontrol's StartTime and sacct's Start are both whole seconds of the same clock.
SAME_START_S = 1.0


def wants_settling(record: Mapping[str, Any]) -> bool:
    return record.get("slurm_settled") is False


def settled(record: Mapping[str, Any], row: Optional[Mapping[str, str]]) -> Optional[Dict[str, Any]]:
    """``record`` settled by its job's ``sacct -X`` row (``slurm.job_accounting.FINAL_STATE_FIELDS``):
    marked settled, and reclassified with its own evidence when the final State tells another ending. None when the
    row cannot settle it: no row, a State that is not final yet, or another run of the job (a
    requeued job's row is its latest run's)."""
    if row is None or not final_state(row.get("State", "")):
        return None
    from ..slurm.backend import local_epoch

    started, start = record.get("started_at"), local_epoch(row.get("Start", ""))
    if isinstance(started, (int, float)) and start is not None and abs(float(started) - start) > SAME_START_S:
        return None
    ending = slurm_ending(SlurmView.from_sacct(row))
    new = dict(record, slurm_settled=True)
    if ending.cls == record.get("slurm_class"):
        return new
    cls, cause = reclassify(ending.cls, record.get("evidence") or [])
    new.update({"class": cls, "cause": cause, "slurm_class": ending.cls, "exit": ending.exit,
                "signal": ending.signal, "settled_from": record.get("class"),
                "slurm_why": f"accounting: State {row.get('State')}, ExitCode {row.get('ExitCode') or '-'} "
                             f"(the epilog saw: {record.get('slurm_why') or '-'})"})
    return new
