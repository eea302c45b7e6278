"""Per-job files in the state dir: the prolog's baseline and one record per (job, node).

::

    <state_dir>/jobs/<job_id>/<node>.json            the record: how the job ended on that node
    <state_dir>/jobs/<job_id>/<node>.baseline.json   what the prolog saw (counters, cursor, GPUs)
    <state_dir>/jobs/<job_id>/_job.json              the job-level record (EpilogSlurmctld, node "*")
    <state_dir>/recent/<node>.json                   the last endings on a node (late evidence)

Every write is atomic (``fsutil.atomic_write``: temp file + rename, O_NOFOLLOW, mode 0640), so a
reader sees a whole record or none; a torn or foreign file reads as absent.
"""
from __future__ import annotations

import os
import re
import stat
from typing import Any, Dict, Iterable, List, Mapping, Optional

from ..safeio import fsutil

JOBS_DIR = "jobs"
RECENT_DIR = "recent"
JOB_LEVEL = "*"
RECENT_KEEP = 64
RECORD_VERSION = 1

JOB_ID = re.compile(r"^[0-9]{1,12}(_[0-9]{1,9})?$")


# What a person may name a job by: also a heterogeneous job's component as sacct shows it (1234+1).
SHOWN_JOB_ID = re.compile(r"^[0-9]{1,12}([_+][0-9]{1,9})?$")


def shown_job_id_ok(job_id: str) -> str:
    if not SHOWN_JOB_ID.match(str(job_id)):
        raise ValueError(f"{job_id!r} is not a Slurm job id (1234, 1234_7 or 1234+1)")
    return str(job_id)


def job_id_ok(job_id: str) -> str:
    if not JOB_ID.match(str(job_id)):
        raise ValueError(f"{job_id!r} is not a Slurm job id")
    return str(job_id)


def node_file(node: str) -> str:
    return "_job" if node == JOB_LEVEL else fsutil.path_component(node)


def job_dir(state_dir: str, job_id: str) -> str:
    return os.path.join(state_dir, JOBS_DIR, job_id_ok(job_id))


def record_path(state_dir: str, job_id: str, node: str) -> str:
    return os.path.join(job_dir(state_dir, job_id), node_file(node) + ".json")


def baseline_path(state_dir: str, job_id: str, node: str) -> str:
    return os.path.join(job_dir(state_dir, job_id), node_file(node) + ".baseline.json")


