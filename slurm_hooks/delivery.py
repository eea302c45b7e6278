"""Delivering queued AdminComment entries through Slurm's accounting commands.

``SlurmAccounting`` adapts the Slurm backend to ``healthcheck.records.outbox.Accounting``
(sacct to read the field, sacctmgr to write it: scontrol refuses once the job is COMPLETING).
``deliver`` runs the queue now; ``deliver_in_background`` starts ``python -m slurm_hooks.delivery``
in its own session so the epilog exits at once and the accounting round trips (about 0.35 s per
sacctmgr call, more while slurmdbd is slow) stay off the job's critical path.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional, Sequence

from healthcheck.config import Config
from healthcheck.records.outbox import AccountingError, DeliveryReport, DeliverySettings, deliver_pending, pending


class SlurmAccounting:
    def __init__(self, backend):
        self.backend = backend

    def get_admin_comment(self, job_id: str) -> Optional[str]:
        from healthcheck.slurm import SlurmError

        try:
            rows = self.backend.accounting([job_id], ["JobID", "AdminComment"])
        except SlurmError as exc:
            raise AccountingError(str(exc)) from None
        for row in rows:
            if row.get("JobID", "").split("+")[0] == str(job_id):
                return row.get("AdminComment", "")
        return None

    def set_admin_comment(self, job_id: str, text: str) -> None:
        from healthcheck.slurm import SlurmError

        try:
            self.backend.set_admin_comment(job_id, text)
        except SlurmError as exc:
            if "didn't affect anything" in str(exc) or "Nothing modified" in str(exc):
                return      # the job is not in accounting yet: the read-back says so, it stays queued
            raise AccountingError(str(exc)) from None


def backend_for(config: Config):
    from healthcheck.slurm import backend_from_config

    return backend_from_config(config)


def deliver(config: Config, backend=None) -> DeliveryReport:
    settings = DeliverySettings.from_section(config.section("records"))
    return deliver_pending(config.state_dir, SlurmAccounting(backend or backend_for(config)), settings)


def deliver_in_background(config: Config) -> bool:
    """Start a detached delivery when something is queued; False when nothing needed it."""
    if not pending(config.state_dir):
        return False
    env = dict(os.environ)
    if config.path:
        env["SLURM_GPU_HOOKS_CONFIG"] = config.path
    started = subprocess.Popen([sys.executable, "-m", "slurm_hooks.delivery"], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                               close_fds=True, cwd="/")
    from healthcheck.watchdog import detached

    detached(started.pid)                 # meant to outlive the hook: a watchdog spares it
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    from healthcheck.hookenv import load_config_or_none

    config = load_config_or_none(os.environ, "delivery")
    if config is None:
        return 0
    report = deliver(config)
    if report.error:
        print(f"slurm-gpu-delivery: accounting unreachable, {len(report.waiting)} job(s) stay queued: "
              f"{report.error}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
