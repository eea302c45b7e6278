"""What ``bench/run`` measures: a simulated node for the hooks, generated inputs in real
formats (a kernel log, ``sacct -P`` lines), and the probe programs run in fresh processes.

Nothing here times anything; ``bench/run`` does.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from kernellog_bench import XID_EVERY, generate  # noqa: F401  (re-exported: the density)

NODE = "gpu1"
JOB_ID = "4242"
GPUS = "0,1,2,3,4,5,6,7"

# A full scan of a kernel log, as the health check's first read of a log does it.
SCAN_PROBE = ("import sys\n"
              "from healthcheck.kernellog.api import scan_events\n"
              "scan_events(sys.argv[1])\n")
# The floor of the summary: read the same lines and split them, nothing else.
SPLIT_PROBE = ("import sys\n"
               "with open(sys.argv[1], encoding='utf-8', errors='replace') as handle:\n"
               "    for line in handle:\n"
               "        line.split('|')\n")


def write_kernel_log(path: str, size: int, xid_every: Optional[int] = XID_EVERY) -> int:
    """About ``size`` bytes of syslog-format kernel log; Xid-type lines one per ``xid_every``
    lines (None: none). Returns how many Xid-type lines were written."""
    return generate(path, size, xid_every=xid_every)


def run_seconds(argv: Sequence[str], env: Dict[str, str]) -> float:
    """Wall time of one whole process (output discarded into a pipe, not /dev/null)."""
    began = time.perf_counter()
    subprocess.run(list(argv), env=env, stdin=subprocess.DEVNULL, capture_output=True)
    return time.perf_counter() - began


def warm(path: str) -> None:
    """Read a file once so every timed reader finds it in the page cache."""
    with open(path, "rb", buffering=0) as handle:
        while handle.read(8 << 20):
            pass


def project_env(root: str) -> Dict[str, str]:
    """The caller's environment without anything that would point a hook elsewhere."""
    # Without PYTHONDONTWRITEBYTECODE: the timed processes use .pyc files, as on a node (with it,
    # every module changed since the last byte-compile is compiled again in every timed run).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SLURMD_")) and k not in ("CUDA_VISIBLE_DEVICES", "PYTHONDONTWRITEBYTECODE")}
    env["LC_ALL"] = "C.UTF-8"
    return env


def _next_to(python: str, command: str) -> Optional[str]:
    path = os.path.join(os.path.dirname(python), command)
    return path if os.access(path, os.X_OK) else None


def slurm_gpu_argv(python: str) -> List[str]:
    script = _next_to(python, "slurm-gpu")
    return [script] if script else [python, "-c", "import sys; from slurm_hooks.cli import main; sys.exit(main())"]


def hook_module(hook: str) -> str:
    """The module whose ``main`` is ``slurm-gpu-<hook>``, from the installed entry points."""
    from importlib.metadata import entry_points

    name = f"slurm-gpu-{hook}"
    found = [ep for ep in entry_points().get("console_scripts", [])
             if ep.name == name] if isinstance(entry_points(), dict) else \
        list(entry_points(group="console_scripts", name=name))
    if not found:
        raise SystemExit(f"bench: no console script {name} installed: run `source scripts/bootstrap.sh` first")
    return found[0].value.split(":")[0]


def has_summary(command: Sequence[str], env: Dict[str, str]) -> bool:
    """Whether this tree's ``slurm-gpu`` has ``summary --input`` (it prints its sacct fields)."""
    return summary_fields(command, env) is not None


def reads_to_catch_up(config_path: str, log_bytes: int) -> int:
    """Untimed health-check runs that read a ``log_bytes`` backlog to its end, one read budget each."""
    try:
        from healthcheck.config import Config

        budget = int(Config.load(config_path).section("xid").get("read_budget_bytes") or log_bytes)
    except Exception:  # noqa: BLE001 - an older tree without the key: one run reads it all
        budget = log_bytes
    return 1 + log_bytes // max(budget, 1)


