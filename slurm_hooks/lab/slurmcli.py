"""The few Slurm client calls the lab needs (sbatch, scontrol, sacct, sinfo, scancel), run
against the lab's slurm.conf. Parsing is kept to what 22.05.8 prints (see the lab facts)."""
from __future__ import annotations

from typing import Dict, List, Sequence

from healthcheck.slurm import CliBackend, SlurmError
from healthcheck.slurm.cli_backend import parse_scontrol_record as parse_oneliner  # noqa: F401 (lab API)
from . import LabError
from .install import command
from .paths import LabPaths
from .commands import run, slurm_env

FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
                "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
SACCT_FIELDS = ("JobID", "JobIDRaw", "JobName", "Partition", "State", "ExitCode", "DerivedExitCode", "Elapsed",
                "NodeList", "AdminComment", "Reason")


def is_final(state: str) -> bool:
    return any(state.startswith(final) for final in FINAL_STATES)


class Slurm:
    def __init__(self, lab: LabPaths):
        self.lab = lab
        self.env = slurm_env(lab)
        # The product's own backend: the lab exercises it against a real Slurm.
        self.backend = CliBackend(bin_dir=lab.bin, slurm_conf=lab.slurm_conf, env=self.env, timeout_s=30)

    def _run(self, argv: Sequence[str], timeout: float = 20, check: bool = True):
        return run(argv, env=self.env, timeout=timeout, check=check, cwd=self.lab.jobs)

    # -- jobs ----------------------------------------------------------------------------------
    def sbatch(self, options: Sequence[str], script: str) -> str:
        result = self._run([command(self.lab, "sbatch"), "--parsable", *options, "--wrap", script], timeout=30)
        job_id = result.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise LabError(f"sbatch printed no job id: {result.stdout.strip()!r}")
        return job_id

    def job(self, job_id: str) -> Dict[str, str]:
        """scontrol's view of a job ({} once slurmctld has forgotten it)."""
        try:
            info = self.backend.job(job_id)
        except SlurmError:
            return {}
        return info.fields if info is not None else {}

    def cancel(self, *job_ids: str) -> None:
        if job_ids:
            self._run([command(self.lab, "scancel"), *job_ids], check=False)

    def start_now(self, job_id: str) -> None:
        """A requeued job waits ~120 s (BeginTime); start it as soon as resources allow."""
        self._run([command(self.lab, "scontrol"), "update", f"jobid={job_id}", "StartTime=now"], check=False)

    def queue(self) -> List[Dict[str, str]]:
        result = self._run([command(self.lab, "squeue"), "-h", "-o", "%A|%j|%T"], check=False)
        rows = []
        for line in result.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3:
                rows.append({"id": parts[0], "name": parts[1], "state": parts[2]})
        return rows

    def sacct(self, job_id: str, duplicates: bool = False) -> List[Dict[str, str]]:
        """Allocation rows (-X) of a job; with ``duplicates`` every incarnation (-D)."""
        leader, plus, _ = str(job_id).partition("+")
        try:
            rows = self.backend.accounting([leader], list(SACCT_FIELDS), every_incarnation=duplicates)
        except SlurmError:
            return []
        # a heterogeneous job's component (1234+1): the leader's rows, that component's only
        return [r for r in rows if r.get("JobID") == str(job_id)] if plus else rows

    # -- nodes ---------------------------------------------------------------------------------
    def nodes(self) -> Dict[str, Dict[str, str]]:
        """node -> {"state": long state, "reason": full reason} (sinfo -R cuts it to 20)."""
        result = self._run([command(self.lab, "sinfo"), "-h", "-N", "-o", "%N|%T|%E"])
        out: Dict[str, Dict[str, str]] = {}
        for line in result.stdout.splitlines():
            node, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            if node:
                out[node.strip()] = {"state": state.strip().lower(),
                                     "reason": "" if reason.strip() == "none" else reason.strip()}
        return out

    def resume(self, node: str) -> None:
        try:
            self.backend.resume(node)
        except SlurmError as exc:
            raise LabError(str(exc)) from None

    def ping(self) -> bool:
        result = self._run([command(self.lab, "scontrol"), "ping"], check=False, timeout=10)
        return result.returncode == 0 and "is UP" in result.stdout
