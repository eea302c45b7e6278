"""``slurm-gpu lab soak``: the whole system on the lab for minutes or hours, under faults.

Jobs of every shape end continuously; the simulator's hardware faults are injected at random
on random nodes and mended later; slurmdbd and slurmctld are restarted at random; a watcher is
killed at random and started again; remediation is on. What it saw becomes one results
document (docs/reliability.md has its keys): jobs, their records in accounting, records lost,
drains and their causes, false drains, reboots, nodes back in service, the watchers' memory
and descriptors over time.

The pure parts (tested without a lab, tests/test_lab_soak.py): the schedule drawn from a seed
(``schedule``), the drain bookkeeping (``DrainTracker``, ``attribute``), the watcher summary
(``watcher_summary``), the results (``results``) and the table (``format_table``). ``run_soak``
is the only part that touches the lab.
"""
from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from healthcheck.safeio.fsutil import atomic_write

from . import LabError
from . import paths as P

Say = Callable[[str], None]

# -- what the soak does, as data ------------------------------------------------------------------
XID79 = "NVRM: Xid (PCI:{pci}): 79, pid=4242, name=python3, GPU has fallen off the bus."
XID48 = ("NVRM: Xid (PCI:{pci}): 48, pid=4242, name=python3, An uncorrectable double bit error (DBE) has "
         "been detected on GPU in the framebuffer at partition 6, subpartition 0.")
XID74 = ("NVRM: Xid (PCI:{pci}): 74, pid=4242, name=python3, NVLink: fatal error detected on link "
         "4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")


@dataclass(frozen=True)
class FaultKind:
    """One kind of hardware fault the simulator makes (the lab scenarios' faults, on an idle node):
    ``slurm-gpu sim inject NODE <inject...> --log <log...>`` ({gpu}: the GPU's index, {pci}: its
    address as the kernel writes it, {port}: an InfiniBand port); ``causes``: the checks whose
    drain names this fault (a drain reason's check equal to one, or under it: kernel.xid.repeat)."""
    name: str
    inject: Tuple[str, ...]
    log: Tuple[str, ...]
    causes: Tuple[str, ...]


FAULT_KINDS: Tuple[FaultKind, ...] = (
    FaultKind("xid79-gpu-lost", ("gpu.{gpu}.state=lost",), (XID79,), ("gpu.lost", "kernel.xid")),
    FaultKind("gpu-lost", ("gpu.{gpu}.state=lost",), (), ("gpu.lost",)),
    FaultKind("xid48-dbe", ("gpu.{gpu}.ecc.volatile_uncorrected=1", "gpu.{gpu}.ecc.aggregate_uncorrected=1"),
              (XID48,), ("gpu.ecc.uncorrectable", "kernel.xid")),
    FaultKind("nvlink-down", ("gpu.{gpu}.nvlink.down=[4,5]",), (XID74,), ("nvlink.down", "kernel.xid")),
    FaultKind("ib-port-down", ('ib.{port}.state="1: DOWN"', 'ib.{port}.phys_state="3: Disabled"'), (),
              ("ib.port",)),
)
FAULTS_BY_NAME = {kind.name: kind for kind in FAULT_KINDS}
IB_PORTS = tuple(f"mlx5_{index}:1" for index in range(8))     # the lab's (render.IB_PORTS)


@dataclass(frozen=True)
class JobShape:
    """One shape of job the soak keeps ending: sbatch options, the lab payload
    (``python -m slurm_hooks.lab.payload``; {seconds} drawn by the schedule), how it ends."""
    name: str
    sbatch: Tuple[str, ...]
    payload: Tuple[str, ...]
    ends: str                         # the state it ends in when nothing breaks under it
    cancel: bool = False              # scancel'd once running, after the schedule's cancel_after
    array: str = ""                   # sbatch --array
    steps: int = 0                    # srun steps, one after the other


# Every job has a time limit: none holds a node for long (remediation waits for idle nodes).
JOB_SHAPES: Tuple[JobShape, ...] = (
    JobShape("completed", ("--gres=gpu:1", "--time=3"), ("sleep", "{seconds}"), "COMPLETED"),
    JobShape("failed", ("--gres=gpu:1", "--time=3"), ("exit", "1"), "FAILED"),
    JobShape("cancelled", ("--gres=gpu:1", "--time=3"), ("sleep", "600"), "CANCELLED", cancel=True),
    JobShape("timeout", ("--gres=gpu:1", "--time=1"), ("sleep", "600"), "TIMEOUT"),
    JobShape("array", ("--gres=gpu:1", "--time=3"), ("sleep", "{seconds}"), "COMPLETED", array="1-4"),
    JobShape("multinode", ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", "--time=3"), ("hello",),
             "COMPLETED", steps=3),
)
SHAPES_BY_NAME = {shape.name: shape for shape in JOB_SHAPES}
DAEMONS = ("slurmdbd", "slurmctld")
JOB_PREFIX = "lab-soak-"