def summary_fields(command: Sequence[str], env: Dict[str, str]) -> Optional[List[str]]:
    """The sacct fields ``slurm-gpu summary --input`` reads, or None when this tree has no summary."""
    try:
        done = subprocess.run([*command, "summary", "--sacct-format"], capture_output=True, text=True,
                              env=env, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    fields = done.stdout.strip().split(",")
    if done.returncode != 0 or len(fields) < 3 or not all(f.isidentifier() for f in fields):
        return None
    return fields


# -- a simulated node for the hooks ----------------------------------------------------------------
_SCONTROL = """#!/bin/sh
# A stand-in for scontrol in the benchmark: answers like Slurm 22.05, counts its calls, and
# timestamps each drain request (bench/run's xid_to_drain_s).
echo "scontrol $*" >> "{calls}"
[ "$1" = "--local" ] && shift
case "$1 $2" in
  "show job") echo "JobId={job} JobName=train UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=4294901759 Nice=0 Account=ml QOS=normal JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=01:00:03 TimeLimit=02:00:00 TimeMin=N/A SubmitTime=2026-11-30T10:00:00 EligibleTime=2026-11-30T10:00:00 AccrueTime=2026-11-30T10:00:00 StartTime=2026-11-30T10:00:01 EndTime=2026-11-30T11:00:04 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T10:00:01 Scheduler=Main Partition=gpu AllocNode:Sid=login1:4242 ReqNodeList=(null) ExcNodeList=(null) NodeList={node} BatchHost={node} NumNodes=1 NumCPUs=64 NumTasks=8 CPUs/Task=8 ReqB:S:C:T=0:0:*:* TRES=cpu=64,mem=512G,node=1,billing=64,gres/gpu=8 Socks/Node=* NtasksPerN:B:S:C=8:0:*:* CoreSpec=* MinCPUsNode=64 MinMemoryNode=512G MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/home/alice/train.sh WorkDir=/home/alice StdErr=/home/alice/slurm-{job}.out StdIn=/dev/null StdOut=/home/alice/slurm-{job}.out Power= TresPerNode=gres:gpu:8" ;;
  "update nodename="*) PATH=/usr/bin:/bin date +%s.%N >> "{drains}" ;;
  "show node") echo "NodeName={node} Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.52 AvailableFeatures=h100 ActiveFeatures=h100 Gres=gpu:h100:8 NodeAddr={node} NodeHostName={node} Version=22.05.8 OS=Linux 6.1.0-27-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.115-1 RealMemory=2000000 AllocMem=0 FreeMem=1900000 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu BootTime=2026-11-01T08:00:00 SlurmdStartTime=2026-11-01T08:01:00 LastBusyTime=2026-11-30T11:00:04 CfgTRES=cpu=64,mem=2000000M,billing=64,gres/gpu=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s" ;;
esac
exit 0
"""
# squeue -h -t all -j JOB -O JobID:|,State:|,... (healthcheck.slurm.cli_backend.squeue_job_argv):
# the job's state fields as 22.05 prints them, each followed by the "|" suffix.
_SQUEUE = """#!/bin/sh
# A stand-in for squeue in the benchmark: answers like Slurm 22.05, counts its calls.
echo "squeue $*" >> "{calls}"
echo "{job}|COMPLETING|1|0|0|2026-11-30T10:00:01|2026-11-30T11:00:04|N/A|{node}|None|"
exit 0
"""
_QUIET = """#!/bin/sh
# A stand-in for {name} in the benchmark: succeeds silently, counts its calls.
echo "{name} $*" >> "{calls}"
exit 0
"""


class HookNode:
    """A healthy simulated 8x H100 node (8 IB ports) with its own config and state dir, and
    stand-ins for Slurm's commands (the hooks run with no Slurm here)."""

    def __init__(self, work: str, python: str, root: str):
        self.work, self.python, self.root = work, python, root
        os.makedirs(work, exist_ok=True)
        self.state_dir = os.path.join(work, "state")
        self.bin_dir = os.path.join(work, "slurm-bin")
        self.calls = os.path.join(work, "slurm-calls.log")
        os.makedirs(self.bin_dir, exist_ok=True)
        self.drains = os.path.join(work, "slurm-drains.log")      # when each drain request came
        self._write(os.path.join(self.bin_dir, "scontrol"), _SCONTROL.format(calls=self.calls, job=JOB_ID, node=NODE,
                                                                             drains=self.drains))
        self._write(os.path.join(self.bin_dir, "squeue"), _SQUEUE.format(calls=self.calls, job=JOB_ID, node=NODE))
        for name in ("sacct", "sacctmgr", "sinfo"):
            self._write(os.path.join(self.bin_dir, name), _QUIET.format(calls=self.calls, name=name))
        self.config = os.path.join(work, "config.toml")
        with open(self.config, "w", encoding="utf-8") as handle:
            handle.write(
                f'[paths]\nstate_dir = "{self.state_dir}"\n'
                '[gpu]\nbackend = "sim"\n'
                '[sim]\nprofile = "h100-healthy"\n'
                '[[nodes]]\nmatch = "gpu[1-3]"\ngpus = 8\ngpu_model = "H100"\nnvlinks_per_gpu = 18\n'
                f'[slurm]\nbin_dir = "{self.bin_dir}"\n'
                f'[health]\ntextfile_dir = "{os.path.join(work, "metrics")}"\n')

    @staticmethod
    def _write(path: str, text: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(path, 0o755)

    def hook_argv(self, hook: str) -> List[str]:
        """The hook as slurm.conf runs it: the installed console script."""
        script = _next_to(self.python, f"slurm-gpu-{hook}")
        if script:
            return [script]
        return [self.python, "-c", f"import sys; from {hook_module(hook)} import main; sys.exit(main())"]

    # Slurm passes no PATH, HOME or USER (docs: slurm-lab-facts section 4).
    def bare_env(self) -> Dict[str, str]:
        return {"SLURM_GPU_HOOKS_CONFIG": self.config}

    def prolog_env(self, context: str = "prolog_slurmd") -> Dict[str, str]:
        env = self.bare_env()
        env.update({"SLURMD_NODENAME": NODE, "SLURM_CLUSTER_NAME": "bench", "SLURM_JOBID": JOB_ID,
                    "SLURM_JOB_ID": JOB_ID, "SLURM_JOB_ACCOUNT": "ml", "SLURM_JOB_CPUS_PER_NODE": "64",
                    "SLURM_JOB_GID": "1000", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_PARTITION": "gpu",
                    "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "alice",
                    "SLURM_JOB_WORK_DIR": "/home/alice", "SLURM_NODELIST": NODE, "SLURM_UID": "1000",
                    "SLURM_SCRIPT_CONTEXT": context, "SLURM_JOB_GPUS": GPUS, "CUDA_VISIBLE_DEVICES": GPUS,
                    "GPU_DEVICE_ORDINAL": GPUS, "ROCR_VISIBLE_DEVICES": GPUS, "ZE_AFFINITY_MASK": GPUS})
        return env

    def epilog_env(self) -> Dict[str, str]:
        env = self.prolog_env("epilog_slurmd")
        env.update({"SLURM_JOB_DERIVED_EC": "0", "SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_EXIT_CODE2": "0:0"})
        return env

    def healthcheck_env(self) -> Dict[str, str]:
        env = self.bare_env()
        env["SLURMD_NODENAME"] = NODE
        return env

    def sim_kernel_log(self) -> str:
        from healthcheck.config import Config
        from healthcheck.sim.node import SimNode

        config = Config.load(self.config)
        sim = SimNode(config.state_dir, NODE, config.sim_profile_path(NODE))
        sim.ensure()
        return sim.kernel_log_path

    def fill_kernel_log(self, size: int) -> None:
        """Append ``size`` bytes of Xid-free kernel log to the node's log (the hooks' first,
        untimed run reads it and commits its cursor; the timed runs find it already read)."""
        path = self.sim_kernel_log()
        bulk = path + ".bulk"
        write_kernel_log(bulk, size, xid_every=None)
        with open(path, "ab") as out, open(bulk, "rb") as src:
            shutil.copyfileobj(src, out, 8 << 20)
        os.unlink(bulk)

    def kernel_log_size(self) -> int:
        try:
            return os.path.getsize(self.sim_kernel_log())
        except OSError:
            return 0

    def gpu_pci(self, index: int) -> str:
        """GPU ``index``'s address as the driver writes it in an Xid line (``0000:3b:00``)."""
        from healthcheck.config import Config
        from healthcheck.sim.node import SimNode

        config = Config.load(self.config)
        bus = SimNode(config.state_dir, NODE, config.sim_profile_path(NODE)).ensure()["gpu"][index]["pci_bus_id"]
        domain, bus_no, rest = bus.split(":")
        return f"{int(domain, 16):04x}:{int(bus_no, 16):02x}:{int(rest.split('.')[0], 16):02x}"

    def append_kernel_line(self, line: str) -> None:
        """One line appended to the node's kernel log, as the kernel's logger appends it."""
        fd = os.open(self.sim_kernel_log(), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line.encode() + b"\n")
        finally:
            os.close(fd)

    def drain_times(self) -> List[float]:
        """When each drain request reached the scontrol stand-in (epoch seconds)."""
        try:
            with open(self.drains, encoding="ascii") as handle:
                return [float(line) for line in handle if line.strip()]
        except (OSError, ValueError):
            return []

    def slurm_calls(self, hook: str) -> int:
        """How many Slurm commands one run of ``hook`` makes (through the stand-ins)."""
        env = {"epilog": self.epilog_env, "prolog": self.prolog_env, "healthcheck": self.healthcheck_env}[hook]()
        if os.path.exists(self.calls):
            os.unlink(self.calls)
        subprocess.run(self.hook_argv(hook), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120)
        if not os.path.exists(self.calls):
            return 0
        with open(self.calls, encoding="utf-8") as handle:
            return sum(1 for _ in handle)


# -- sacct lines for the summary ------------------------------------------------------------------
def write_sacct(path: str, jobs: int, seed: int = 1) -> int:
    """``jobs`` jobs of ``sacct -a -D -X -P`` text in ``slurm-gpu summary --sacct-format``'s field
    order: ``bench/gen_sacct.py``, the project's one generator of accounting (its docstring says
    what the file holds). Returns the rows written."""
    from gen_sacct import write_jobs

    return write_jobs(path, jobs, seed=seed)


def summary_workers(path: str) -> int:
    """How many processes ``slurm-gpu summary --input`` reads ``path`` with (1 when it cannot say)."""
    try:
        from slurm_hooks.summary.parallel import workers_for
    except ImportError:
        return 1
    return workers_for(path, None)


if __name__ == "__main__":  # pragma: no cover - a helper for trying the generators by hand
    print(__doc__, file=sys.stderr)
