"""``slurm-gpu lab scenarios``: submit jobs that end every way a job can end, break the
simulated hardware under some of them, wait, and report what sacct says.

The table is data (``slurm_hooks/data/lab-scenarios.toml``). Scenarios run concurrently
where their nodes allow; a small scheduler starts them in table order, never letting a
scenario jump ahead of an earlier one that wants the same node.
"""
from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from healthcheck import tomlio
from healthcheck.schema import Field, validate

from . import LabError
from . import daemons as D
from . import paths as P
from . import render
from .paths import LabPaths
from .runner import run, slurm_env, slurm_gpu_argv
from .slurmcli import Slurm, is_final

KINDS = ("simple", "cancel", "preempt", "node_fail", "fault", "oom")

_STR_LIST = Field(list, item=Field(str))
SCENARIO_SCHEMA: Dict[str, Any] = {
    "name": Field(str, required=True),
    "title": Field(str, required=True),
    "kind": Field(str, required=True, choices=KINDS),
    "nodes": Field(list, required=True, item=Field(str, choices=P.NODES)),
    "exclusive": Field(bool),
    "sbatch": _STR_LIST,
    "payload": Field(list, required=True, item=Field(str)),
    "srun": Field(bool),
    "inject": _STR_LIST,
    "log": _STR_LIST,
    "expect": {
        "state": Field(str, required=True),
        "exit_code": Field(str),
        "requeued": Field(bool),
        "preemptor": Field(str),
        "cause": Field(str),
        "drain": Field(bool),
    },
}
TABLE_SCHEMA = {"scenario": Field(list, required=True, item=SCENARIO_SCHEMA)}


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    kind: str
    nodes: Tuple[str, ...]
    payload: Tuple[str, ...]
    expect: Dict[str, Any]
    exclusive: bool = False
    sbatch: Tuple[str, ...] = ()
    srun: bool = False
    inject: Tuple[str, ...] = ()
    log: Tuple[str, ...] = ()

    @property
    def expect_state(self) -> str:
        return self.expect["state"]

    @property
    def uses_sim(self) -> bool:
        return self.kind == "fault"


def load_table(path: Optional[str] = None) -> List[Scenario]:
    if path is None:
        text = resources.files("slurm_hooks").joinpath("data/lab-scenarios.toml").read_text("utf-8")
        source = "lab-scenarios.toml"
    else:
        with open(path, encoding="utf-8") as handle:
            text, source = handle.read(), path
    doc = tomlio.loads(text)
    problems = validate(doc, TABLE_SCHEMA)
    if problems:
        raise LabError(f"{source}: {problems[0][0]}: {problems[0][1]}; {problems[0][2]}")
    table, seen = [], set()
    for raw in doc["scenario"]:
        if raw["name"] in seen:
            raise LabError(f"{source}: scenario {raw['name']!r} appears twice")
        seen.add(raw["name"])
        if raw["kind"] == "fault" and not raw.get("inject"):
            raise LabError(f"{source}: fault scenario {raw['name']!r} injects nothing")
        table.append(Scenario(
            name=raw["name"], title=raw["title"], kind=raw["kind"], nodes=tuple(raw["nodes"]),
            payload=tuple(raw["payload"]), expect=dict(raw["expect"]),
            exclusive=raw.get("exclusive", False), sbatch=tuple(raw.get("sbatch", ())),
            srun=raw.get("srun", False), inject=tuple(raw.get("inject", ())), log=tuple(raw.get("log", ()))))
    return table


# -- results -----------------------------------------------------------------------------------
@dataclass
class JobResult:
    scenario: str
    role: str                        # "job", or "preemptor" for the high-tier job
    expected: str
    job_id: Optional[str] = None
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

    def as_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out


def state_matches(actual: str, expected: str) -> bool:
    """sacct says "CANCELLED by 0" (it adds the uid): compare by prefix."""
    return actual == expected or actual.startswith(expected + " ")