# -- the schedule (pure) ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """What a soak of ``seconds`` on ``nodes`` does and how often (each pair: the range a gap or a
    length is drawn from, seconds)."""
    seconds: float
    nodes: Tuple[str, ...]
    job_every: Tuple[float, float] = (4, 12)
    fault_every: Tuple[float, float] = (30, 150)
    fault_for: Tuple[float, float] = (45, 90)
    settle_s: float = 180           # after a mend, the node's drain (or reboot) may still end
    faults_at_once: int = 1         # nodes in a fault's window (inject to mend + settle) at once
    max_faults: Optional[int] = None
    fault_kinds: Tuple[str, ...] = tuple(kind.name for kind in FAULT_KINDS)
    daemon_every: Tuple[float, float] = (240, 600)
    daemon_down: Tuple[float, float] = (5, 30)
    watcher_every: Tuple[float, float] = (180, 480)
    watcher_down: Tuple[float, float] = (5, 30)
    # The hooks' state disk full (statefs: every free byte taken): never while a fault is being
    # injected or mended, nor while a daemon is down (a record that can neither be kept nor
    # delivered has nowhere to go); the first within the first quarter of the soak.
    disk_every: Tuple[float, float] = (900, 1800)
    disk_for: Tuple[float, float] = (60, 60)
    gpus: int = P.GPUS_PER_NODE
    first_at: float = 10            # nothing but jobs before this (the first jobs start)
    quiet_end: float = 10           # nothing injected, stopped or killed in the last seconds


@dataclass
class Event:
    at: float                       # seconds after the soak's start
    kind: str                       # job | fault | mend | stop_daemon | start_daemon | kill_watcher | start_watcher
    #                                 | disk_full | disk_free
    node: str = ""
    detail: Dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


ORDER = {"mend": 0, "start_daemon": 1, "start_watcher": 2, "disk_free": 3, "fault": 4, "stop_daemon": 5,
         "kill_watcher": 6, "disk_full": 7, "job": 8}


def _draw(rng: random.Random, span: Tuple[float, float]) -> float:
    return round(rng.uniform(*span), 1)


def schedule(plan: Plan, seed: int) -> List[Event]:
    """Every event of a soak, in time order; the same ``seed`` gives the same events.

    Faults: one node never holds two at once, nor gets a new one within ``settle_s`` after its
    last mend (a drain is then attributed to one fault only); at most ``faults_at_once`` nodes are
    within a fault's window at once; each is mended ``fault_for`` after it was injected, before
    the end. Daemons: one down at a time, each started again before the end; the same for a
    killed watcher."""
    rng = random.Random(seed)
    end = plan.seconds - plan.quiet_end
    events: List[Event] = []

    at = _draw(rng, (1, 3))
    while at < plan.seconds - 5:
        shape = rng.choice(JOB_SHAPES)
        detail: Dict[str, Any] = {"shape": shape.name, "seconds": rng.randint(2, 20)}
        if shape.cancel:
            detail["cancel_after"] = rng.randint(3, 15)
        events.append(Event(round(at, 1), "job", detail=detail))
        at += _draw(rng, plan.job_every)

    kinds = [name for name in plan.fault_kinds if name in FAULTS_BY_NAME]
    windows: List[Tuple[float, float, str]] = []         # (inject, mend + settle, node)
    at = plan.first_at + _draw(rng, (0, plan.fault_every[0] / 2))
    count = 0
    while kinds and at < end and (plan.max_faults is None or count < plan.max_faults):
        hold = _draw(rng, plan.fault_for)
        mend = round(at + hold, 1)
        if mend <= end:
            busy = {node for start, until, node in windows if start <= at < until}
            free = [node for node in plan.nodes if node not in busy]
            if free and len(busy) < plan.faults_at_once:
                node = rng.choice(free)
                kind = FAULTS_BY_NAME[rng.choice(kinds)]
                detail = {"id": count, "fault": kind.name, "gpu": rng.randrange(plan.gpus),
                          "port": rng.choice(IB_PORTS)}
                events.append(Event(round(at, 1), "fault", node, detail))
                events.append(Event(mend, "mend", node, {"id": count, "fault": kind.name}))
                windows.append((round(at, 1), mend + plan.settle_s, node))
                count += 1
        at += _draw(rng, plan.fault_every)

    for every, down, stop, start, choices in (
            (plan.daemon_every, plan.daemon_down, "stop_daemon", "start_daemon", DAEMONS),
            (plan.watcher_every, plan.watcher_down, "kill_watcher", "start_watcher", plan.nodes)):
        at = plan.first_at + _draw(rng, (0, every[0]))
        while choices and at < end:
            back = round(at + _draw(rng, down), 1)
            if back > end:
                break
            target = rng.choice(list(choices))
            node, detail = (("", {"daemon": target}) if stop == "stop_daemon" else (target, {}))
            events.append(Event(round(at, 1), stop, node, dict(detail)))
            events.append(Event(back, start, node, dict(detail)))
            at = back + _draw(rng, every)

    events.sort(key=lambda e: (e.at, ORDER[e.kind]))
    events += disk_windows(plan, rng, events)
    events.sort(key=lambda e: (e.at, ORDER[e.kind]))
    return events


def disk_windows(plan: Plan, rng: random.Random, events: Sequence[Event]) -> List[Event]:
    """The state disk's full minutes (``disk_full``, then ``disk_free``), none overlapping a fault
    from its injection to its mend or a daemon from its stop to its start."""
    end = plan.seconds - plan.quiet_end
    busy: List[Tuple[float, float]] = []
    opened: Dict[Any, float] = {}
    for event in events:
        key = event.detail.get("id", event.detail.get("daemon"))
        if event.kind in ("fault", "stop_daemon"):
            opened[(event.kind, key)] = event.at
        elif event.kind == "mend":
            busy.append((opened.pop(("fault", key), 0.0), event.at))
        elif event.kind == "start_daemon":
            busy.append((opened.pop(("stop_daemon", key), 0.0), event.at))
    out: List[Event] = []
    at = plan.first_at + _draw(rng, (0, min(plan.disk_every[0], plan.seconds / 4)))
    while at < end:
        hold = _draw(rng, plan.disk_for)
        clash = [until for start, until in busy if start <= at + hold and at <= until]
        if clash:
            at = max(clash) + 1
            continue
        if at + hold > end:
            break
        out += [Event(round(at, 1), "disk_full"), Event(round(at + hold, 1), "disk_free")]
        at += hold + _draw(rng, plan.disk_every)
    return out


# -- drains (pure) ------------------------------------------------------------------------------------
@dataclass
class Drain:
    """One drain as sinfo showed it: from the first look that showed the reason to the first that
    did not (a look that failed, slurmctld down, ends nothing)."""
    node: str
    first_at: float
    last_at: float
    reasons: List[str] = field(default_factory=list)
    checks: List[str] = field(default_factory=list)     # our reasons' checks (parsed), in order
    ours: bool = True
    ended_at: Optional[float] = None
    fault: Optional[int] = None                         # the fault it is attributed to

    @property
    def cause(self) -> str:
        return self.checks[0] if self.checks else ("unknown" if self.ours else (self.reasons or ["?"])[0])


class DrainTracker:
    """Turns looks at the nodes (node -> {"state", "reason"}, as ``Slurm.nodes()`` gives them)
    into drains: ours (the reason starts with our prefix) and others' (drained or down with
    another reason: Slurm's own, an admin's)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.open: Dict[Tuple[str, bool], Drain] = {}
        self.drains: List[Drain] = []

    def check_of(self, reason: str) -> Optional[str]:
        from healthcheck.drain_reason import parse_reason

        parsed = parse_reason(reason, self.prefix)
        return parsed.check if parsed is not None else None

    def see(self, at: float, nodes: Dict[str, Dict[str, str]]) -> None:
        for node, info in nodes.items():
            reason = info.get("reason", "")
            state = info.get("state", "")
            ours = reason.startswith(self.prefix)
            others = not ours and bool(reason) and any(word in state for word in ("drain", "down", "fail"))
            for kind, shown in ((True, ours), (False, others)):
                key = (node, kind)
                drain = self.open.get(key)
                if not shown:
                    if drain is not None:
                        drain.ended_at = at
                        del self.open[key]
                    continue
                if drain is None:
                    drain = Drain(node, at, at, ours=kind)
                    self.open[key] = drain
                    self.drains.append(drain)
                drain.last_at = at
                if reason not in drain.reasons:
                    drain.reasons.append(reason)
                    if kind:
                        check = self.check_of(reason)
                        if check and check not in drain.checks:
                            drain.checks.append(check)


