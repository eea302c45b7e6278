"""How each kind of scenario is produced: submit its job, do to it what the kind says
(cancel it, preempt it, kill its node's slurmd, break its hardware), wait, collect.

``DRIVERS`` maps each ``table.KINDS`` entry to one function; ``drive`` runs a scenario
through its driver and checks the results against the scenario (``report.problems_of``).
"""
from __future__ import annotations

import os
import shlex
import signal
import time
from typing import Callable, Dict, List

from .. import LabError
from .. import daemons as D
from .. import render
from .results import JobResult, problems_of
from .session import LabSession
from .table import Scenario

Driver = Callable[[LabSession, Scenario, JobResult, List[JobResult], List[str]], None]


def drive(session: LabSession, scenario: Scenario) -> List[JobResult]:
    main = JobResult(scenario.name, "job", scenario.expect_state)
    results = [main]
    began = time.monotonic()
    jobs: List[str] = []
    try:
        DRIVERS[scenario.kind](session, scenario, main, results, jobs)
    except LabError as exc:
        main.problems.append(str(exc))
        session.slurm.cancel(*jobs)
    finally:
        if scenario.uses_sim:
            try:
                session.restore_node(scenario.nodes[0])
            except LabError as exc:
                main.problems.append(f"restoring {scenario.nodes[0]}: {exc}")
    main.seconds = round(time.monotonic() - began, 1)
    for result in results:
        if result.produced and result.job_id and not result.problems:
            result.problems.extend(problems_of(scenario, result, session.drain_prefix))
    return results


def drive_simple(session: LabSession, scenario: Scenario, main: JobResult, results: List[JobResult],
                 jobs: List[str]) -> None:
    job_id = session.submit(scenario, scenario.sbatch, scenario.payload)
    jobs.append(job_id)
    info = session.wait_final(job_id, 200)
    session.collect(main, job_id, info)
    session.await_class(scenario, main)
    session.observe_drains(scenario, main)


def drive_oom(session: LabSession, scenario: Scenario, main: JobResult, results: List[JobResult],
              jobs: List[str]) -> None:
    if not session.cgroup:
        main.produced = False
        why = render.cgroup_v1_memory() or "the lab was brought up without memory cgroups"
        main.note = f"not produced: OUT_OF_MEMORY needs memory cgroups, and {why}"
        return
    drive_simple(session, scenario, main, results, jobs)


def drive_cancel(session: LabSession, scenario: Scenario, main: JobResult, results: List[JobResult],
                 jobs: List[str]) -> None:
    job_id = session.submit(scenario, scenario.sbatch, scenario.payload)
    jobs.append(job_id)
    session.wait_ready(scenario, job_id)
    session.slurm.cancel(job_id)
    info = session.wait_final(job_id, 60)
    session.collect(main, job_id, info)
    session.await_class(scenario, main)


def drive_preempt(session: LabSession, scenario: Scenario, main: JobResult, results: List[JobResult],
                  jobs: List[str]) -> None:
    job_id = session.submit(scenario, scenario.sbatch, scenario.payload)
    jobs.append(job_id)
    session.wait_ready(scenario, job_id)
    high = JobResult(scenario.name, "preemptor", scenario.expect.get("preemptor", "COMPLETED"))
    results.append(high)
    high_id = session.submit(scenario, ["--partition=high", "--exclusive", "--gres=gpu:8"],
                             ["sleep", "3"], role="preemptor")
    jobs.append(high_id)
    info = session.wait_final(job_id, 120, start_requeued=bool(scenario.expect.get("requeued")))
    high_info = session.wait_final(high_id, 60)
    session.collect(main, job_id, info)
    session.await_class(scenario, main)
    session.collect(high, high_id, high_info)


