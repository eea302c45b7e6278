"""One scenario run's view of the lab: preflight, submitting a job, waiting for it, and
reading back what sacct, scontrol and the hooks' journal say. The drivers (``drivers.py``)
compose these into scenarios; nothing here decides what a scenario expects."""
from __future__ import annotations

import os
import shlex
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from healthcheck.slurm.backend import assigned_nodes

from .. import LabError
from .. import daemons as D
from .. import paths as P
from .. import render, rootfs
from ..paths import LabPaths
from ..releases import current
from ..commands import run, slurm_env, slurm_gpu_argv
from ..slurmcli import Slurm, is_final
from .results import JobResult
from .table import Scenario


class LabSession:
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

    @property
    def drain_prefix(self) -> str:
        """The prefix of this tool's drain reasons (``[drain] reason_prefix``)."""
        from healthcheck.config.settings import DrainSettings

        return self.config.typed(DrainSettings).reason_prefix

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
        if info.get("reason", "").startswith(self.drain_prefix):
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
        command = [rootfs.python(self.lab, current(self.lab)), "-m", "slurm_hooks.lab.payload", *args]
        line = " ".join(shlex.quote(part) for part in command)
        if scenario.srun and scenario.steps > 1:
            return "set -e\n" + "\n".join(f"/usr/bin/srun {line}" for _ in range(scenario.steps))
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

    def submit_het(self, scenario: Scenario, payload: Sequence[str]) -> str:
        """``sbatch [common C0] : C1 : ...``: a heterogeneous job, one component per option list."""
        argv: List[str] = [f"--job-name=lab-{scenario.name}", f"--output={self.lab.jobs}/{scenario.name}-%j.out",
                           f"--chdir={self.lab.jobs}"]
        for index, component in enumerate(scenario.components):
            argv += ([":"] if index else []) + list(component)
        job_id = self.slurm.sbatch(argv, self.script(scenario, payload))
        self.echo(f"{scenario.name}: submitted heterogeneous job {job_id} ({len(scenario.components)} components)")
        return job_id

    def output_path(self, scenario: Scenario, job_id: str, role: str = "job") -> str:
        suffix = "" if role == "job" else f"-{role}"
        return os.path.join(self.lab.jobs, f"{scenario.name}{suffix}-{job_id}.out")

    def wait_ready(self, scenario: Scenario, job_id: str, limit: float = 60) -> Dict[str, str]:
        """Wait for the payload's ready line; return its key=value fields (node, pid, gpus)."""
        from ..payload import READY

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
        result.raw_job_id = row.get("JobIDRaw") or job_id
        result.exit_code = row["ExitCode"]
        result.elapsed = row["Elapsed"]
        # On 26.05 `scontrol --json show job` once gave a NODE_FAIL job no nodes (read as "(null)";
        # a CI run): sacct's NodeList then.
        result.nodes = assigned_nodes((info or {}).get("NodeList")) or row["NodeList"]
        result.partition = row["Partition"]
        result.admin_comment = row["AdminComment"]
        result.history = [r["State"] for r in self.slurm.sacct(job_id, duplicates=True)]

    def await_class(self, scenario: Scenario, result: JobResult, limit: float = 30) -> None:
        """The hooks deliver AdminComment entries off the epilog's critical path (a detached
        process, about a second after the epilog): wait for the expected class to show."""
        from .results import recorded_class

        want = scenario.expect_class
        if not want or not result.job_id:
            return

        def shown() -> Optional[str]:
            rows = self.slurm.sacct(result.job_id)
            if rows:
                result.admin_comment = rows[0]["AdminComment"]
            return result.admin_comment if recorded_class(result.admin_comment) == want else None
        try:
            self.wait(f"job {result.job_id}'s class {want} in AdminComment", shown, limit)
        except LabError:
            pass                   # the report says what was recorded instead

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

    def kernel_pci(self, node: str, gpu: int) -> str:
        """The GPU's PCI address as the kernel log writes it (0000:5d:00)."""
        from healthcheck.sim.node import SimNode

        profile = SimNode(self.config.state_dir, node, self.config.sim_profile_path(node)).ensure()
        bus_id = profile["gpu"][gpu]["pci_bus_id"]
        domain, bus, rest = bus_id.split(":")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(rest.split('.')[0], 16):02x}"

    # -- the journal -------------------------------------------------------------------------------------
    def attach_hooks(self, results: List[JobResult]) -> None:
        from healthcheck.hooklib.runlog import read_runs

        by_job: Dict[str, set] = {}
        for entry in read_runs(self.config.state_dir):
            if entry.get("job_id") and entry.get("time", 0) >= self.began_wall - 5:
                by_job.setdefault(str(entry["job_id"]), set()).add(f"{entry.get('hook')}@{entry.get('node')}")
        for result in results:
            if result.job_id:
                result.hooks = sorted(by_job.get(result.raw_job_id or result.job_id, ()))
