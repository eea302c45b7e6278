"""``slurm-gpu lab scenarios``: submit jobs that end every way a job can end, break the
simulated hardware under some of them, wait, and report what sacct says.

By concern:

* ``table``     the scenario table (data: ``slurm_hooks/data/lab-scenarios.toml``) and its loading;
* ``scheduler`` which scenarios may run at the same time (pure rules) and the loop that runs them;
* ``session``   one run's view of the lab: submit, wait, read sacct/scontrol/the hooks' journal;
* ``drivers``   how each kind of scenario is produced (cancel, preempt, kill slurmd, inject a fault);
* ``report``    results, their checks against the table's expectations, the printed table and JSON.
"""
from __future__ import annotations

import os
import time
from typing import Callable, List, Sequence

from .. import LabError
from .. import paths as P
from ..paths import LabPaths
from .results import ADMIN_HINTS, JobResult, format_results, problems_of, recorded_class, state_matches
from .table import KINDS, Scenario, load_table, parse_table

__all__ = ["ADMIN_HINTS", "JobResult", "KINDS", "Scenario", "format_results", "load_table", "parse_table",
           "problems_of", "recorded_class", "run_scenarios", "state_matches"]


def _exclusive(lab: LabPaths, echo: Callable[[str], None], timeout: float) -> int:
    """One scenario run per lab: a second one waits (it would cancel the first one's jobs)."""
    import fcntl

    if not os.path.isdir(lab.run):
        raise LabError(f"the lab at {lab.root} is not up: run `slurm-gpu lab up` first")
    fd = os.open(os.path.join(lab.run, "scenarios.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    deadline = time.monotonic() + timeout
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if not told:
                echo("another `slurm-gpu lab scenarios` runs on this lab: waiting for it to finish")
                told = True
            if time.monotonic() > deadline:
                os.close(fd)
                raise LabError("another `slurm-gpu lab scenarios` run held the lab too long") from None
            time.sleep(1)


def run_scenarios(lab: LabPaths, table: Sequence[Scenario], echo: Callable[[str], None],
                  timeout: float = 600) -> List[JobResult]:
    from .drivers import drive
    from .scheduler import run_table
    from .session import LabSession

    fd = _exclusive(lab, echo, timeout)
    try:
        session = LabSession(lab, echo, timeout)
        session.preflight()
        results = run_table(table, P.NODES, lambda s: drive(session, s), session.echo, session.deadline)
        time.sleep(1.0)  # the last EpilogSlurmctld may still be writing its journal line
        session.attach_hooks(results)
    finally:
        os.close(fd)
    session.echo(f"{len(table)} scenario(s), {sum(1 for r in results if r.job_id)} job(s) in "
                 f"{time.monotonic() - session.began:.0f} s")
    return results