class Run:
    """One run of the scenario table against the lab."""

    POLL = 0.5

    def __init__(self, lab: LabPaths, echo: Callable[[str], None], timeout: float):
        self.lab = lab
        self.slurm = Slurm(lab)
        self.echo_raw = echo
        self.began = time.monotonic()
        self.began_wall = time.time()
        self.deadline = self.began + timeout
        self._echo_lock = threading.Lock()
        self.config = None
        self.cgroup = False

    # -- small helpers ---------------------------------------------------------------------------
    def echo(self, message: str) -> None:
        with self._echo_lock:
            self.echo_raw(f"[{time.monotonic() - self.began:6.1f}s] {message}")

    def remaining(self, limit: float) -> float:
        return max(1.0, min(limit, self.deadline - time.monotonic()))

    def wait(self, what: str, probe: Callable[[], Any], limit: float) -> Any:
        end = time.monotonic() + self.remaining(limit)
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > end:
                raise LabError(f"{what}: not within {limit:g} s")
            time.sleep(self.POLL)

    def slurm_gpu(self, *args: str) -> str:
        return run([*slurm_gpu_argv(), *args], env=slurm_env(self.lab), timeout=60).stdout

    # -- preflight ---------------------------------------------------------------------------------
    def preflight(self) -> None:
        from healthcheck.config import Config

        if not os.path.isfile(self.lab.slurm_conf) or not self.slurm.ping():
            raise LabError(f"the lab at {self.lab.root} is not up (slurmctld does not answer): "
                           "run `slurm-gpu lab up` first")
        self.config = Config.load(self.lab.hooks_config)
        with open(self.lab.slurm_conf, encoding="utf-8") as handle:
            self.cgroup = "TaskPlugin=task/cgroup" in handle.read()
        for daemon in D.daemons(self.lab):  # e.g. a slurmd left down by an interrupted run
            if daemon.name.startswith("slurmd ") and daemon.pid(self.lab) is None:
                D.start(self.lab, daemon, self.echo)
        stale = [row["id"] for row in self.slurm.queue() if row["name"].startswith("lab-")]
        if stale:
            self.echo(f"cancelling {len(stale)} job(s) left by an earlier run")
            self.slurm.cancel(*stale)
            self.wait("earlier jobs gone", lambda: not any(
                row["id"] in stale and row["state"] in ("RUNNING", "COMPLETING", "PENDING")
                for row in self.slurm.queue()), 30)
        for node in P.NODES:
            self.restore_node(node, quiet=True)
        def usable() -> bool:
            nodes = self.slurm.nodes()
            return all(D.node_responding(nodes.get(n, {}).get("state", "")) for n in P.NODES)
        self.wait("nodes gpu1..gpu3 responding", usable, 40)
        for node, info in self.slurm.nodes().items():
            if "drain" in info["state"] or info["state"].startswith("down"):
                raise LabError(f"node {node} is {info['state']} ({info['reason'] or 'no reason'}), not by "
                               f"this tool: resume it first (scontrol update nodename={node} state=resume)")

    def restore_node(self, node: str, quiet: bool = False) -> Optional[str]:
        """Mend the simulated node, and resume it if this tool drained it. The reason, if resumed."""
        self.slurm_gpu("sim", "reset", node)
        info = self.slurm.nodes().get(node, {})
        prefix = self.config.section("drain")["reason_prefix"]
        if info.get("reason", "").startswith(prefix):
            self.slurm.resume(node)
            if not quiet:
                self.echo(f"{node}: resumed (was drained: {info['reason']})")
            return info["reason"]
        return None

    # -- jobs ----------------------------------------------------------------------------------------
    def script(self, scenario: Scenario, payload: Sequence[str]) -> str:
        args = list(payload)
        if args and args[0] == "train":
            args += ["--config", self.lab.hooks_config]
        command = [sys.executable, "-m", "slurm_hooks.lab.payload", *args]
        line = " ".join(shlex.quote(part) for part in command)
        if scenario.srun:
            return f"exec /usr/bin/srun {line}"
        return f"exec {line}"

    def submit(self, scenario: Scenario, options: Sequence[str], payload: Sequence[str], role: str = "job") -> str:
        suffix = "" if role == "job" else f"-{role}"
        name = f"lab-{scenario.name}{suffix}"
        argv = [f"--job-name={name}", f"--output={self.lab.jobs}/{scenario.name}{suffix}-%j.out",
                f"--chdir={self.lab.jobs}", f"--nodelist={','.join(scenario.nodes)}", *options]
        job_id = self.slurm.sbatch(argv, self.script(scenario, payload))
        self.echo(f"{scenario.name}: submitted job {job_id}{'' if role == 'job' else ' (' + role + ')'}")
        return job_id

    def output_path(self, scenario: Scenario, job_id: str, role: str = "job") -> str:
        suffix = "" if role == "job" else f"-{role}"
        return os.path.join(self.lab.jobs, f"{scenario.name}{suffix}-{job_id}.out")

    def wait_ready(self, scenario: Scenario, job_id: str, limit: float = 60) -> Dict[str, str]:
        """Wait for the payload's ready line; return its key=value fields (node, pid, gpus)."""
        from .payload import READY

        path = self.output_path(scenario, job_id)

        def ready() -> Optional[Dict[str, str]]:
            state = self.slurm.job(job_id).get("JobState", "")
            if is_final(state):
                raise LabError(f"job {job_id} ended ({state}) before it was ready")
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    for line in handle:
                        if line.startswith(READY):
                            return dict(part.split("=", 1) for part in line.split()[2:] if "=" in part)
            except FileNotFoundError:
                return None
            return None
        return self.wait(f"job {job_id} ready", ready, limit)

    def wait_final(self, job_id: str, limit: float, start_requeued: bool = False) -> Dict[str, str]:
        nudged = [False]

        def final() -> Optional[Dict[str, str]]:
            info = self.slurm.job(job_id)
            state = info.get("JobState", "")
            if start_requeued and not nudged[0] and state == "PENDING" and info.get("Restarts", "0") != "0":
                self.slurm.start_now(job_id)
                nudged[0] = True
            return info if is_final(state) else None
        return self.wait(f"job {job_id} to end", final, limit)

    def collect(self, result: JobResult, job_id: str, info: Optional[Dict[str, str]] = None) -> None:
        """What sacct says, once the database has the final state. ``info`` is scontrol's
        final view; its NodeList is taken over sacct's, which lags for multi-node jobs."""
        result.job_id = job_id

        previous: List[Optional[Dict[str, str]]] = [None]

        def recorded() -> Optional[Dict[str, str]]:
            # The database fills a finished job in over several messages (a 3-node job
            # first showed NodeList=gpu1): take a final row once it reads the same twice.
            rows = self.slurm.sacct(job_id)
            row = rows[0] if rows and is_final(rows[0]["State"]) else None
            stable = row is not None and row == previous[0]
            previous[0] = row
            return row if stable else None
        row = self.wait(f"sacct to record job {job_id}", recorded, 30)
        result.state = row["State"]
        result.exit_code = row["ExitCode"]
        result.elapsed = row["Elapsed"]
        result.nodes = (info or {}).get("NodeList") or row["NodeList"]
        result.partition = row["Partition"]
        result.admin_comment = row["AdminComment"]
        result.history = [r["State"] for r in self.slurm.sacct(job_id, duplicates=True)]

    def observe_drains(self, scenario: Scenario, result: JobResult) -> None:
        """Which of the job's nodes ended drained; waits a health-check interval for an
        expected drain (later issues make the hooks drain)."""
        def drained() -> Dict[str, str]:
            nodes = self.slurm.nodes()
            return {n: nodes[n]["reason"] for n in scenario.nodes
                    if n in nodes and "drain" in nodes[n]["state"]}
        if scenario.expect.get("drain"):
            try:
                self.wait("drain", drained, render.HEALTH_CHECK_INTERVAL + 10)
            except LabError:
                pass
        result.drained = drained()

    def check(self, scenario: Scenario, result: JobResult, expected: str) -> None:
        if not state_matches(result.state, expected):
            result.problems.append(f"sacct State is {result.state!r}, expected {expected!r}")
        if result.role != "job":
            return
        want_exit = scenario.expect.get("exit_code")
        if want_exit and result.exit_code != want_exit:
            result.problems.append(f"ExitCode is {result.exit_code!r}, expected {want_exit!r}")
        if scenario.expect.get("requeued") and not any(
                s.startswith(("PREEMPTED", "REQUEUED")) for s in result.history[:-1]):
            result.problems.append(f"no preempted incarnation in sacct -D ({result.history})")
        cause = scenario.expect.get("cause")
        if cause and cause not in result.admin_comment:
            result.problems.append(f"AdminComment {result.admin_comment!r} does not name {cause!r}")
        if "drain" in scenario.expect:
            prefix = self.config.section("drain")["reason_prefix"]
            ours = {n: r for n, r in result.drained.items() if r.startswith(prefix)}
            if scenario.expect["drain"] and not ours:
                result.problems.append("expected a drain by this tool; no node drained")
            if not scenario.expect["drain"] and ours:
                result.problems.append(f"drained unexpectedly: {ours}")

    # -- drivers ---------------------------------------------------------------------------------------
    def drive(self, scenario: Scenario) -> List[JobResult]:
        main = JobResult(scenario.name, "job", scenario.expect_state)
        results = [main]
        began = time.monotonic()
        jobs: List[str] = []
        try:
            getattr(self, f"_drive_{scenario.kind}")(scenario, main, results, jobs)
        except LabError as exc:
            main.problems.append(str(exc))
            self.slurm.cancel(*jobs)
        finally:
            if scenario.uses_sim:
                try:
                    self.restore_node(scenario.nodes[0])
                except LabError as exc:
                    main.problems.append(f"restoring {scenario.nodes[0]}: {exc}")
        main.seconds = round(time.monotonic() - began, 1)
        for result in results:
            if result.produced and result.job_id and not result.problems:
                self.check(scenario, result, result.expected)
        return results

    def _drive_simple(self, scenario, main, results, jobs) -> None:
        job_id = self.submit(scenario, scenario.sbatch, scenario.payload)
        jobs.append(job_id)
        info = self.wait_final(job_id, 200)
        self.collect(main, job_id, info)
        self.observe_drains(scenario, main)

    def _drive_oom(self, scenario, main, results, jobs) -> None:
        if not self.cgroup:
            main.produced = False
            why = render.cgroup_v1_memory() or "the lab was brought up without memory cgroups"
            main.note = f"not produced: OUT_OF_MEMORY needs memory cgroups, and {why}"
            return
        self._drive_simple(scenario, main, results, jobs)

    def _drive_cancel(self, scenario, main, results, jobs) -> None:
        job_id = self.submit(scenario, scenario.sbatch, scenario.payload)
        jobs.append(job_id)
        self.wait_ready(scenario, job_id)
        self.slurm.cancel(job_id)
        info = self.wait_final(job_id, 60)
        self.collect(main, job_id, info)

    def _drive_preempt(self, scenario, main, results, jobs) -> None:
        job_id = self.submit(scenario, scenario.sbatch, scenario.payload)
        jobs.append(job_id)
        self.wait_ready(scenario, job_id)
        high = JobResult(scenario.name, "preemptor", scenario.expect.get("preemptor", "COMPLETED"))
        results.append(high)
        high_id = self.submit(scenario, ["--partition=high", "--exclusive", "--gres=gpu:8"],
                              ["sleep", "3"], role="preemptor")
        jobs.append(high_id)
        info = self.wait_final(job_id, 120, start_requeued=bool(scenario.expect.get("requeued")))
        high_info = self.wait_final(high_id, 60)
        self.collect(main, job_id, info)
        self.collect(high, high_id, high_info)

    def _drive_node_fail(self, scenario, main, results, jobs) -> None:
        node = scenario.nodes[0]
        daemon = D.by_name(self.lab, f"slurmd {node}")
        job_id = self.submit(scenario, scenario.sbatch, scenario.payload)
        jobs.append(job_id)
        self.wait_ready(scenario, job_id)
        pid = daemon.pid(self.lab)
        if pid is None:
            raise LabError(f"slurmd {node} is not running")
        os.kill(pid, signal.SIGKILL)
        self.echo(f"{scenario.name}: killed slurmd {node} (pid {pid}) with SIGKILL; "
                  "slurmctld notices after SlurmdTimeout (~27 s)")
        info: Dict[str, str] = {}
        try:
            info = self.wait_final(job_id, 90)
        finally:
            D.start(self.lab, daemon, self.echo)
            self.wait(f"{node} back", lambda: D.node_responding(
                self.slurm.nodes().get(node, {}).get("state", "")), 40)
        self.collect(main, job_id, info)

    def _drive_fault(self, scenario, main, results, jobs) -> None:
        node = scenario.nodes[0]
        job_id = self.submit(scenario, scenario.sbatch, scenario.payload)
        jobs.append(job_id)
        ready = self.wait_ready(scenario, job_id)
        gpu = int(ready.get("gpus", "0").split(",")[0])
        values = {"gpu": gpu, "pid": ready.get("pid", "0"), "pci": self.kernel_pci(node, gpu)}
        assignments = [item.format(**values) for item in scenario.inject]
        logs = [item.format(**values) for item in scenario.log]
        args = ["sim", "inject", node, *assignments]
        for line in logs:
            args += ["--log", line]
        self.slurm_gpu(*args)
        main.injected = ["slurm-gpu " + " ".join(shlex.quote(a) for a in args)]
        self.echo(f"{scenario.name}: injected on {node} GPU {gpu}: {' '.join(assignments)}")
        info = self.wait_final(job_id, 60)
        self.collect(main, job_id, info)
        self.observe_drains(scenario, main)

    def kernel_pci(self, node: str, gpu: int) -> str:
        """The GPU's PCI address as the kernel log writes it (0000:5d:00)."""
        from healthcheck.sim.node import SimNode

        profile = SimNode(self.config.state_dir, node, self.config.sim_profile_path(node)).ensure()
        bus_id = profile["gpu"][gpu]["pci_bus_id"]
        domain, bus, rest = bus_id.split(":")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(rest.split('.')[0], 16):02x}"

    # -- the journal -------------------------------------------------------------------------------------
    def attach_hooks(self, results: List[JobResult]) -> None:
        from healthcheck.hookruns import read_runs

        by_job: Dict[str, set] = {}
        for entry in read_runs(self.config.state_dir):
            if entry.get("job_id") and entry.get("time", 0) >= self.began_wall - 5:
                by_job.setdefault(str(entry["job_id"]), set()).add(f"{entry.get('hook')}@{entry.get('node')}")
        for result in results:
            if result.job_id:
                result.hooks = sorted(by_job.get(result.job_id, ()))

    # -- the scheduler -------------------------------------------------------------------------------------
    def execute(self, table: Sequence[Scenario]) -> List[JobResult]:
        self.preflight()
        results: Dict[str, List[JobResult]] = {}
        pending = list(table)
        running: Dict[str, threading.Thread] = {}
        held: Dict[str, Dict[str, Any]] = {n: {"excl": False, "shared": 0, "sim": False} for n in P.NODES}

        def conflicts(a: Scenario, b: Scenario) -> bool:
            shared = set(a.nodes) & set(b.nodes)
            return bool(shared) and (a.exclusive or b.exclusive or (a.uses_sim and b.uses_sim))

        def free(s: Scenario) -> bool:
            for node in s.nodes:
                h = held[node]
                if h["excl"] or (s.exclusive and (h["shared"] or h["sim"])) or (s.uses_sim and h["sim"]):
                    return False
            return True

        def take(s: Scenario, sign: int) -> None:
            for node in s.nodes:
                if s.exclusive:
                    held[node]["excl"] = sign > 0
                else:
                    held[node]["shared"] += sign
                if s.uses_sim:
                    held[node]["sim"] = sign > 0

        def worker(s: Scenario) -> None:
            try:
                results[s.name] = self.drive(s)
            except Exception as exc:  # a bug must not hang the run: report it on the row
                failed = JobResult(s.name, "job", s.expect_state)
                failed.problems.append(f"{type(exc).__name__}: {exc}")
                results[s.name] = [failed]

        by_name = {s.name: s for s in table}
        while pending or running:
            for scenario in list(pending):
                earlier = pending[:pending.index(scenario)]
                if free(scenario) and not any(conflicts(scenario, e) for e in earlier):
                    take(scenario, +1)
                    pending.remove(scenario)
                    self.echo(f"{scenario.name}: start ({scenario.title})")
                    thread = threading.Thread(target=worker, args=(scenario,), daemon=True,
                                              name=f"scenario-{scenario.name}")
                    running[scenario.name] = thread
                    thread.start()
            for name, thread in list(running.items()):
                if not thread.is_alive():
                    del running[name]
                    take(by_name[name], -1)
                    for result in results.get(name, []):
                        self.echo(f"{name}: job {result.job_id or '-'} {result.role}: "
                                  f"{result.state or '-'}{' ' + result.note if result.note else ''}"
                                  f" ({'as expected' if result.ok else '; '.join(result.problems)})")
            if time.monotonic() > self.deadline + 30:
                for scenario in pending:
                    late = JobResult(scenario.name, "job", scenario.expect_state)
                    late.problems.append("not started: the run's --timeout passed")
                    results[scenario.name] = [late]
                pending = []
                if running:
                    self.echo(f"still running after the timeout: {', '.join(running)}")
                    for name in running:
                        late = JobResult(name, "job", by_name[name].expect_state)
                        late.problems.append("did not finish before the run's --timeout")
                        results.setdefault(name, [late])
                    break
            time.sleep(0.2)
        ordered = [r for s in table for r in results.get(s.name, [])]
        time.sleep(1.0)  # the last EpilogSlurmctld may still be writing its journal line
        self.attach_hooks(ordered)
        return ordered


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
    fd = _exclusive(lab, echo, timeout)
    try:
        runner = Run(lab, echo, timeout)
        results = runner.execute(table)
    finally:
        os.close(fd)
    runner.echo(f"{len(table)} scenario(s), {sum(1 for r in results if r.job_id)} job(s) in "
                f"{time.monotonic() - runner.began:.0f} s")
    return results


def format_results(results: Sequence[JobResult]) -> List[str]:
    header = f"{'JOBID':>6}  {'SCENARIO':<26} {'EXPECTED':<14} {'SACCT STATE':<16} {'EXIT':<6} {'ELAPSED':<9} {'NODES':<10} RESULT"
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
