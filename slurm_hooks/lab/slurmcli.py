"""The few Slurm client calls the lab needs (sbatch, scontrol, sacct, sinfo, scancel), run
against the lab's slurm.conf. Parsing is kept to what 22.05.8 prints (see the lab facts)."""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence

from . import LabError
from .install import binary
from .paths import LabPaths
from .runner import run, slurm_env

FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
                "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
SACCT_FIELDS = ("JobID", "JobName", "Partition", "State", "ExitCode", "DerivedExitCode", "Elapsed",
                "NodeList", "AdminComment", "Reason")

_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_/:]*=")


def parse_oneliner(text: str) -> Dict[str, str]:
    """``scontrol show ... -o`` output as a dict; values with spaces are glued back together."""
    out: Dict[str, str] = {}
    last: Optional[str] = None
    for token in text.strip().split(" "):
        if _KEY.match(token):
            key, _, value = token.partition("=")
            out[key] = value
            last = key
        elif last is not None:
            out[last] += " " + token
    return out


def is_final(state: str) -> bool:
    return any(state.startswith(final) for final in FINAL_STATES)


class Slurm:
    def __init__(self, lab: LabPaths):
        self.lab = lab
        self.env = slurm_env(lab)

    def _run(self, argv: Sequence[str], timeout: float = 20, check: bool = True):
        return run(argv, env=self.env, timeout=timeout, check=check, cwd=self.lab.jobs)

    # -- jobs ----------------------------------------------------------------------------------
    def sbatch(self, options: Sequence[str], script: str) -> str:
        result = self._run([binary("sbatch"), "--parsable", *options, "--wrap", script], timeout=30)
        job_id = result.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise LabError(f"sbatch printed no job id: {result.stdout.strip()!r}")
        return job_id

    def job(self, job_id: str) -> Dict[str, str]:
        """scontrol's view of a job ({} once slurmctld has forgotten it)."""
        result = self._run([binary("scontrol"), "show", "job", "-o", job_id], check=False)
        if result.returncode != 0 or not result.stdout.strip():
            return {}
        return parse_oneliner(result.stdout.splitlines()[0])

    def cancel(self, *job_ids: str) -> None:
        if job_ids:
            self._run([binary("scancel"), *job_ids], check=False)

    def start_now(self, job_id: str) -> None:
        """A requeued job waits ~120 s (BeginTime); start it as soon as resources allow."""
        self._run([binary("scontrol"), "update", f"jobid={job_id}", "StartTime=now"], check=False)

    def queue(self) -> List[Dict[str, str]]:
        result = self._run([binary("squeue"), "-h", "-o", "%A|%j|%T"], check=False)
        rows = []
        for line in result.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3:
                rows.append({"id": parts[0], "name": parts[1], "state": parts[2]})
        return rows

    def sacct(self, job_id: str, duplicates: bool = False) -> List[Dict[str, str]]:
        """Allocation rows (-X) of a job; with ``duplicates`` every incarnation (-D)."""
        argv = [binary("sacct"), "-X", "-n", "-P", "-j", job_id, "-o", ",".join(SACCT_FIELDS)]
        if duplicates:
            argv.insert(1, "-D")
        result = self._run(argv, timeout=30, check=False)
        rows = []
        for line in result.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == len(SACCT_FIELDS):
                rows.append(dict(zip(SACCT_FIELDS, parts)))
        return rows

    # -- nodes ---------------------------------------------------------------------------------
    def nodes(self) -> Dict[str, Dict[str, str]]:
        """node -> {"state": long state, "reason": full reason} (sinfo -R cuts it to 20)."""
        result = self._run([binary("sinfo"), "-h", "-N", "-o", "%N|%T|%E"])
        out: Dict[str, Dict[str, str]] = {}
        for line in result.stdout.splitlines():
            node, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            if node:
                out[node.strip()] = {"state": state.strip().lower(),
                                     "reason": "" if reason.strip() == "none" else reason.strip()}
        return out

    def resume(self, node: str) -> None:
        self._run([binary("scontrol"), "update", f"nodename={node}", "state=resume"])

    def ping(self) -> bool:
        result = self._run([binary("scontrol"), "ping"], check=False, timeout=10)
        return result.returncode == 0 and "is UP" in result.stdout
