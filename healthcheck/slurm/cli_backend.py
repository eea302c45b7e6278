"""SlurmBackend over scontrol, sacct and sacctmgr.

Hooks run with no PATH (HealthCheckProgram, EpilogSlurmctld), so binaries are found by
absolute path; every call has a timeout and an argument list (no shell).

Version-aware: the backend learns the release once (``scontrol --version``). From 23.02 on
(data_parser) jobs and nodes are read from ``scontrol --json show job|node``, where no text a
user chose can pose as a field; 22.05 (and a release it cannot tell) is read from the text
outputs as before. Field names per release: docs/slurm-versions.md, captures in
tests/fixtures/slurm/releases/.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..safeio import programs
from .backend import JobInfo, NodeInfo, SlurmError, drain_argv, extra_argv, local_epoch, one_node, reboot_argv, resume_argv

SEARCH_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin")
FIELD_SEPARATOR = "\x1f"   # cannot appear in a typed comment, unlike "|"

# scontrol -o prints Key=Value pairs separated by spaces, but values (Reason, Comment,
# Command) may hold spaces: a new pair starts only where a word is followed by "=".
_PAIR_START = re.compile(r" (?=[A-Za-z][A-Za-z0-9_:/.\-]*=)")
# "Reason=text [root@2026-11-30T05:20:00]": the bracket names who set it, and when.
_REASON_SETTER = re.compile(r"^(.*) \[([^@\]]+)@([^\]]*)\]$")


def scontrol_pairs(line: str) -> List[Tuple[str, str]]:
    pairs: List[Tuple[str, str]] = []
    for chunk in _PAIR_START.split(line.strip()):
        key, sep, value = chunk.partition("=")
        if sep:
            pairs.append((key, value))
    return pairs


def extra_from_text(line: str) -> str:
    """A node's Extra from a 22.05 ``scontrol show node -o`` line, whole: an admin's ``a=1 b=2``
    would read as two pairs. 22.05 prints Extra after ExtSensorsTemp and before the Reason
    (measured in the lab), so it runs to " Reason=" or to the end of the line. "" when unset."""
    start = line.find(" Extra=")
    if start < 0:
        return ""
    start += len(" Extra=")
    end = line.find(" Reason=", start)
    text = (line[start:end] if end >= 0 else line[start:]).strip()
    return "" if text == "(null)" else text


def parse_scontrol_record(line: str) -> Dict[str, str]:
    """Every pair of a ``scontrol show ... -o`` record (a repeated key: the last value). For a
    job record, whose text users choose, read ``parse_scontrol_job`` instead."""
    return dict(scontrol_pairs(line))


# The job fields that say how a job ended and where it ran (healthcheck.records.classify, the
# records, ``slurm-gpu job``). Slurm sets them; a user must not be able to.
JOB_STATE_KEYS = ("JobState", "Reason", "Requeue", "Restarts", "ExitCode", "StartTime", "EndTime",
                  "PreemptTime", "NodeList")


def parse_scontrol_job(line: str) -> Tuple[Dict[str, str], str]:
    """A ``scontrol show job -o`` record as (fields, problem).

    The record is ambiguous by design: values are not quoted, and users choose the text of
    several fields (``sbatch -J``, ``--comment``, ``--chdir``, ``-o``/``-e``, ...), so a job named
    ``x JobState=PREEMPTED`` prints a second JobState pair. Slurm 22.05 prints the job's state
    keys between UserId and NodeList, where the only text a user chooses is the job name, which
    comes first (``JobId= JobName= UserId=``; a job's Reason has its whitespace turned into
    ``_`` by scontrol). So the state keys are trusted only when the pair after JobName is
    UserId, every key up to NodeList appears once in the whole record, and no state key appears
    after NodeList. Otherwise the state keys are left out (never guessed) and ``problem`` says why.
    """
    pairs = scontrol_pairs(line)
    fields = dict(pairs)
    keys = [key for key, _ in pairs]
    problem = ""
    if keys[:3] != ["JobId", "JobName", "UserId"]:
        problem = "the job name holds key=value text"
    elif "NodeList" not in keys:
        problem = "no NodeList"
    else:
        end = keys.index("NodeList")
        repeated = sorted({key for key in keys[:end + 1] if keys.count(key) > 1})
        late = sorted({key for key in keys[end + 1:] if key in JOB_STATE_KEYS})
        if repeated or late:
            problem = "user text holds key=value pairs (" + ", ".join(repeated + late) + ")"
    if problem:
        for key in JOB_STATE_KEYS:
            fields.pop(key, None)
        problem = f"scontrol show job: state fields left out, {problem}"
    return fields, problem


# squeue prints the state keys from Slurm's own values with nothing a user chooses among
# them, so "|" separates them unambiguously (Reason last: an admin-set reason may hold anything).
# squeue -j with one job id asks slurmctld for that job alone (squeue --json on 22.05 ignores -j
# and dumps every job it holds). (scontrol key, squeue -O field), in the order printed.
SQUEUE_JOB_FORMAT = (("JobId", "JobID"), ("JobState", "State"), ("Requeue", "Requeue"),
                     ("Restarts", "RestartCnt"), ("ExitCode", "exit_code"), ("StartTime", "StartTime"),
                     ("EndTime", "EndTime"), ("PreemptTime", "PreemptTime"), ("NodeList", "NodeList"),
                     ("Reason", "Reason"))
SQUEUE_SEPARATOR = "|"


# A job's epilog asks about its own cluster's job: ``--local`` spares slurmctld the federation
# lookup (REQUEST_FED_INFO) that scontrol and squeue otherwise send first, one RPC of the two a
# ``show job`` cost (measured with sdiag on 24.11: docs/scale.md).
LOCAL = ("--local",)


def squeue_job_argv(job_id: str) -> List[str]:
    fields = ",".join(f"{name}:{SQUEUE_SEPARATOR}" for _, name in SQUEUE_JOB_FORMAT)
    return ["--local", "-h", "-t", "all", "-j", str(job_id), "-O", fields]


def parse_squeue_job(text: str, job_id: str) -> Dict[str, str]:
    """``squeue_job_argv``'s output as scontrol's keys and spellings; {} when it has no line
    for that job (a heterogeneous job's leader lists every component, one line each).

    squeue writes a time that is 0 as "N/A" and a pending job's end as "N/A" where scontrol
    writes "Unknown" (PreemptTime: "None"), and the exit code as the raw wait status that
    scontrol splits into "exit:signal"."""
    record = next((line for line in text.splitlines() if line.startswith(f"{job_id}{SQUEUE_SEPARATOR}")), "")
    values = record.split(SQUEUE_SEPARATOR, len(SQUEUE_JOB_FORMAT) - 1)
    if len(values) != len(SQUEUE_JOB_FORMAT):
        return {}
    values[-1] = values[-1][:-1] if values[-1].endswith(SQUEUE_SEPARATOR) else values[-1]
    fields = {key: value for (key, _), value in zip(SQUEUE_JOB_FORMAT, values)}
    for key in ("StartTime", "EndTime"):
        if fields[key] in ("N/A", "NONE"):
            fields[key] = "Unknown"
    if fields["PreemptTime"] == "N/A":
        fields["PreemptTime"] = "None"
    fields["Reason"] = "".join("_" if ch.isspace() else ch for ch in fields["Reason"])
    fields["ExitCode"] = _exit_code(fields["ExitCode"])
    if not fields["ExitCode"]:
        del fields["ExitCode"]
    return fields


def _exit_code(raw: str) -> str:
    """squeue's raw wait status ("768", "15") as scontrol's "exit:signal" ("3:0", "0:15")."""
    try:
        status = int(raw)
    except ValueError:
        return ""
    if not 0 <= status <= 0xFFFF:
        return ""
    signal = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    return f"{os.WEXITSTATUS(status)}:{signal}"


# -- releases and their JSON (data_parser 0.0.40+: 23.11 and later; 23.02 has 0.0.39) ---------
JSON_SINCE = (23, 2)
_VERSION = re.compile(r"^slurm(?:-wlm)?\s+(\d+)\.(\d+)", re.MULTILINE)


def parse_version(text: str) -> Optional[Tuple[int, int]]:
    """``scontrol --version``'s "slurm-wlm 24.11.5" / "slurm 26.05.5" as (24, 11); None otherwise."""
    match = _VERSION.search(text.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def json_number(value) -> Optional[int]:
    """data_parser numbers: a plain number (0.0.38/39) or {"set", "infinite", "number"} (0.0.40+);
    None when unset or infinite."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, dict):
        if value.get("set") is False or value.get("infinite"):
            return None
        number = value.get("number")
        return int(number) if isinstance(number, (int, float)) and not isinstance(number, bool) else None
    return None


def _local_time(value, unset: str) -> str:
    """An epoch as scontrol prints it (the controller's local time); ``unset`` for 0 or none."""
    import time

    number = json_number(value)
    if not number:
        return unset
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(number))


def _json_exit(value) -> str:
    """data_parser's exit code ({"return_code", "signal": {"id"}} or a raw wait status) as "exit:signal"."""
    if isinstance(value, dict) and ("return_code" in value or "signal" in value):
        code = json_number(value.get("return_code")) or 0
        signal = value.get("signal")
        number = json_number(signal.get("id")) if isinstance(signal, dict) else None
        return f"{code}:{number or 0}"
    number = json_number(value)
    return _exit_code(str(number)) if number is not None else ""


# scontrol's job_state_string(): a flag, when set, is what it prints instead of the base state.
_STATE_FLAGS_SHOWN = ("COMPLETING", "CONFIGURING", "RESIZING", "RESV_DEL_HOLD", "REQUEUED", "REQUEUE_FED",
                      "REQUEUE_HOLD", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SIGNALING")


# A job whose epilogs run has its ending as the base state and COMPLETING as a flag; scontrol's
# text shows only COMPLETING, the JSON both. An ending no other field tells apart (a scancel'd
# job's exit code can still read 0:0 there on 24.11: seen in the lab) is taken from the base.
_ENDINGS_BEHIND_COMPLETING = ("CANCELLED", "FAILED", "TIMEOUT", "DEADLINE", "NODE_FAIL", "BOOT_FAIL",
                              "OUT_OF_MEMORY", "PREEMPTED")


def _job_state(value) -> str:
    states = [str(item).upper() for item in value] if isinstance(value, list) else [str(value or "").upper()]
    if "COMPLETING" in states[1:] and states[0] in _ENDINGS_BEHIND_COMPLETING:
        return states[0]
    for flag in _STATE_FLAGS_SHOWN:
        if flag in states[1:]:
            return flag
    return states[0] if states else ""


def job_fields_from_json(item: Dict) -> Dict[str, str]:
    """One job of ``scontrol --json show job`` under scontrol's text keys (``JobInfo.fields``).
    Every value comes from its own JSON field: a job name or comment cannot pose as another."""
    def text(key: str) -> str:
        value = item.get(key)
        return "" if value is None else str(value)

    def ident(name_key: str, id_key: str) -> str:
        number = json_number(item.get(id_key))
        return f"{text(name_key)}({'' if number is None else number})"

    fields = {
        "JobId": str(json_number(item.get("job_id")) or ""), "JobName": text("name"),
        "UserId": ident("user_name", "user_id"), "GroupId": ident("group_name", "group_id"),
        "JobState": _job_state(item.get("job_state")),
        "Reason": "".join("_" if ch.isspace() else ch for ch in text("state_reason")) or "None",
        "Requeue": "1" if item.get("requeue") else "0",
        "Restarts": str(json_number(item.get("restart_cnt")) or 0),
        "ExitCode": _json_exit(item.get("exit_code")),
        "DerivedExitCode": _json_exit(item.get("derived_exit_code")),
        "StartTime": _local_time(item.get("start_time"), "Unknown"),
        "EndTime": _local_time(item.get("end_time"), "Unknown"),
        "PreemptTime": _local_time(item.get("preempt_time"), "None"),
        "NodeList": text("nodes") or "(null)", "BatchHost": text("batch_host"),
        "Partition": text("partition"), "StdOut": text("standard_output"), "StdErr": text("standard_error"),
        "WorkDir": text("current_working_directory"),
    }
    nodes = json_number(item.get("node_count"))
    if nodes is not None:
        fields["NumNodes"] = str(nodes)
    for key, json_key in (("AdminComment", "admin_comment"), ("Comment", "comment")):
        if text(json_key):
            fields[key] = text(json_key)
    array_job = json_number(item.get("array_job_id"))
    if array_job:
        fields["ArrayJobId"] = str(array_job)
        task = json_number(item.get("array_task_id"))
        if task is not None:
            fields["ArrayTaskId"] = str(task)
    het_job = json_number(item.get("het_job_id"))
    if het_job:
        fields["HetJobId"] = str(het_job)
        fields["HetJobOffset"] = str(json_number(item.get("het_job_offset")) or 0)
    return {key: value for key, value in fields.items() if value != "" or key in ("JobName",)}


def select_json_job(doc: object, job_id: str) -> Optional[Dict]:
    """The job ``job_id`` names among ``scontrol --json show job``'s jobs (an array job's id lists
    every task, a heterogeneous leader's every component): "524" is job 524 itself, "524_7"
    array task 7 of 524, "524+1" component 1 of 524."""
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        return None
    job_id = str(job_id)
    for item in jobs:
        if not isinstance(item, dict):
            continue
        if "_" in job_id:
            parent, _, task = job_id.partition("_")
            if str(json_number(item.get("array_job_id"))) == parent and str(json_number(item.get("array_task_id"))) == task:
                return item
        elif "+" in job_id:
            leader, _, offset = job_id.partition("+")
            if str(json_number(item.get("het_job_id"))) == leader and str(json_number(item.get("het_job_offset"))) == offset:
                return item
        elif str(json_number(item.get("job_id"))) == job_id:
            return item
    return None


def node_from_json(item: Dict) -> NodeInfo:
    """One node of ``scontrol --json show node`` (0.0.40+: ``state`` a list of base state and
    flags) or of ``sinfo --json`` on 22.05 (0.0.38: ``state`` and ``state_flags``)."""
    raw_state = item.get("state")
    if isinstance(raw_state, list):
        words = [str(word).upper() for word in raw_state] or ["UNKNOWN"]
    else:
        words = [str(raw_state or "unknown").upper()] + [str(flag).upper() for flag in item.get("state_flags") or []]
    changed = json_number(item.get("reason_changed_at")) or None
    partitions = item.get("partitions") or []
    return NodeInfo(name=str(item.get("name", "")), state="+".join(words), reason=str(item.get("reason") or ""),
                    reason_user=str(item.get("reason_set_by_user") or ""),
                    reason_time=_iso(changed) if changed else "", reason_epoch=float(changed) if changed else None,
                    partitions=[str(p) for p in partitions] if isinstance(partitions, list) else [],
                    raw={"Gres": str(item["gres"])} if isinstance(item.get("gres"), str) else {},
                    extra=str(item.get("extra") or ""),
                    boot_epoch=float(json_number(item.get("boot_time")) or 0) or None)


class CliBackend:
    def __init__(self, bin_dir: str = "", slurm_conf: str = "", timeout_s: float = 15.0,
                 env: Optional[Mapping[str, str]] = None):
        self.bin_dir = bin_dir
        self.timeout_s = timeout_s
        self.env = dict(env if env is not None else os.environ)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf
        self._release: Optional[Tuple[int, int]] = None

    def release(self) -> Tuple[int, int]:
        """(major, minor) of the Slurm the clients talk to, asked once; (0, 0) when unknown."""
        if self._release is None:
            try:
                self._release = parse_version(self.run("scontrol", ["--version"])) or (0, 0)
            except SlurmError:
                self._release = (0, 0)
        return self._release

    def has_json(self) -> bool:
        return self.release() >= JSON_SINCE

    def _json(self, name: str, args: Sequence[str]) -> Dict:
        import json

        out = self.run(name, ["--json", *args])
        try:
            doc = json.loads(out)
        except ValueError:
            raise SlurmError(f"{name} --json {' '.join(args)} printed no JSON") from None
        if not isinstance(doc, dict):
            raise SlurmError(f"{name} --json {' '.join(args)}: not a JSON object")
        return doc

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
            done = programs.run(command, timeout_s or self.timeout_s, env=self.env, cwd="/")
        except programs.CommandError as exc:
            raise SlurmError(str(exc)) from None
        if done.returncode != 0:
            raise SlurmError(f"{programs.describe(command)}: {done.last_line()}")
        return done.stdout

    # -- nodes -----------------------------------------------------------------------------
    def _node_from_fields(self, fields: Dict[str, str], line: str = "") -> NodeInfo:
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
                        extra=extra_from_text(line) if line else fields.get("Extra", ""),
                        boot_epoch=local_epoch(fields.get("BootTime", "")) if fields.get("BootTime") else None,
                        partitions=[p.strip() for p in fields.get("Partitions", "").split(",") if p.strip() not in ("", "(null)")])

    def node(self, name: str) -> NodeInfo:
        if self.has_json():
            for item in self._json("scontrol", ["show", "node", name]).get("nodes") or []:
                if isinstance(item, dict) and item.get("name") == name:
                    return node_from_json(item)
            raise SlurmError(f"scontrol show node {name}: no such node")
        out = self.run("scontrol", ["show", "node", "-o", name])
        for line in out.splitlines():
            if line.startswith("NodeName="):
                return self._node_from_fields(parse_scontrol_record(line), line)
        raise SlurmError(f"scontrol show node {name}: no such node")

    def nodes(self) -> List[NodeInfo]:
        if self.has_json():
            return [node_from_json(item) for item in self._json("scontrol", ["show", "node"]).get("nodes") or []
                    if isinstance(item, dict) and item.get("name")]
        out = self.run("scontrol", ["show", "node", "-o"])
        return [self._node_from_fields(parse_scontrol_record(line), line)
                for line in out.splitlines() if line.startswith("NodeName=")]

    def sinfo_nodes(self) -> List[NodeInfo]:
        """Every node from ``sinfo --json`` (one query): state with its flags, the reason, who
        set it and when (epoch seconds, unlike scontrol's local time). From 23.02 on, sinfo's JSON
        groups nodes by state; ``scontrol --json show node`` gives the same per node."""
        import json

        if self.has_json():
            return self.nodes()
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
        self.run("scontrol", drain_argv(one_node(name), reason))

    def resume(self, name: str) -> None:
        self.run("scontrol", resume_argv(one_node(name)))

    def reboot(self, name: str, reason: str) -> None:
        self.run("scontrol", reboot_argv(one_node(name), reason))

    def set_extra(self, name: str, text: str) -> None:
        self.run("scontrol", extra_argv(one_node(name), text))

    # -- jobs ------------------------------------------------------------------------------
    def job(self, job_id: str) -> Optional[JobInfo]:
        """The job as scontrol shows it, under scontrol's text keys; None once slurmctld has
        forgotten the job. From 23.02 on every field comes from ``scontrol --json show job``;
        on 22.05 the text, with the state keys (``JOB_STATE_KEYS``) from squeue, whose output
        holds no text a user chose."""
        if self.has_json():
            return self._job_json(job_id)
        try:
            out = self.run("scontrol", [*LOCAL, "show", "job", "-o", str(job_id)])
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        line = next((line for line in out.splitlines() if line.startswith("JobId=")), None)
        if line is None:
            return None
        fields, problem = parse_scontrol_job(line)
        try:
            state = parse_squeue_job(self.run("squeue", squeue_job_argv(job_id)), job_id)
            missing = "" if state else "squeue: no record of the job"
        except SlurmError as exc:
            state, missing = {}, f"squeue: {exc}"
        if state:
            fields.update(state)
            problem = ""
        else:
            problem = "; ".join(text for text in (missing, problem) if text)
        return JobInfo(str(job_id), fields, problem)

    def _job_json(self, job_id: str) -> Optional[JobInfo]:
        try:
            doc = self._json("scontrol", [*LOCAL, "show", "job", str(job_id)])
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        item = select_json_job(doc, str(job_id))
        if item is None:
            return None
        return JobInfo(str(job_id), job_fields_from_json(item), "")

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
    return node_from_json(item)


def _iso(epoch: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))
