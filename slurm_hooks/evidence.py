"""A job's evidence on one node: what the prolog saw (the baseline), and what the epilog finds.

Evidence items are plain dicts (``healthcheck.records.classify`` documents their shape), so the
record in the state dir keeps exactly what the classification was made from.

The kernel log is read per job through a cursor of its own (consumer ``<node>.job.<id>``): the
prolog places it at the end of the log, the epilog reads what came after and removes it. A job
without a baseline (its prolog did not run or failed open) falls back to the lines time-stamped
inside the job's run.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Tuple

from healthcheck.config import Config
from healthcheck.config.settings import RecordsSettings
from healthcheck.findings import Finding

def finding_evidence(finding: Finding) -> Dict[str, Any]:
    """``healthcheck.records.late.finding_evidence``, the prolog and epilog's name for it; loaded
    on first use, as a healthy job's prolog has no finding to turn into evidence (late evidence
    and the classification tables stay unloaded)."""
    from healthcheck.records.late import finding_evidence as evidence_of

    return evidence_of(finding)


# Counters compared between the prolog's baseline and the epilog (per GPU / per port).
GPU_COUNTERS = ("ecc.volatile_uncorrected", "ecc.aggregate_uncorrected", "ecc.volatile_corrected",
                "remap.uncorrectable", "remap.correctable", "remap.pending", "remap.failure")


def job_consumer(node: str, job_id: str) -> str:
    return f"{node}.job.{job_id}"


def event_evidence(event: Any) -> Dict[str, Any]:
    item: Dict[str, Any] = {"kind": "xid", "code": event.code, "action": event.action, "count": event.count}
    if event.kind != "xid":
        item["event"] = event.kind
    for key in ("gpu", "pci", "uuid", "mnemonic", "first_seen"):
        value = getattr(event, key, None)
        if value is not None:
            item[key] = value
    return item


# -- counters ------------------------------------------------------------------------------------

def counters_from_facts(nvml: Any, ib: Any) -> Dict[str, Dict[str, int]]:
    """{"gpu3": {"ecc.volatile_uncorrected": 0, ...}, "mlx5_0:1": {"ib.link_downed": 0, ...}}"""
    counters: Dict[str, Dict[str, int]] = {}
    for gpu in getattr(nvml, "gpus", None) or ():
        values: Dict[str, int] = {}
        for name, value in (gpu.ecc or {}).items():
            if isinstance(value, int):
                values[f"ecc.{name}"] = value
        for name, value in (gpu.remapped_rows or {}).items():
            if isinstance(value, int):
                values[f"remap.{name}"] = value
        for link, errors in (gpu.nvlink_errors or {}).items():
            for name, value in errors.items():
                if isinstance(value, int):
                    values[f"nvlink.{name}"] = values.get(f"nvlink.{name}", 0) + value
        if values:
            counters[f"gpu{gpu.index}"] = values
    for port in getattr(ib, "ports", None) or ():
        values = {f"ib.{name}": value for name, value in (port.counters or {}).items() if isinstance(value, int)}
        if values:
            counters[port.name] = values
    return counters


def counter_evidence(before: Dict[str, Dict[str, int]], after: Dict[str, Dict[str, int]]) -> List[Dict[str, Any]]:
    """Counters that grew between the baseline and now (a reset counter is not growth)."""
    items = []
    for subject, values in sorted(after.items()):
        old = before.get(subject) or {}
        for name, value in sorted(values.items()):
            previous = old.get(name)
            if isinstance(previous, int) and value > previous:
                item: Dict[str, Any] = {"kind": "counter", "name": name, "delta": value - previous}
                if subject.startswith("gpu") and subject[3:].isdigit():
                    item["gpu"] = int(subject[3:])
                else:
                    item["port"] = subject
                items.append(item)
    return items


# -- the kernel log --------------------------------------------------------------------------------

def place_kernel_cursor(config: Config, sources: Any, node: str, job_id: str) -> Optional[str]:
    """Start this job's kernel-log cursor at the end of the log (prolog). Returns the consumer
    name, or None when the log cannot be read (the epilog then uses time stamps).

    A plain file (the usual syslog file, the simulator's) gets its cursor from a stat and one
    short read, without loading the kernel-log scanner: the job only wants what comes next.
    /dev/kmsg and the journal have no such shortcut and are read to their end."""
    consumer = job_consumer(node, job_id)
    if sources.kernel_log not in ("auto", "kmsg", "journal", "-"):
        from healthcheck.kernellog.cursor import start_file_at_end

        try:
            if start_file_at_end(sources.kernel_log, sources.state_dir, consumer):
                return consumer
        except (OSError, ValueError):
            return None
    from healthcheck.kernellog.api import KernelLogError, read_new_events

    try:
        read_new_events(sources.kernel_log, sources.state_dir, consumer, config=config).commit()
    except (KernelLogError, OSError, ValueError):
        return None
    return consumer


def kernel_evidence(config: Config, sources: Any, node: str, job_id: str, baseline: Optional[Dict[str, Any]],
                    job_gpus: Optional[Iterable[int]], gpus_facts: Iterable[Any], started_at: Optional[float],
                    now: float) -> Dict[str, Any]:
    """Xid/SXid events on the job's GPUs (or node-wide) during the job: {"events": [...], "source", "error"}."""
    consumer = (baseline or {}).get("kernel_consumer")
    if consumer and sources.kernel_log not in ("auto", "kmsg", "journal", "-"):
        from healthcheck.kernellog.cursor import file_unchanged

        try:
            quiet = file_unchanged(sources.kernel_log, sources.state_dir, consumer)
        except (OSError, ValueError):
            quiet = False           # the read below says what is wrong
        if quiet:                   # the common ending: no kernel line since the prolog
            _drop_consumer(sources.state_dir, consumer)
            return {"events": [], "source": "job cursor"}
    from healthcheck.kernellog.api import KernelLogError, events_between, read_new_events

    try:
        if consumer:
            # Read, never committed: the job's cursor goes away with the job.
            events = read_new_events(sources.kernel_log, sources.state_dir, consumer, config=config,
                                     gpus=gpus_facts, now=now).events
            _drop_consumer(sources.state_dir, consumer)
            how = "job cursor"
        else:
            events = events_between(sources.kernel_log, started_at, now, config=config, gpus=gpus_facts)
            how = "time window"
    except (KernelLogError, OSError, ValueError) as exc:
        return {"events": [], "source": "error", "error": str(exc)}
    gpus_facts = list(gpus_facts)
    instances = (baseline or {}).get("mig_devices") or ()
    kept = [event_evidence(e) for e in events if _jobs_event(e, job_gpus, bool(gpus_facts), instances)]
    return {"events": kept, "source": how}


def _jobs_event(event: Any, job_gpus: Optional[Iterable[int]], mapped: bool,
                instances: Iterable[Dict[str, Any]] = ()) -> bool:
    """An event on one of the job's GPUs, or a node-wide one (an NVSwitch SXid). A GPU's Xid
    whose address no GPU of this node has is not the job's -- unless nothing could be mapped.

    On MIG (``instances``: the baseline's mig_devices): an Xid on the parent GPU (no ``GPU-I``)
    concerns every MIG instance on it, so it is the job's; one the kernel tagged with another
    GPU instance of that parent belongs to the job on that instance, not to this one."""
    if job_gpus is None or event.kind == "sxid":
        return True
    if event.gpu is None:
        return not mapped
    if event.gpu not in set(job_gpus):
        return False
    tagged = getattr(event, "gpu_instance", None)
    mine = {m.get("gpu_instance") for m in instances if m.get("gpu") == event.gpu}
    return tagged is None or not mine or None in mine or tagged in mine


def _drop_consumer(state_dir: str, consumer: str) -> None:
    path = os.path.join(state_dir, "kernellog", consumer)
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil      # the epilog's, not every prolog's (1.5 ms)

        shutil.rmtree(path, ignore_errors=True)


# -- the job's own output (GPU OOM) ---------------------------------------------------------------

def _id_from(text: Optional[str]) -> Optional[int]:
    """"1000" -> 1000; scontrol's "alice(1000)" -> 1000; anything else -> None."""
    text = str(text or "").strip()
    if text.endswith(")") and "(" in text:
        text = text[text.rindex("(") + 1:-1]
    return int(text) if text.isdigit() else None


def job_owner(fields: Dict[str, str], env: Dict[str, str]) -> Tuple[Optional[int], Optional[int]]:
    """The job's uid and gid: slurmd's SLURM_JOB_UID/GID, else scontrol's UserId/GroupId."""
    uid = _id_from(env.get("SLURM_JOB_UID"))
    gid = _id_from(env.get("SLURM_JOB_GID"))
    if uid is None:
        uid = _id_from(fields.get("UserId"))
    if gid is None:
        gid = _id_from(fields.get("GroupId"))
    return uid, gid


def output_paths(fields: Dict[str, str]) -> List[Tuple[str, str]]:
    """[(stream, path)] of the job's StdErr and StdOut as scontrol shows them (one entry when both
    are the same file); patterns Slurm did not expand (``%``) and ``/dev/*`` are left out."""
    out: List[Tuple[str, str]] = []
    for stream, key in (("stderr", "StdErr"), ("stdout", "StdOut")):
        path = fields.get(key, "")
        if not path or path == "(null)" or "%" in path or path.startswith("/dev/"):
            continue
        if path not in [p for _, p in out]:
            out.append((stream, path))
    return out


def job_output_evidence(config: Config, node: str, fields: Dict[str, str],
                        env: Dict[str, str]) -> Dict[str, Any]:
    """GPU OOM evidence from the tail of the job's own StdErr/StdOut, read as the job's user
    (``healthcheck.probes.job_output``) on the job's batch host only (the other nodes of a job
    would read the same files). Never raises: ``{"events": [...], "read": [...], "problem": ...}``."""
    result: Dict[str, Any] = {"events": [], "read": []}
    try:
        from healthcheck.probes.job_output import read_tails_as
        from healthcheck.records import gpu_oom

        batch_host = fields.get("BatchHost", "")
        if batch_host and batch_host != node:
            result["skipped"] = f"not the batch host ({gpu_oom.shown(batch_host, 64)})"
            return result
        uid, gid = job_owner(fields, env)
        if uid is None or gid is None:
            result["problem"] = "the job's uid/gid are unknown"
            return result
        if uid == 0 or gid == 0:
            # Nothing could be dropped: root's files are never read for a job (the reader refuses too).
            result["skipped"] = f"the job runs as uid {uid} gid {gid}"
            return result
        streams = output_paths(fields)
        if not streams:
            result["skipped"] = "no output file to read"
            return result
        records = config.typed(RecordsSettings)
        tails, problem = read_tails_as([path for _, path in streams], uid, gid, records.job_output_tail_kib * 1024,
                                       records.job_output_timeout_s)
        if problem:
            result["problem"] = gpu_oom.shown(problem)
        stream_of = {path: stream for stream, path in streams}
        for tail in tails:
            summary = tail.summary()
            summary["path"] = gpu_oom.shown(tail.path, 256)
            summary["stream"] = stream_of[tail.path]
            result["read"].append(summary)
            found = None if tail.error else gpu_oom.find(tail.data, tail.truncated, stream_of[tail.path])
            if found is not None:
                result["events"].append(found)
    except Exception as exc:  # noqa: BLE001 - a broken reader costs the evidence, never the record
        result["problem"] = f"{type(exc).__name__}: {exc}"
    return result
