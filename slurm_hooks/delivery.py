"""Delivering queued AdminComment entries through Slurm's accounting commands.

``SlurmAccounting`` adapts the Slurm backend to ``healthcheck.records.outbox.Accounting``
(sacct to read the field, sacctmgr to write it: scontrol refuses once the job is COMPLETING).
``deliver`` runs the queue now; ``deliver_in_background`` starts ``python -m slurm_hooks.delivery``
in its own session so the epilog exits at once and the accounting round trips (about 0.35 s per
sacctmgr call, more while slurmdbd is slow) stay off the job's critical path.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Sequence

from healthcheck.config import Config
from healthcheck.records.outbox import (AccountingError, DeliveryReport, DeliverySettings, deliver_pending,
                                        has_pending, requeue_missing, rescan_due)


class SlurmAccounting:
    def __init__(self, backend):
        self.backend = backend
        self._targets: Dict[str, str] = {}     # job id -> the id sacctmgr changes that row alone by

    def get_admin_comment(self, job_id: str) -> Optional[str]:
        return self.get_admin_comments([job_id])[job_id]

    def get_admin_comments(self, job_ids: List[str]) -> Dict[str, Optional[str]]:
        """Every job's AdminComment with one sacct (None: not in accounting yet)."""
        found = self._rows(job_ids, ["JobID", "JobIDRaw", "AdminComment"])
        return {job: None if row is None else row.get("AdminComment", "") for job, row in found.items()}

    def final_states(self, job_ids: List[str]) -> Dict[str, Optional[Dict[str, str]]]:
        """Every job's ``sacct -X`` State, ExitCode and Start with one sacct (None: not in accounting yet)."""
        from healthcheck.records.settle import FIELDS

        return self._rows(job_ids, FIELDS)

    def _rows(self, job_ids: List[str], fields: List[str]) -> Dict[str, Optional[Dict[str, str]]]:
        """Each job's row of one ``sacct -X`` (``row_of``); the id sacctmgr writes it by is noted."""
        from healthcheck.slurm import SlurmError

        try:
            rows = self.backend.accounting(list(job_ids), fields)
        except SlurmError as exc:
            raise AccountingError(str(exc)) from None
        found = {job: row_of(rows, job) for job in job_ids}
        for job, row in found.items():
            if row is not None:
                self._targets[job] = sacctmgr_job_id(job, row)
        return found

    def set_admin_comment(self, job_id: str, text: str) -> None:
        from healthcheck.slurm import SlurmError

        try:
            self.backend.set_admin_comment(self._targets.get(job_id, job_id), text)
        except SlurmError as exc:
            if "didn't affect anything" in str(exc) or "Nothing modified" in str(exc):
                return      # the job is not in accounting yet: the read-back says so, it stays queued
            raise AccountingError(str(exc)) from None


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


def backend_for(config: Config):
    from healthcheck.slurm import backend_from_config

    return backend_from_config(config)


def deliver(config: Config, backend=None) -> DeliveryReport:
    """Queue what records want but the queue lacks (``requeue_missing``), then deliver."""
    settings = DeliverySettings.from_section(config.section("records"))
    requeue_missing(config.state_dir, settings.expire_s)
    return deliver_pending(config.state_dir, SlurmAccounting(backend or backend_for(config)), settings)


def report_lines(report: DeliveryReport) -> List[str]:
    """What a delivery run must say (stderr and the hook journal): never a silent loss."""
    lines = []
    if report.error:
        lines.append(f"accounting unreachable, {len(report.waiting)} job(s) stay queued: {report.error}")
    if report.expired:
        lines.append(f"{len(report.expired)} job(s)' entries dropped from the queue, older than [records] "
                     f"outbox_expire_s (their records stay in the state dir): {' '.join(report.expired[:20])}"
                     + (" ..." if len(report.expired) > 20 else ""))
    if report.set_aside:
        lines.append(f"{len(report.set_aside)} malformed queue file(s) moved aside as .corrupt: "
                     f"{' '.join(report.set_aside[:20])}" + (" ..." if len(report.set_aside) > 20 else ""))
    return lines


def deliver_in_background(config: Config, rescan: bool = False) -> bool:
    """Start a detached delivery when something is queued (with ``rescan``, the epilog's, also when
    a rescan of the records is due: ``requeue_missing``); False when nothing needed it."""
    if not has_pending(config.state_dir) and not (rescan and rescan_due(config.state_dir)):
        return False
    import subprocess      # only when something is to be delivered: a healthy hook starts nothing

    env = dict(os.environ)
    if config.path:
        env["SLURM_GPU_HOOKS_CONFIG"] = config.path
    started = subprocess.Popen([sys.executable, "-m", "slurm_hooks.delivery"], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                               close_fds=True, cwd="/")
    from healthcheck.hooklib.watchdog import detached

    detached(started.pid)                 # meant to outlive the hook: a watchdog spares it
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    from healthcheck.hooklib.skeleton import load_config_or_none

    config = load_config_or_none(os.environ, "delivery")
    if config is None:
        return 0
    report = deliver(config)
    for line in report_lines(report):
        print(f"slurm-gpu-delivery: {line}", file=sys.stderr)
    if report.expired or report.set_aside:
        # Its stderr goes nowhere (detached): a loss is also said in the hook journal.
        from healthcheck.config import node_name
        from healthcheck.hooklib.skeleton import journal

        node = "slurmctld" if os.environ.get("SLURM_SCRIPT_CONTEXT") == "epilog_slurmctld" else node_name(None)
        journal(config, "delivery", node, None, delivered=len(report.delivered), waiting=len(report.waiting),
                deferred=report.deferred, expired=report.expired, set_aside=report.set_aside)
    return 0


if __name__ == "__main__":
    sys.exit(main())
