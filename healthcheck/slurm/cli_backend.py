"""SlurmBackend over scontrol, sacct and sacctmgr.

Hooks run with no PATH (HealthCheckProgram, EpilogSlurmctld), so binaries are found by
absolute path; every call has a timeout and an argument list (no shell).
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Optional, Sequence

from .. import bounded
from .backend import JobInfo, NodeInfo, SlurmError, drain_argv, local_epoch, resume_argv

SEARCH_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin")
FIELD_SEPARATOR = "\x1f"   # cannot appear in a typed comment, unlike "|"

# scontrol -o prints Key=Value pairs separated by spaces, but values (Reason, Comment,
# Command) may hold spaces: a new pair starts only where a word is followed by "=".
_PAIR_START = re.compile(r" (?=[A-Za-z][A-Za-z0-9_:/.\-]*=)")
# "Reason=text [root@2026-11-30T05:20:00]": the bracket names who set it, and when.
_REASON_SETTER = re.compile(r"^(.*) \[([^@\]]+)@([^\]]*)\]$")


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
            done = bounded.run(command, timeout_s or self.timeout_s, env=self.env, cwd="/")
        except bounded.CommandError as exc:
            raise SlurmError(str(exc)) from None
        if done.returncode != 0:
            raise SlurmError(f"{bounded.describe(command)}: {done.last_line()}")
        return done.stdout

    # -- nodes -----------------------------------------------------------------------------
    def _node_from_fields(self, fields: Dict[str, str]) -> NodeInfo:
        reason = fields.get("Reason", "")
        user = ""
        # "Reason=text [root@2026-11-30T05:20:00]": the bracket names who set it.
        when = ""
        match = _REASON_SETTER.match(reason)
        if match:
            reason, user, when = match.group(1), match.group(2), match.group(3)
        return NodeInfo(name=fields.get("NodeName", ""), state=fields.get("State", ""),
                        reason="" if reason == "(null)" else reason, reason_user=user, reason_time=when,
                        raw=fields, reason_epoch=local_epoch(when) if when else None,
                        partitions=[p.strip() for p in fields.get("Partitions", "").split(",") if p.strip() not in ("", "(null)")])

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

    def sinfo_nodes(self) -> List[NodeInfo]:
        """Every node from ``sinfo --json`` (one query): state with its flags, the reason, who
        set it and when (epoch seconds, unlike scontrol's local time)."""
        import json

        out = self.run("sinfo", ["--json"])
        try:
            doc = json.loads(out)
        except ValueError:
            raise SlurmError("sinfo --json printed no JSON") from None
        nodes = []
        for item in doc.get("nodes", []) if isinstance(doc, dict) else []:
            if isinstance(item, dict) and item.get("name"):
                nodes.append(node_from_sinfo(item))
        return nodes

    def drain(self, name: str, reason: str) -> None:
        self.run("scontrol", drain_argv(name, reason))

    def resume(self, name: str) -> None:
        self.run("scontrol", resume_argv(name))

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


def node_from_sinfo(item: Dict) -> NodeInfo:
    """One node of ``sinfo --json`` (Slurm 22.05, data_parser 0.0.38) as a NodeInfo."""
    flags = [str(flag).upper() for flag in item.get("state_flags") or []]
    state = "+".join([str(item.get("state", "unknown")).upper()] + flags)
    changed = item.get("reason_changed_at") or None
    return NodeInfo(name=str(item["name"]), state=state, reason=str(item.get("reason") or ""),
                    reason_user=str(item.get("reason_set_by_user") or ""),
                    reason_time=_iso(changed) if changed else "", reason_epoch=float(changed) if changed else None,
                    partitions=[str(p) for p in item.get("partitions") or []], raw={})


def _iso(epoch: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))
