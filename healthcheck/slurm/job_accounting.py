"""A job's row in Slurm's accounting: read with sacct, its AdminComment written with sacctmgr
(scontrol refuses once the job is COMPLETING). ``SlurmAccounting`` adapts a backend to what the
outbox delivers through (``healthcheck.records.outbox.Accounting``); a failed command raises
``SlurmError`` (the outbox's ``AccountingError``).
"""
from __future__ import annotations

from typing import Dict, List, Optional

from .backend import SlurmError

# What the delivery asks sacct for to settle an ending by its final State (records/settle.py).
FINAL_STATE_FIELDS = ["JobID", "JobIDRaw", "State", "ExitCode", "Start"]


class SlurmAccounting:
    def __init__(self, backend):
        self.backend = backend
        self._targets: Dict[str, str] = {}     # job id -> the id sacctmgr changes that row alone by

    def get_admin_comments(self, job_ids: List[str]) -> Dict[str, Optional[str]]:
        """Every job's AdminComment with one sacct (None: not in accounting yet)."""
        found = self._rows(job_ids, ["JobID", "JobIDRaw", "AdminComment"])
        return {job: None if row is None else row.get("AdminComment", "") for job, row in found.items()}

    def final_states(self, job_ids: List[str]) -> Dict[str, Optional[Dict[str, str]]]:
        """Every job's ``sacct -X`` State, ExitCode and Start with one sacct (None: not in accounting yet)."""
        return self._rows(job_ids, FINAL_STATE_FIELDS)

    def _rows(self, job_ids: List[str], fields: List[str]) -> Dict[str, Optional[Dict[str, str]]]:
        """Each job's row of one ``sacct -X`` (``row_of``); the id sacctmgr writes it by is noted."""
        rows = self.backend.accounting(list(job_ids), fields)
        found = {job: row_of(rows, job) for job in job_ids}
        for job, row in found.items():
            if row is not None:
                self._targets[job] = sacctmgr_job_id(job, row)
        return found

    def set_admin_comment(self, job_id: str, text: str) -> None:
        try:
            self.backend.set_admin_comment(self._targets.get(job_id, job_id), text)
        except SlurmError as exc:
            if "didn't affect anything" not in str(exc) and "Nothing modified" not in str(exc):
                raise
            # the job is not in accounting yet: the read-back says so, it stays queued


def row_of(rows, job_id: str):
    """The accounting row of ``job_id`` among ``sacct -X -j job_id``'s: the hooks know a job by its
    raw id (``SLURM_JOB_ID``), which sacct shows as JobIDRaw: an array task's JobID is ``524_1``,
    a heterogeneous job's component ``1234+1``, and ``sacct -j 524`` lists every task of array 524.
    A person may give the shown id (``524_7``): that JobID is taken first."""
    job_id = str(job_id)
    return next((r for r in rows if r.get("JobID") == job_id), None) or \
        next((r for r in rows if r.get("JobIDRaw") == job_id), None)


def sacctmgr_job_id(job_id: str, row: Dict[str, str]) -> str:
    """The id ``sacctmgr modify job where jobid=...`` changes ``row`` alone by. The raw id of a
    heterogeneous job's leader, and of the array task that keeps the array's own id (the last
    task), changes every component's or task's row (measured on 22.05, 24.11 and 26.05 for het
    jobs, on 22.05 and 24.11 for arrays: one task's entry replaced every other task's);
    ``<leader>+0`` and ``<array>_<task>`` change that row only."""
    raw, shown = row.get("JobIDRaw", ""), row.get("JobID", "")
    if raw and shown == f"{raw}+0":
        return shown
    array, _, task = shown.partition("_")
    if raw and array == raw and task.isdigit():
        return shown
    return str(job_id)
