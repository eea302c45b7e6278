"""SlurmBackend over scontrol, sacct and sacctmgr.

Hooks run with no PATH (HealthCheckProgram, EpilogSlurmctld), so binaries are found by
absolute path; every call has a timeout and an argument list (no shell).
"""
from __future__ import annotations

import os
import re
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence

from .backend import JobInfo, NodeInfo, SlurmError

SEARCH_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin")
FIELD_SEPARATOR = "\x1f"   # cannot appear in a typed comment, unlike "|"

# scontrol -o prints Key=Value pairs separated by spaces, but values (Reason, Comment,
# Command) may hold spaces: a new pair starts only where a word is followed by "=".
_PAIR_START = re.compile(r" (?=[A-Za-z][A-Za-z0-9_:/.\-]*=)")


def parse_scontrol_record(line: str) -> Dict[str, str]:
    fields: Dict[str, str] = {}
    for chunk in _PAIR_START.split(line.strip()):
        key, sep, value = chunk.partition("=")
        if sep:
            fields[key] = value
    return fields


class CliBackend:
    def __init__(self, bin_dir: str = "", slurm_conf: str = "", timeout_s: float = 15.0,
                 env: Optional[Mapping[str, str]] = None):
        self.bin_dir = bin_dir
        self.timeout_s = timeout_s
        self.env = dict(env if env is not None else os.environ)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf

    # -- plumbing --------------------------------------------------------------------------
    def binary(self, name: str) -> str:
        dirs = (self.bin_dir,) if self.bin_dir else SEARCH_DIRS
        for directory in dirs:
            path = os.path.join(directory, name)
            if os.access(path, os.X_OK):
                return path
        raise SlurmError(f"{name} not found in {', '.join(dirs)}")

    def run(self, name: str, args: Sequence[str], timeout_s: Optional[float] = None) -> str:
        command = [self.binary(name), *args]
        try:
            done = subprocess.run(command, capture_output=True, text=True, errors="replace",
                                  env=self.env, timeout=timeout_s or self.timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{name} {' '.join(args[:3])} did not answer within {timeout_s or self.timeout_s:g} s") from None
        except OSError as exc:
            raise SlurmError(f"{name}: {exc.strerror}") from None
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise SlurmError(f"{name} {' '.join(args[:3])}: {detail[-1] if detail else 'exit ' + str(done.returncode)}")
        return done.stdout

    # -- nodes -----------------------------------------------------------------------------
    def _node_from_fields(self, fields: Dict[str, str]) -> NodeInfo:
        reason = fields.get("Reason", "")
        user = ""
        # "Reason=text [root@2026-11-30T05:20:00]": the bracket names who set it.
        match = re.match(r"^(.*) \[([^@\]]+)@[^\]]*\]$", reason)
        if match:
            reason, user = match.group(1), match.group(2)
        return NodeInfo(name=fields.get("NodeName", ""), state=fields.get("State", ""),
                        reason="" if reason == "(null)" else reason, reason_user=user, raw=fields)

    def node(self, name: str) -> NodeInfo:
        out = self.run("scontrol", ["show", "node", "-o", name])
        for line in out.splitlines():
            if line.startswith("NodeName="):
                return self._node_from_fields(parse_scontrol_record(line))
        raise SlurmError(f"scontrol show node {name}: no such node")

    def nodes(self) -> List[NodeInfo]:
        out = self.run("scontrol", ["show", "node", "-o"])
        return [self._node_from_fields(parse_scontrol_record(line))
                for line in out.splitlines() if line.startswith("NodeName=")]

    def drain(self, name: str, reason: str) -> None:
        self.run("scontrol", ["update", f"nodename={name}", "state=drain", f"reason={reason}"])

    def resume(self, name: str) -> None:
        self.run("scontrol", ["update", f"nodename={name}", "state=resume"])

    # -- jobs ------------------------------------------------------------------------------
    def job(self, job_id: str) -> Optional[JobInfo]:
        try:
            out = self.run("scontrol", ["show", "job", "-o", str(job_id)])
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        for line in out.splitlines():
            if line.startswith("JobId="):
                return JobInfo(str(job_id), parse_scontrol_record(line))
        return None

    def set_admin_comment(self, job_id: str, text: str) -> None:
        # scontrol refuses once the job is COMPLETING; sacctmgr works from the Epilog.
        self.run("sacctmgr", ["-i", "modify", "job", "where", f"jobid={job_id}", "set",
                              f"AdminComment={text}"])

    def accounting(self, job_ids: List[str], fields: List[str], every_incarnation: bool = False) -> List[Dict[str, str]]:
        """One row per job allocation; with ``every_incarnation`` (``-D``) a requeued job's
        earlier runs too (plain sacct shows only the latest)."""
        args = ["-X", "-n", "-P", f"--delimiter={FIELD_SEPARATOR}", "--format=" + ",".join(fields)]
        if every_incarnation:
            args.insert(0, "-D")
        if job_ids:
            args += ["-j", ",".join(str(j) for j in job_ids)]
        out = self.run("sacct", args)
        rows = []
        for line in out.splitlines():
            values = line.split(FIELD_SEPARATOR)
            if len(values) == len(fields):
                rows.append(dict(zip(fields, values)))
        return rows

    def expand_hostlist(self, expression: str) -> List[str]:
        import hostlist

        return hostlist.expand_hostlist(expression)