def cause_matches(check: str, causes: Iterable[str]) -> bool:
    return any(check == cause or check.startswith(cause + ".") for cause in causes)


@dataclass
class FaultRecord:
    """One injected fault, and what became of it."""
    id: int
    kind: str
    node: str
    gpu: int
    port: str
    at: float
    mended_at: Optional[float] = None
    drained: bool = False
    cause_ok: bool = False
    checks: List[str] = field(default_factory=list)
    back: str = ""          # by_itself | resumed_by_soak | inspection | out | "" (not drained)
    note: str = ""


def attribute(drains: Sequence[Drain], faults: Sequence[FaultRecord], settle_s: float) -> None:
    """Each of our drains to the fault of its node whose window (injected, to mended plus
    ``settle_s``) holds the drain's first look; one in no window stays unattributed: a false
    drain. A fault is drained with its cause when one of its drains names one of its causes."""
    for drain in drains:
        if not drain.ours:
            continue
        for fault in faults:
            until = (fault.mended_at if fault.mended_at is not None else float("inf")) + settle_s
            if fault.node == drain.node and fault.at - 1.0 <= drain.first_at <= until:
                drain.fault = fault.id
                fault.drained = True
                for check in drain.checks:
                    if check not in fault.checks:
                        fault.checks.append(check)
                if any(cause_matches(check, FAULTS_BY_NAME[fault.kind].causes) for check in drain.checks):
                    fault.cause_ok = True
                break


# -- watchers (pure) -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    at: float
    pid: int
    rss_kib: int
    fds: int