def drive_node_fail(session: LabSession, scenario: Scenario, main: JobResult, results: List[JobResult],
                    jobs: List[str]) -> None:
    node = scenario.nodes[0]
    daemon = D.by_name(session.lab, f"slurmd {node}")
    job_id = session.submit(scenario, scenario.sbatch, scenario.payload)
    jobs.append(job_id)
    session.wait_ready(scenario, job_id)
    pid = daemon.pid(session.lab)
    if pid is None:
        raise LabError(f"slurmd {node} is not running")
    os.kill(pid, signal.SIGKILL)
    session.echo(f"{scenario.name}: killed slurmd {node} (pid {pid}) with SIGKILL; "
                 "slurmctld notices after SlurmdTimeout (~27 s)")
    info: Dict[str, str] = {}
    try:
        info = session.wait_final(job_id, 90)
    finally:
        D.start(session.lab, daemon, session.echo)
        session.wait(f"{node} back", lambda: D.node_responding(
            session.slurm.nodes().get(node, {}).get("state", "")), 40)
    session.collect(main, job_id, info)
    session.await_class(scenario, main)


def drive_fault(session: LabSession, scenario: Scenario, main: JobResult, results: List[JobResult],
                jobs: List[str]) -> None:
    node = scenario.nodes[0]
    job_id = session.submit(scenario, scenario.sbatch, scenario.payload)
    jobs.append(job_id)
    ready = session.wait_ready(scenario, job_id)
    gpu = int(ready.get("gpus", "0").split(",")[0])
    values = {"gpu": gpu, "pid": ready.get("pid", "0"), "pci": session.kernel_pci(node, gpu)}
    assignments = [item.format(**values) for item in scenario.inject]
    logs = [item.format(**values) for item in scenario.log]
    args = ["sim", "inject", node, *assignments]
    for line in logs:
        args += ["--log", line]
    session.slurm_gpu(*args)
    main.injected = ["slurm-gpu " + " ".join(shlex.quote(a) for a in args)]
    session.echo(f"{scenario.name}: injected on {node} GPU {gpu}: {' '.join(assignments)}")
    info = session.wait_final(job_id, 60)
    session.collect(main, job_id, info)
    session.await_class(scenario, main)
    session.observe_drains(scenario, main)


def _each_part(session: LabSession, scenario: Scenario, main: JobResult, results: List[JobResult],
               ids: List[str], role: str) -> None:
    """Wait for every array task or component (sacct's ids) to end; each is its own result."""
    from ..slurmcli import is_final

    def ended() -> bool:
        rows = [session.slurm.sacct(shown) for shown in ids]
        return all(r and is_final(r[0]["State"]) for r in rows)
    session.wait(f"{scenario.name}: {', '.join(ids)} to end", ended, 200)
    for index, shown in enumerate(ids):
        result = main
        if index:
            result = JobResult(scenario.name, f"{role} {shown}", scenario.expect_state)
            results.append(result)
        session.collect(result, shown)
        session.await_class(scenario, result)


def drive_array(session: LabSession, scenario: Scenario, main: JobResult, results: List[JobResult],
                jobs: List[str]) -> None:
    array_id = session.submit(scenario, [*scenario.sbatch, f"--array={scenario.array}"], scenario.payload)
    jobs.append(array_id)
    _each_part(session, scenario, main, results, [f"{array_id}_{task}" for task in scenario.array_tasks], "task")


def drive_hetjob(session: LabSession, scenario: Scenario, main: JobResult, results: List[JobResult],
                 jobs: List[str]) -> None:
    het_id = session.submit_het(scenario, scenario.payload)
    jobs.append(het_id)
    _each_part(session, scenario, main, results, [f"{het_id}+{k}" for k in range(len(scenario.components))],
               "component")


DRIVERS: Dict[str, Driver] = {
    "array": drive_array,
    "hetjob": drive_hetjob,
    "simple": drive_simple,
    "cancel": drive_cancel,
    "preempt": drive_preempt,
    "node_fail": drive_node_fail,
    "fault": drive_fault,
    "oom": drive_oom,
}