def _write_json(path: str, data: Dict[str, Any]) -> None:
    import json

    fsutil.ensure_dir(os.path.dirname(path))
    fsutil.atomic_write(path, json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")


def write_record(state_dir: str, record: Dict[str, Any]) -> str:
    """Write (or replace) the record of ``record["job_id"]`` on ``record["node"]``. A requeued
    job's earlier run (another ``run``: its SLURM_JOB_SLUID, else its restart count) is kept as
    ``<node>.run-<run>.json`` (``earlier_runs``), never overwritten by the next run's ending."""
    record = dict(record)
    record.setdefault("v", RECORD_VERSION)
    path = record_path(state_dir, record["job_id"], record["node"])
    # A record of a newer format (a rollback) raises fsutil.NewerFormat: it is not replaced.
    before = fsutil.read_state_json(path, newest=RECORD_VERSION, version_key="v")
    if before is not None and "run" in record and before.get("run", 0) != record["run"]:
        run = fsutil.path_component(str(before.get("run", 0)))
        os.replace(path, os.path.join(os.path.dirname(path), f"{node_file(record['node'])}{RUN_INFIX}{run}.json"))
    _write_json(path, record)
    return path


RUN_INFIX = ".run-"


def is_record_name(name: str) -> bool:
    """A (job, node) record's file: the latest run's, not a baseline, an earlier run or a temporary file."""
    return name.endswith(".json") and not name.endswith(".baseline.json") and not name.startswith(".") \
        and RUN_INFIX not in name


def run_of(env: Mapping[str, str], fields: Optional[Mapping[str, str]] = None,
           requeued: bool = False, previous: Optional[Mapping[str, Any]] = None,
           started_at: Optional[float] = None) -> Dict[str, Any]:
    """Which run of a job an epilog saw: ``restarts``, the run's index (SLURM_JOB_RESTART_COUNT, else
    scontrol's Restarts; a run that is being requeued already counts its requeue there, measured on
    22.05: ``requeued`` takes it back), and ``run`` (SLURM_JOB_SLUID where the release sets it,
    25.11+; else ``restarts``). ``previous`` is the record this job already has here: when it is
    another run's (another ``started_at``) and not an earlier index, this run comes after it (on
    24.11 a requeued run's epilog saw the next count without the job reading as requeued)."""
    text = env.get("SLURM_JOB_RESTART_COUNT") or (fields or {}).get("Restarts") or "0"
    restarts = int(text) if text.isdigit() and len(text) < 7 else 0
    if requeued and restarts > 0:
        restarts -= 1
    before = (previous or {}).get("restarts")
    if isinstance(before, int) and not isinstance(before, bool) and started_at is not None \
            and (previous or {}).get("started_at") not in (None, started_at) and restarts <= before:
        restarts = before + 1
    sluid = env.get("SLURM_JOB_SLUID", "")
    run: Any = sluid if re.match(r"^[0-9A-Za-z]{1,40}$", sluid) else restarts
    return {"run": run, "restarts": restarts}


def earlier_runs(state_dir: str, job_id: str) -> List[Dict[str, Any]]:
    """The records of a requeued job's earlier runs (``write_record`` kept them)."""
    directory = job_dir(state_dir, job_id)
    try:
        names = sorted(n for n in os.listdir(directory) if RUN_INFIX in n and n.endswith(".json"))
    except OSError:
        return []
    found = [fsutil.read_state_json(os.path.join(directory, name)) for name in names]
    return sorted((r for r in found if r is not None and str(r.get("job_id")) == str(job_id)),
                  key=lambda r: (r.get("ended_at") or 0, str(r.get("node"))))


def read_record(state_dir: str, job_id: str, node: str) -> Optional[Dict[str, Any]]:
    return fsutil.read_state_json(record_path(state_dir, job_id, node))


def read_records(state_dir: str, job_id: str) -> List[Dict[str, Any]]:
    """Every record of a job found in this state dir (the job-level one first)."""
    directory = job_dir(state_dir, job_id)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    records = []
    for name in names:
        if is_record_name(name):
            data = fsutil.read_state_json(os.path.join(directory, name))
            if data is not None and str(data.get("job_id")) == str(job_id):
                records.append(data)
    records.sort(key=lambda r: (r.get("node") != JOB_LEVEL, str(r.get("node"))))
    return records


def write_baseline(state_dir: str, job_id: str, node: str, baseline: Dict[str, Any]) -> str:
    path = baseline_path(state_dir, job_id, node)
    _write_json(path, dict(baseline, job_id=str(job_id), node=node, v=RECORD_VERSION))
    return path


def read_baseline(state_dir: str, job_id: str, node: str) -> Optional[Dict[str, Any]]:
    return fsutil.read_state_json(baseline_path(state_dir, job_id, node))


# -- recent endings per node, for late evidence ------------------------------------------------

def _recent_path(state_dir: str, node: str) -> str:
    return os.path.join(state_dir, RECENT_DIR, fsutil.path_component(node) + ".json")


def note_ending(state_dir: str, node: str, job_id: str, ended_at: float) -> None:
    """Remember that ``job_id`` ended on ``node`` (the last ``RECENT_KEEP`` endings)."""
    path = _recent_path(state_dir, node)
    with fsutil.locked(path + ".lock"):
        data = fsutil.read_state_json(path) or {}
        jobs = [j for j in data.get("jobs", []) if isinstance(j, dict) and j.get("job_id") != str(job_id)]
        jobs.append({"job_id": str(job_id), "ended_at": float(ended_at)})
        _write_json(path, dict(data, node=node, jobs=jobs[-RECENT_KEEP:]))


def note_clean(state_dir: str, node: str, subjects: List[str], at: float) -> None:
    """Remember that a check run at ``at`` found nothing wrong with ``subjects`` on ``node``
    (``"gpu3"``, or ``"node"`` for the node-wide checks): a fault found later on one of them
    arose after ``at``, so it cannot be why a job that ended before ``at`` ended."""
    if not subjects:
        return
    path = _recent_path(state_dir, node)
    with fsutil.locked(path + ".lock"):
        data = fsutil.read_state_json(path) or {}
        clean = data.get("clean") if isinstance(data.get("clean"), dict) else {}
        for subject in subjects:
            previous = clean.get(subject)
            if not isinstance(previous, (int, float)) or previous < at:
                clean[subject] = float(at)
        _write_json(path, dict(data, node=node, clean=clean))


def note_clean_run(state_dir: str, node: str, findings: Iterable[Any], gpus: Iterable[int], at: float) -> None:
    """Record which of ``gpus`` (and the node-wide checks) a run starting at ``at`` found clean:
    no finding of any status, so a probe that could not look is not taken for a clean look."""
    seen = {subject_of({"gpu": finding.gpu}) for finding in findings}
    note_clean(state_dir, node, [s for s in [f"gpu{i}" for i in gpus] + ["node"] if s not in seen], at)


def clean_since(state_dir: str, node: str) -> Dict[str, float]:
    """``subject -> the last time a check run found it clean`` (``note_clean``)."""
    clean = (fsutil.read_state_json(_recent_path(state_dir, node)) or {}).get("clean")
    if not isinstance(clean, dict):
        return {}
    return {str(k): float(v) for k, v in clean.items() if isinstance(v, (int, float))}


def subject_of(item: Dict[str, Any]) -> str:
    """The subject a finding or evidence item is about: its GPU, else the whole node."""
    return "node" if item.get("gpu") is None else f"gpu{item['gpu']}"


def recent_endings(state_dir: str, node: str, since: float) -> List[Dict[str, Any]]:
    data = fsutil.read_state_json(_recent_path(state_dir, node)) or {}
    return [j for j in data.get("jobs", []) if isinstance(j, dict)
            and isinstance(j.get("ended_at"), (int, float)) and j["ended_at"] >= since]


def entry_for(record: Dict[str, Any]) -> Dict[str, Any]:
    """The compact AdminComment entry of a record (``admin_comment`` documents the keys)."""
    entry: Dict[str, Any] = {"node": record["node"], "class": record["class"]}
    cause = record.get("cause") or {}
    for key in ("gpu", "check", "port"):
        if cause.get(key) is not None:
            entry[key] = cause[key]
    if cause.get("kind") == "xid":
        entry["xid"] = cause.get("code")
    elif cause.get("kind") == "gpu_oom":
        entry["oom"] = cause.get("signature")      # which known message; the line stays in the record
    elif cause.get("gpu") is not None:
        # A failing check named the GPU; the Xid the driver logged for it says more.
        xids = [e.get("code") for e in record.get("evidence") or []
                if e.get("kind") == "xid" and e.get("gpu") == cause["gpu"] and not e.get("late")]
        if xids:
            entry["xid"] = xids[0]
    for key in ("exit", "signal"):
        if record.get(key):
            entry[key] = record[key]
    if record.get("gpus") is not None:
        entry["gpus"] = len(record["gpus"])
    for key in ("elapsed_s", "nodes"):
        if record.get(key) is not None:
            entry[key] = record[key]
    if record.get("amended_at"):
        entry["late"] = True
    if record.get("restarts"):
        entry["run"] = record["restarts"]      # a requeued job's later run: its own entry, the earlier kept
    return entry


# -- which records' entries were queued ----------------------------------------------------------

QUEUED_SUFFIX = ".queued"


def queued_marker(state_dir: str, job_id: str, node: str) -> str:
    """``<node>.queued`` beside the record: its entry reached the outbox after the record was last
    written (a marker older than the record, or none, and the entry may never have been queued)."""
    return os.path.join(job_dir(state_dir, job_id), node_file(node) + QUEUED_SUFFIX)


def mark_queued(state_dir: str, job_id: str, node: str) -> None:
    path = queued_marker(state_dir, job_id, node)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, fsutil.FILE_MODE)
    try:
        os.utime(fd)        # an older marker (the record was amended since) becomes current
    finally:
        os.close(fd)


def records_needing_queue(state_dir: str, since: float) -> Iterable[Dict[str, Any]]:
    """Records written at or after ``since`` that want an AdminComment entry (``entry_wanted``)
    and have no marker at least as new as themselves: an entry that could not be queued (a full
    disk) is found here again. Job directories and records older than ``since`` are not read."""
    root = os.path.join(state_dir, JOBS_DIR)
    try:
        job_names = sorted(os.listdir(root))
    except OSError:
        return
    for job_name in job_names:
        directory = os.path.join(root, job_name)
        try:
            info = os.lstat(directory)
        except OSError:
            continue
        if not JOB_ID.match(job_name) or not stat.S_ISDIR(info.st_mode) or info.st_mtime < since:
            continue
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if not is_record_name(name):
                continue
            path = os.path.join(directory, name)
            try:
                written = os.lstat(path).st_mtime_ns
            except OSError:
                continue
            if written < since * 1e9:
                continue
            try:
                if os.lstat(path[:-len(".json")] + QUEUED_SUFFIX).st_mtime_ns >= written:
                    continue
            except OSError:
                pass
            record = fsutil.read_state_json(path)
            if record is not None and record.get("entry_wanted") and str(record.get("job_id")) == job_name:
                yield record