def _window_min(values: Sequence[int], head: bool) -> int:
    """The least of the first (or last) few values: a descriptor a health check holds for a
    moment, or memory between two collections, is not growth."""
    width = max(1, min(3, len(values) // 3))
    part = values[:width] if head else values[-width:]
    return min(part)


def watcher_summary(samples: Sequence[Sample], warmup_s: float = 30) -> Dict[str, Any]:
    """First and last samples, how many processes (a killed watcher's successor is another),
    and growth over the longest-lived one: the least of its last few samples less the least of
    its first few (RSS in KiB, open descriptors). A process started during the soak is measured
    from ``warmup_s`` after its first sample (a watcher opens its files as it starts)."""
    if not samples:
        return {"samples": 0, "first": None, "last": None, "processes": 0, "rss_growth_kib": None,
                "fd_growth": None, "measured_pid": None, "measured_samples": 0}
    by_pid: Dict[int, List[Sample]] = {}
    for sample in samples:
        by_pid.setdefault(sample.pid, []).append(sample)
    measured: Dict[int, List[Sample]] = {}
    for pid, own in by_pid.items():
        measured[pid] = own if pid == samples[0].pid else [s for s in own if s.at >= own[0].at + warmup_s]
    pid, longest = max(measured.items(), key=lambda item: (len(item[1]), -item[1][0].at if item[1] else 0))
    rss = [s.rss_kib for s in longest]
    fds = [s.fds for s in longest]
    return {"samples": len(samples), "first": asdict(samples[0]), "last": asdict(samples[-1]),
            "processes": len(by_pid), "measured_pid": pid, "measured_samples": len(longest),
            "rss_growth_kib": _window_min(rss, False) - _window_min(rss, True) if longest else None,
            "fd_growth": _window_min(fds, False) - _window_min(fds, True) if longest else None}


# -- the results (pure) --------------------------------------------------------------------------------
@dataclass
class Unit:
    """A job as accounting counts it: a plain job, or one task of an array (its own record)."""
    job_id: str             # as sacct shows it: 524, or 524_2
    shape: str
    submitted_at: float
    state: str = ""         # sacct's State once final
    started: bool = False   # it got nodes (a job cancelled while pending has no record to lose)
    recorded: bool = False  # our entries are in its AdminComment


@dataclass
class Observations:
    """Everything the soak saw, the input of ``results``."""
    seed: int
    minutes: float
    seconds: float = 0.0
    units: List[Unit] = field(default_factory=list)
    submit_errors: int = 0
    faults: List[FaultRecord] = field(default_factory=list)
    drains: List[Drain] = field(default_factory=list)
    samples: Dict[str, List[Sample]] = field(default_factory=dict)
    daemon_restarts: Dict[str, int] = field(default_factory=dict)
    watcher_kills: int = 0
    disk_full_windows: int = 0
    disk_full_s: float = 0.0
    disk_full_bytes: int = 0              # the most one filling took
    reboots: int = 0
    resets: int = 0
    records_wait_s: float = 0.0
    errors: List[str] = field(default_factory=list)
    error_count: int = 0


def _state_word(state: str) -> str:
    return state.split()[0] if state else "UNKNOWN"


def results(obs: Observations, settle_s: float) -> Dict[str, Any]:
    """The soak's results document (docs/reliability.md lists its keys)."""
    attribute(obs.drains, obs.faults, settle_s)
    ended = [u for u in obs.units if u.state and u.started]
    by_state: Dict[str, int] = {}
    for unit in ended:
        by_state[_state_word(unit.state)] = by_state.get(_state_word(unit.state), 0) + 1
    ours = [d for d in obs.drains if d.ours]
    by_cause: Dict[str, int] = {}
    for drain in ours:
        by_cause[drain.cause] = by_cause.get(drain.cause, 0) + 1
    other: Dict[str, int] = {}
    for drain in obs.drains:
        if not drain.ours:
            other[drain.cause] = other.get(drain.cause, 0) + 1
    by_kind: Dict[str, int] = {}
    for fault in obs.faults:
        by_kind[fault.kind] = by_kind.get(fault.kind, 0) + 1
    false = [d for d in ours if d.fault is None]
    backs = [f.back for f in obs.faults if f.drained]
    lost = [u.job_id for u in ended if not u.recorded]
    return {
        "seed": obs.seed,
        "minutes": obs.minutes,
        "seconds": round(obs.seconds, 1),
        "jobs_submitted": len(obs.units),
        "jobs_ended": len(ended),
        "jobs_never_started": sum(1 for u in obs.units if u.state and not u.started),
        "jobs_not_in_accounting": sum(1 for u in obs.units if not u.state),
        "jobs_by_state": dict(sorted(by_state.items())),
        "submit_errors": obs.submit_errors,
        "records_in_accounting": len(ended) - len(lost),
        "records_lost": len(lost),
        "records_lost_jobs": lost,
        "records_wait_s": round(obs.records_wait_s, 1),
        "faults_injected": len(obs.faults),
        "faults_by_kind": dict(sorted(by_kind.items())),
        "faults_drained": sum(1 for f in obs.faults if f.drained),
        "faults_drained_with_cause": sum(1 for f in obs.faults if f.cause_ok),
        "faults_not_drained_with_cause": [asdict(f) for f in obs.faults if not f.cause_ok],
        "faults": [asdict(f) for f in obs.faults],
        "drains": len(ours),
        "drains_by_cause": dict(sorted(by_cause.items())),
        "drains_with_fault": len(ours) - len(false),
        "false_drains": len(false),
        "false_drain_list": [{"node": d.node, "at": d.first_at, "reasons": d.reasons} for d in false],
        "other_drains": dict(sorted(other.items())),
        "reboots": obs.reboots,
        "resets": obs.resets,
        "back_in_service": backs.count("by_itself") + backs.count("resumed_by_soak"),
        "back_by_itself": backs.count("by_itself"),
        "resumed_by_soak": backs.count("resumed_by_soak"),
        "in_inspection": backs.count("inspection"),
        "still_out": backs.count("out"),
        "daemon_restarts": dict(sorted(obs.daemon_restarts.items())),
        "watcher_kills": obs.watcher_kills,
        "state_disk_full": obs.disk_full_windows,
        "state_disk_full_s": round(obs.disk_full_s, 1),
        "state_disk_full_mib": round(obs.disk_full_bytes / 2 ** 20, 1),
        "watchers": {node: watcher_summary(samples) for node, samples in sorted(obs.samples.items())},
        "error_count": obs.error_count,
        "errors": obs.errors,
    }


TABLE_ROWS = (
    ("minutes", "minutes"),
    ("seed", "seed"),
    ("jobs submitted", "jobs_submitted"),
    ("jobs ended", "jobs_ended"),
    ("records in accounting", "records_in_accounting"),
    ("records lost", "records_lost"),
    ("faults injected", "faults_injected"),
    ("faults drained with their cause", "faults_drained_with_cause"),
    ("drains by this tool", "drains"),
    ("drains with a fault injected", "drains_with_fault"),
    ("false drains", "false_drains"),
    ("reboots (remediation)", "reboots"),
    ("GPU resets (remediation)", "resets"),
    ("back in service by itself", "back_by_itself"),
    ("resumed by the soak", "resumed_by_soak"),
    ("left in inspection", "in_inspection"),
    ("watcher kills", "watcher_kills"),
    ("state disk full (times)", "state_disk_full"),
    ("state disk full (seconds)", "state_disk_full_s"),
)


def _pairs(mapping: Dict[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in mapping.items()) or "none"


def format_table(doc: Dict[str, Any]) -> List[str]:
    """The results as Markdown tables (docs/reliability.md's "Runs" takes them as printed)."""
    lines = ["| what | value |", "| --- | --- |"]
    for label, key in TABLE_ROWS:
        lines.append(f"| {label} | {doc.get(key, '')} |")
    lines.append(f"| jobs by state | {_pairs(doc.get('jobs_by_state', {}))} |")
    lines.append(f"| faults by kind | {_pairs(doc.get('faults_by_kind', {}))} |")
    lines.append(f"| drains by cause | {_pairs(doc.get('drains_by_cause', {}))} |")
    lines.append(f"| daemon restarts | {_pairs(doc.get('daemon_restarts', {}))} |")
    lines += ["", "| watcher | samples | processes | first RSS KiB | last RSS KiB | RSS growth KiB | "
                  "first fds | last fds | fd growth |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for node, summary in doc.get("watchers", {}).items():
        first, last = summary.get("first") or {}, summary.get("last") or {}
        lines.append(f"| {node} | {summary['samples']} | {summary['processes']} | {first.get('rss_kib', '-')} | "
                     f"{last.get('rss_kib', '-')} | {_none(summary['rss_growth_kib'])} | {first.get('fds', '-')} | "
                     f"{last.get('fds', '-')} | {_none(summary['fd_growth'])} |")
    return lines


def _none(value: Any) -> str:
    return "-" if value is None else str(value)


# -- /proc ---------------------------------------------------------------------------------------------
def proc_sample(pid: int, at: float) -> Optional[Sample]:
    """The process's VmRSS (KiB) and open descriptors now; None when it is gone."""
    from .cluster import rss_kib

    rss = rss_kib(pid)
    try:
        fds = len(os.listdir(f"/proc/{int(pid)}/fd"))
    except OSError:
        return None
    return Sample(round(at, 1), pid, rss, fds) if rss is not None else None


# -- the run (the lab) ----------------------------------------------------------------------------------
REMEDIATE = "\n[remediate]\nenabled = true\n"
CONFIG_MODE = 0o644           # the hooks config's mode as `lab up` writes it (render.all_files)
RECORDS_WAIT_S = 120          # the final wait for records still on their way to accounting
JOBS_WAIT_S = 150             # the final wait for the soak's jobs to end (a TIMEOUT one takes 60-95 s)
NODES_EVERY_S = 2.0
CHECK_BACK_GRACE_S = 120      # a check back that finds the node rebooting or not responding waits this much more


class Soak:
    """One soak on the lab: the loop, what each event does, the final waits."""

    def __init__(self, lab, plan: Plan, seed: int, echo: Say, sample_s: float = 10, session=None):
        self.lab = lab
        self.plan = plan
        self.seed = seed
        self.sample_s = sample_s
        if session is None:
            from .scenarios.session import LabSession

            # The scenario runner's session: preflight, `slurm-gpu sim`, a GPU's kernel address,
            # the prefix of our drain reasons, the lab's Slurm clients.
            session = LabSession(lab, echo, timeout=plan.seconds + 3600)
        self.session = session
        self.slurm = session.slurm
        self.t0 = time.monotonic()          # the schedule's zero: set again once the preflight is done
        self.t0_wall = time.time()
        self.started = False
        self.start_asked: Dict[str, float] = {}               # "daemon slurmdbd" / "watcher gpu2" -> retry after
        self.obs = Observations(seed=seed, minutes=round(plan.seconds / 60, 2))
        self.faults: Dict[int, FaultRecord] = {}
        self.checkbacks: List[Tuple[float, int]] = []        # (when, fault id)
        self.cancels: Dict[str, float] = {}                  # job id -> cancel once running, from then
        self.down_daemons: List[str] = []
        self.down_watchers: List[str] = []
        self.disk_full_at: Optional[float] = None
        self.config_text: Optional[str] = None
        self.tracker: Optional[DrainTracker] = None

    # -- small helpers ----------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    def error(self, what: str, exc: BaseException) -> None:
        self.obs.error_count += 1
        line = f"{self.now():.0f}s {what}: {exc}"
        if len(self.obs.errors) < 50:
            self.obs.errors.append(line)
        self.session.echo(f"{what}: {exc}")

    def attempt(self, what: str, action: Callable[[], Any]) -> Any:
        """Run one step; a lab failure (a Slurm client while slurmctld restarts) is counted and
        said, and the loop goes on."""
        from healthcheck.slurm import SlurmError

        try:
            return action()
        except (LabError, SlurmError, OSError) as exc:
            self.error(what, exc)
            return None

    # -- set up and put back --------------------------------------------------------------------------
    def start(self) -> None:
        from healthcheck.actions import kept, ledger as ledgers
        from healthcheck.slurm import SlurmError

        from . import statefs

        statefs.empty(self.lab.state)        # an interrupted soak's filler: the disk has room again
        self.session.preflight()
        self.started = True
        self.tracker = DrainTracker(self.session.drain_prefix)
        state_dir = self.session.config.state_dir
        with open(self.lab.hooks_config, encoding="utf-8") as handle:
            text = handle.read()
        if "[remediate]" not in text:
            # `lab up` writes this file anew: remediation on for the soak only, put back at the end.
            # Replaced whole: a hook reading it meanwhile sees the old text or the new, never half.
            self.config_text = text
            atomic_write(self.lab.hooks_config, text + REMEDIATE, mode=CONFIG_MODE)
        for node in self.plan.nodes:
            # Each node's remediation counts from zero, here and in Slurm (as the lab tests start).
            ledgers.save(state_dir, node, ledgers.Ledger())
            try:
                extra = self.slurm.backend.node(node).extra
                if kept.reboots_kept(extra):
                    self.slurm.backend.set_extra(node, kept.forgetting(extra))
            except SlurmError as exc:
                raise LabError(f"{node}: {exc}") from None
        self.t0, self.t0_wall = time.monotonic(), time.time()
        for node in self.plan.nodes:
            self.sample_watcher(node)

    def put_back(self) -> None:
        if self.started:
            self.free_disk()
        if self.config_text is not None:
            atomic_write(self.lab.hooks_config, self.config_text, mode=CONFIG_MODE)
            self.config_text = None

    # -- events -------------------------------------------------------------------------------------------
    def submit(self, event: Event) -> None:
        from .scenarios.table import Scenario

        shape = SHAPES_BY_NAME[event.detail["shape"]]
        payload = [part.format(seconds=event.detail.get("seconds", 5)) for part in shape.payload]
        scenario = Scenario(name=f"soak-{shape.name}", title=shape.name, kind="simple", nodes=(),
                            payload=tuple(payload), expect={"state": shape.ends}, srun=shape.steps > 0,
                            steps=max(1, shape.steps))
        pattern = "%A_%a" if shape.array else "%j"
        argv = [f"--job-name={JOB_PREFIX}{shape.name}", f"--output={self.lab.jobs}/soak-{shape.name}-{pattern}.out",
                f"--chdir={self.lab.jobs}", *shape.sbatch] + ([f"--array={shape.array}"] if shape.array else [])
        try:
            job_id = self.slurm.sbatch(argv, self.session.script(scenario, payload))
        except LabError as exc:
            self.obs.submit_errors += 1
            self.error(f"sbatch {shape.name}", exc)
            return
        at = self.now()
        if shape.array:
            first, _, last = shape.array.partition("-")
            for task in range(int(first), int(last or first) + 1):
                self.obs.units.append(Unit(f"{job_id}_{task}", shape.name, at))
        else:
            self.obs.units.append(Unit(job_id, shape.name, at))
        if shape.cancel:
            self.cancels[job_id] = at + event.detail.get("cancel_after", 5)

    def inject(self, event: Event) -> None:
        kind = FAULTS_BY_NAME[event.detail["fault"]]
        node, gpu, port = event.node, event.detail["gpu"], event.detail["port"]
        values = {"gpu": gpu, "port": port, "pci": self.session.kernel_pci(node, gpu)}
        args = ["sim", "inject", node, *[item.format(**values) for item in kind.inject]]
        for line in kind.log:
            args += ["--log", line.format(**values)]
        record = FaultRecord(event.detail["id"], kind.name, node, gpu, port, round(self.now(), 1))
        self.session.slurm_gpu(*args)
        self.faults[record.id] = record
        self.obs.faults.append(record)
        self.session.echo(f"fault {record.id}: {kind.name} on {node} (GPU {gpu}, port {port})")

    def mend(self, event: Event) -> None:
        record = self.faults.get(event.detail["id"])
        if record is None:
            return                      # its injection failed (said as an error)
        self.session.slurm_gpu("sim", "reset", event.node)
        record.mended_at = round(self.now(), 1)
        self.checkbacks.append((record.mended_at + self.plan.settle_s, record.id))
        self.session.echo(f"fault {record.id}: mended on {event.node}")

    def stop_daemon(self, name: str) -> None:
        from . import daemons as D

        D.stop(self.lab, [D.by_name(self.lab, name)], self.session.echo)
        self.down_daemons.append(name)
        self.obs.daemon_restarts[name] = self.obs.daemon_restarts.get(name, 0) + 1
        self.session.echo(f"stopped {name}")

    def start_daemon(self, name: str) -> None:
        from . import daemons as D

        self.start_asked[f"daemon {name}"] = self.now() + 5       # tried again until it is up
        D.start(self.lab, D.by_name(self.lab, name), self.session.echo)
        self.start_asked.pop(f"daemon {name}", None)
        if name in self.down_daemons:
            self.down_daemons.remove(name)

    def kill_watcher(self, node: str) -> None:
        from . import watchers

        pid = watchers.pid(self.lab, node)
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        self.down_watchers.append(node)
        self.obs.watcher_kills += 1
        self.session.echo(f"killed the watcher of {node} (pid {pid})")

    def start_watcher(self, node: str) -> None:
        from . import watchers

        self.start_asked[f"watcher {node}"] = self.now() + 5
        watchers.start(self.lab, node, self.session.echo)
        self.start_asked.pop(f"watcher {node}", None)
        if node in self.down_watchers:
            self.down_watchers.remove(node)

    def fill_disk(self) -> None:
        from . import statefs

        taken = statefs.fill(self.lab.state)
        self.disk_full_at = self.now()
        self.obs.disk_full_windows += 1
        self.obs.disk_full_bytes = max(self.obs.disk_full_bytes, taken)
        self.session.echo(f"the hooks' state disk is full ({taken / 2 ** 20:.0f} MiB taken)")

    def free_disk(self) -> None:
        from . import statefs

        if statefs.empty(self.lab.state):
            self.session.echo("the hooks' state disk has room again")
        if self.disk_full_at is not None:
            self.obs.disk_full_s += self.now() - self.disk_full_at
            self.disk_full_at = None

    def run_event(self, event: Event) -> None:
        steps: Dict[str, Callable[[], None]] = {
            "job": lambda: self.submit(event),
            "fault": lambda: self.inject(event),
            "mend": lambda: self.mend(event),
            "stop_daemon": lambda: self.stop_daemon(event.detail["daemon"]),
            "start_daemon": lambda: self.start_daemon(event.detail["daemon"]),
            "kill_watcher": lambda: self.kill_watcher(event.node),
            "start_watcher": lambda: self.start_watcher(event.node),
            "disk_full": self.fill_disk,
            "disk_free": self.free_disk,
        }
        self.attempt(f"{event.kind} {event.node or event.detail.get('daemon', '')}".strip(), steps[event.kind])

    # -- looks ----------------------------------------------------------------------------------------------
    def sample_watcher(self, node: str) -> None:
        from . import watchers

        pid = watchers.pid(self.lab, node)
        sample = proc_sample(pid, self.now()) if pid is not None else None
        if sample is not None:
            self.obs.samples.setdefault(node, []).append(sample)

    def look_at_nodes(self) -> None:
        nodes = self.attempt("sinfo", self.slurm.nodes)
        if nodes:
            self.tracker.see(round(self.now(), 1), nodes)

    def retry_starts(self) -> None:
        """A daemon or watcher whose start failed is started again every 5 s."""
        for what, due in list(self.start_asked.items()):
            if self.now() >= due:
                kind, _, name = what.partition(" ")
                if kind == "daemon":
                    self.attempt(f"start {name}", lambda: self.start_daemon(name))
                else:
                    self.attempt(f"start the watcher of {name}", lambda: self.start_watcher(name))

    def cancel_due(self, queue: List[Dict[str, str]]) -> None:
        running = {row["id"] for row in queue if row["state"] == "RUNNING"}
        gone = {row["id"] for row in queue}
        for job_id, due in list(self.cancels.items()):
            if job_id not in gone:
                del self.cancels[job_id]          # it ended before its cancel (a fault, its time)
            elif job_id in running and self.now() >= due:
                self.slurm.cancel(job_id)
                del self.cancels[job_id]

    def check_back(self, fault_id: int) -> bool:
        """``settle_s`` after a mend: the node back in service by itself, or in inspection as the
        rules say, or still drained by us (resumed by the soak, as an admin would, so later faults
        and jobs have it)."""
        from .commands import slurm_gpu_argv, run, slurm_env

        record = self.faults[fault_id]
        info = self.slurm.nodes().get(record.node, {})
        reason, state = info.get("reason", ""), info.get("state", "")
        # A node Slurm is rebooting, or not hearing from, may be back in a moment: looked at
        # again each second, for at most CHECK_BACK_GRACE_S more.
        waiting = self.now() < (record.mended_at or 0) + self.plan.settle_s + CHECK_BACK_GRACE_S
        if not reason.startswith(self.session.drain_prefix):
            out = any(word in state for word in ("drain", "down", "fail", "reboot")) or state.endswith("*")
            if out and waiting:
                return False
            record.back = "out" if out else "by_itself"
            record.note = f"{state} {reason}".strip() if out else ""
            return True
        if ("reboot" in state or state.endswith("*")) and waiting:
            return False                # the remediation's reboot under way: never fought over
        record.note = reason
        inspect = " inspect" in reason or self.tracker.check_of(reason) in ("kernel.xid.repeat", "gpu.remap.failed")
        record.back = "inspection" if inspect else "resumed_by_soak"
        result = run([*slurm_gpu_argv(), "resume", record.node], env=slurm_env(self.lab), timeout=120, check=False)
        if result.returncode != 0 and not inspect:
            record.back = "out"
        self.session.echo(f"fault {fault_id}: {record.node} still drained by us {self.plan.settle_s:g} s after the "
                          f"mend ({reason}); `slurm-gpu resume {record.node}` rc {result.returncode}")
        return True

    # -- the loop -------------------------------------------------------------------------------------------
    @property
    def ctld_down(self) -> bool:
        """slurmctld stopped on purpose: no Slurm client is asked until it is back."""
        return "slurmctld" in self.down_daemons

    def loop(self, events: List[Event]) -> None:
        """Until the duration ends: each event at its time (a job waits while the soak's jobs
        already fill the nodes, or while slurmctld is down; nothing else waits for it), looks at
        the nodes every NODES_EVERY_S, the watchers every ``sample_s``."""
        pending = list(events)
        backlog: List[Event] = []
        next_nodes = next_sample = 0.0
        max_in_flight = len(self.plan.nodes) + 1
        while self.now() < self.plan.seconds:
            now = self.now()
            while pending and pending[0].at <= now:
                event = pending.pop(0)
                if event.kind == "job":
                    backlog.append(event)
                else:
                    self.run_event(event)
            self.retry_starts()
            if not self.ctld_down:
                queue = self.attempt("squeue", self.slurm.queue)
                if queue is not None:               # squeue failed: no room counted, nothing cancelled
                    in_flight = sum(1 for row in queue if row["name"].startswith(JOB_PREFIX))
                    while backlog and in_flight < max_in_flight:
                        self.run_event(backlog.pop(0))
                        in_flight += 1
                    self.attempt("cancel", lambda: self.cancel_due(queue))
                del backlog[:-max_in_flight]        # the oldest waiting jobs go: the queue stays short
                self.housekeeping(now)
                if now >= next_nodes:
                    self.look_at_nodes()
                    next_nodes = now + NODES_EVERY_S
            if now >= next_sample:
                for node in self.plan.nodes:
                    self.sample_watcher(node)
                next_sample = now + self.sample_s
            time.sleep(1.0)
        for event in pending:           # the schedule ends its restarts and mends before the end
            if event.kind != "job":
                self.run_event(event)

    def housekeeping(self, now: float) -> None:
        for when, fault_id in list(self.checkbacks):
            if now >= when and self.attempt(f"check back on fault {fault_id}", lambda: self.check_back(fault_id)):
                self.checkbacks.remove((when, fault_id))   # else tried again (sinfo failed)

    def finish(self) -> None:
        """After the duration: everything started again, the soak's jobs ended, the last check
        backs, then the final wait for records."""
        for name in list(self.down_daemons):
            self.attempt(f"start {name}", lambda: self.start_daemon(name))
        for node in list(self.down_watchers):
            self.attempt(f"start the watcher of {node}", lambda: self.start_watcher(node))
        for what in list(self.start_asked):
            self.start_asked[what] = 0.0
        for record in list(self.faults.values()):
            if record.mended_at is None:
                self.attempt(f"mend {record.node}",
                             lambda: self.mend(Event(self.now(), "mend", record.node, {"id": record.id})))
        self.obs.seconds = self.now()
        self.session.echo(f"the soak's {self.plan.seconds:g} s are over: waiting for its jobs and the last "
                          "check backs")
        jobs_until = self.now() + JOBS_WAIT_S
        give_up = self.now() + JOBS_WAIT_S + self.plan.settle_s + CHECK_BACK_GRACE_S + 60
        while True:
            now = self.now()
            self.retry_starts()
            queue = self.attempt("squeue", self.slurm.queue)
            ours = [row for row in queue or [] if row["name"].startswith(JOB_PREFIX)]
            if queue is not None:
                self.attempt("cancel", lambda: self.cancel_due(queue))
            self.housekeeping(now)
            self.look_at_nodes()
            if ours and now >= jobs_until:
                self.session.echo(f"cancelling {len(ours)} soak job(s) still queued or running")
                self.attempt("scancel", lambda: self.slurm.cancel(*[row["id"] for row in ours]))
                jobs_until = float("inf")
            if queue is not None and not ours and not self.checkbacks and not self.start_asked:
                break
            if now > give_up:
                self.session.echo("gave up waiting for the last jobs and check backs")
                break
            time.sleep(1.0)
        self.wait_records()
        self.look_at_nodes()
        self.count_remedies()

    def wait_records(self) -> None:
        """Every ended job's record in accounting, or RECORDS_WAIT_S spent waiting for those
        still on their way (the outbox delivers once slurmdbd answers)."""
        from healthcheck.records import admin_comment
        from .slurmcli import SACCT_FIELDS, is_final

        began = time.monotonic()
        while True:
            todo = [u for u in self.obs.units if not u.recorded]
            for start in range(0, len(todo), 100):
                chunk = todo[start:start + 100]
                rows = self.attempt("sacct", lambda: self.slurm.backend.accounting(
                    [u.job_id for u in chunk], list(SACCT_FIELDS))) or []
                by_id = {row.get("JobID"): row for row in rows}
                for unit in chunk:
                    row = by_id.get(unit.job_id)
                    if row is None or not is_final(row.get("State", "")):
                        continue
                    unit.state = row["State"]
                    unit.started = row.get("NodeList", "") not in ("", "None assigned", "(null)")
                    unit.recorded = bool(admin_comment.parse(row.get("AdminComment")))
            waiting = [u for u in self.obs.units if not u.recorded and (u.started or not u.state)]
            if not waiting or time.monotonic() - began > RECORDS_WAIT_S:
                break
            time.sleep(3.0)
        self.obs.records_wait_s = time.monotonic() - began

    def count_remedies(self) -> None:
        from healthcheck.actions import ledger as ledgers

        state_dir = self.session.config.state_dir
        since = self.t0_wall
        for node in self.plan.nodes:
            book = ledgers.load(state_dir, node)
            for entry in book.entries.values():
                self.obs.reboots += sum(1 for at in entry.reboots if at >= since)
                self.obs.resets += sum(1 for episode in entry.episodes for at in episode.resets if at >= since)

    def restore(self) -> None:
        """The lab as the soak found it: faults mended, our drains resumed, the config back."""
        self.put_back()
        if not self.started:
            return                      # the preflight refused: nothing was changed
        # An interrupted soak may have stopped a daemon or killed a watcher a moment ago.
        for name in list(self.down_daemons):
            self.attempt(f"start {name}", lambda: self.start_daemon(name))
        for node in list(self.down_watchers):
            self.attempt(f"start the watcher of {node}", lambda: self.start_watcher(node))
        for node in self.plan.nodes:
            self.attempt(f"restore {node}", lambda: self.session.restore_node(node, quiet=True))


def run_soak(lab, plan: Plan, seed: int, echo: Say, sample_s: float = 10) -> Dict[str, Any]:
    """One soak on the running lab (one lab run at a time: the scenarios' lock); its results."""
    from .scenarios import _exclusive

    fd = _exclusive(lab, echo, 60)
    try:
        soak = Soak(lab, plan, seed, echo, sample_s)
        events = schedule(plan, seed)
        try:
            soak.start()
            soak.session.echo(f"soak: {plan.seconds:g} s, seed {seed}, {len(events)} events "
                              f"({sum(1 for e in events if e.kind == 'fault')} faults), remediation on")
            soak.loop(events)
            soak.finish()
        finally:
            soak.restore()
        soak.obs.drains = soak.tracker.drains
        return results(soak.obs, plan.settle_s)
    finally:
        os.close(fd)


def verdict(doc: Dict[str, Any]) -> List[str]:
    """What in the results breaks the soak's promises (issue 34); empty when none."""
    problems = []
    if doc.get("records_lost"):
        problems.append(f"{doc['records_lost']} job record(s) lost: {', '.join(doc['records_lost_jobs'][:10])}")
    if doc.get("false_drains"):
        problems.append(f"{doc['false_drains']} drain(s) of a node with no fault injected")
    missed = doc.get("faults_not_drained_with_cause") or []
    if missed:
        problems.append(f"{len(missed)} injected fault(s) not drained with their cause: "
                        + ", ".join(f"{f['kind']} on {f['node']}" for f in missed[:10]))
    return problems
