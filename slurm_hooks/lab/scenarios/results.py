"""What a scenario run found: one ``JobResult`` per job, the checks of a result against its
scenario's expectations (pure), and the table and JSON the command prints."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from healthcheck.records import admin_comment

from .table import Scenario


@dataclass
class JobResult:
    scenario: str
    role: str                        # "job", or "preemptor" for the high-tier job
    expected: str
    job_id: Optional[str] = None     # as sacct shows it: 524_2 for an array task, 1234+1 for a component
    raw_job_id: Optional[str] = None  # sacct's JobIDRaw: SLURM_JOB_ID in the hooks, the journal's job_id
    state: str = ""
    exit_code: str = ""
    elapsed: str = ""
    nodes: str = ""
    partition: str = ""
    admin_comment: str = ""
    history: List[str] = field(default_factory=list)        # sacct -D: every incarnation
    drained: Dict[str, str] = field(default_factory=dict)   # node -> reason, seen after the job
    hooks: List[str] = field(default_factory=list)          # "prolog@gpu1", ... from the journal
    injected: List[str] = field(default_factory=list)       # the `slurm-gpu sim inject` run
    produced: bool = True
    note: str = ""
    problems: List[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def recorded_class(self) -> Optional[str]:
        """The job-ending class the hooks recorded in AdminComment (over all the job's
        entries: a node's hardware class wins over the job-level ``"*"`` entry), or None."""
        return recorded_class(self.admin_comment)

    def as_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        out["class"] = self.recorded_class
        return out


def state_matches(actual: str, expected: str) -> bool:
    """sacct says "CANCELLED by 0" (it adds the uid): compare by prefix."""
    return actual == expected or actual.startswith(expected + " ")


def recorded_class(text: Optional[str]) -> Optional[str]:
    from healthcheck.records.classify import job_class

    entries = admin_comment.parse(text)
    return job_class(entries) if entries else None


def problems_of(scenario: Scenario, result: JobResult, drain_prefix: str) -> List[str]:
    """What in ``result`` differs from what ``scenario`` expects (empty: as expected)."""
    problems: List[str] = []
    if not state_matches(result.state, result.expected):
        problems.append(f"sacct State is {result.state!r}, expected {result.expected!r}")
    if result.role == "preemptor":
        return problems
    expect = scenario.expect
    want_exit = expect.get("exit_code")
    if want_exit and result.exit_code != want_exit:
        problems.append(f"ExitCode is {result.exit_code!r}, expected {want_exit!r}")
    if expect.get("requeued") and not any(
            s.startswith(("PREEMPTED", "REQUEUED")) for s in result.history[:-1]):
        problems.append(f"no preempted incarnation in sacct -D ({result.history})")
    cause = expect.get("cause")
    if cause and cause not in result.admin_comment:
        problems.append(f"AdminComment {result.admin_comment!r} does not name {cause!r}")
    want_class = scenario.expect_class
    if want_class and result.recorded_class != want_class:
        problems.append(f"recorded class is {result.recorded_class!r}, expected {want_class!r} "
                        f"(AdminComment {result.admin_comment!r})")
    if "drain" in expect:
        ours = {n: r for n, r in result.drained.items() if r.startswith(drain_prefix)}
        if expect["drain"] and not ours:
            problems.append("expected a drain by this tool; no node drained")
        if not expect["drain"] and ours:
            problems.append(f"drained unexpectedly: {ours}")
    return problems


def format_results(results: Sequence[JobResult]) -> List[str]:
    header = (f"{'JOBID':>6}  {'SCENARIO':<26} {'EXPECTED':<14} {'SACCT STATE':<16} {'EXIT':<6} "
              f"{'ELAPSED':<9} {'NODES':<10} RESULT")
    lines = [header, "-" * len(header)]
    for r in results:
        label = r.scenario if r.role == "job" else f"{r.scenario} ({r.role})"
        verdict = "ok" if r.ok and r.produced else ("NOT PRODUCED" if not r.produced else "FAILED")
        lines.append(f"{r.job_id or '-':>6}  {label:<26} {r.expected:<14} {r.state or '-':<16} "
                     f"{r.exit_code or '-':<6} {r.elapsed or '-':<9} {r.nodes or '-':<10} {verdict}")
        for problem in r.problems:
            lines.append(f"{'':>8}! {problem}")
        if r.note:
            lines.append(f"{'':>8}{r.note}")
        if len(r.history) > 1:
            lines.append(f"{'':>8}every incarnation (sacct -D): {' -> '.join(r.history)}")
        if r.injected:
            lines.append(f"{'':>8}injected: {r.injected[0]}")
        if r.recorded_class:
            lines.append(f"{'':>8}recorded class: {r.recorded_class}")
        if r.drained:
            lines.append(f"{'':>8}drained: " + ", ".join(f"{n} ({why})" for n, why in r.drained.items()))
        if r.hooks:
            lines.append(f"{'':>8}hooks ran: {', '.join(r.hooks)}")
    return lines


ADMIN_HINTS = (
    'eval "$(slurm-gpu lab env)"',
    "sacct -X -S now-1hour -o JobID,JobName%26,Partition,State,ExitCode,Elapsed,NodeList,AdminComment",
    "sacct -D -X -j <requeued job id> -o JobID,State,Start,End   # every incarnation",
    "sinfo -R -o '%E|%u|%H|%N'                                    # drained nodes, full reason",
    "ls $LAB/state/hook-runs/; tail $LAB/state/hook-runs/slurmctld.jsonl   # the hooks' journal",
    "tail $LAB/var/log/slurmctld.log                                       # preemption, time limit, node failure",
)
