"""Delivering queued AdminComment entries through Slurm's accounting commands
(``healthcheck.slurm.job_accounting``: sacct to read the field, sacctmgr to write it).
``deliver`` runs the queue now; ``deliver_in_background`` starts ``python -m slurm_hooks.delivery``
in its own session so the epilog exits at once and the accounting round trips (about 0.35 s per
sacctmgr call, more while slurmdbd is slow) stay off the job's critical path.
"""
from __future__ import annotations

import os
import sys
from typing import List, Optional, Sequence

from healthcheck.config import Config
from healthcheck.records.outbox import DeliveryReport, DeliverySettings, has_pending, rescan_due


def backend_for(config: Config):
    from healthcheck.slurm import backend_from_config

    return backend_from_config(config)


def deliver(config: Config, backend=None) -> DeliveryReport:
    """Queue what records want but the queue lacks (``requeue_missing``), then deliver."""
    from healthcheck.slurm.job_accounting import SlurmAccounting

    from healthcheck.records.outbox import deliver as deliver_queue

    return deliver_queue(config.state_dir, SlurmAccounting(backend or backend_for(config)),
                         DeliverySettings.from_config(config))


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
