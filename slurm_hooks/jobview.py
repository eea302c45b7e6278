"""One job's classification with its evidence, from accounting, the state dir's records and
live Slurm: what ``slurm-gpu job`` shows. ``assemble`` is pure; ``gather`` does the reading.

JSON (a contract; keys may be added, never renamed)::

    {"job_id": "123", "class": "GPU_LOST",
     "nodes": {"gpu1": {"class": "GPU_LOST", "evidence": {"gpu": 3, "xid": 79}, "from": "accounting"},
               "gpu2": {"class": "FAILED", "evidence": {}, "from": "job-level"}},
     "sources": ["accounting", "records"],
     "state": "FAILED", "exit_code": "1:0", "entries": [...],
     "raw_job_id": "531", "shown_job_id": "524_7"}

An array task or a heterogeneous job's component is found by the id sacct shows (``524_7``,
``1234+1``: JOBID as given is accepted when it is a job id) or by its raw id (``SLURM_JOB_ID``, sacct's
JobIDRaw), under which the hooks keep its records.

A node's own entry (accounting) or record (state dir) speaks for it; a node with neither has the
job-level class ("from": "job-level"), since an ordinary node writes no entry of its own.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from healthcheck.records import admin_comment
from healthcheck.records.classes import UNKNOWN
from healthcheck.records.classify import SlurmView, job_class, latest_run, slurm_ending
from healthcheck.slurm.backend import assigned_nodes

ENTRY_META = ("v", "node", "class", "t")


def _evidence_of_entry(entry: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in ENTRY_META}


def _evidence_of_record(record: Mapping[str, Any]) -> Dict[str, Any]:
    from healthcheck.records.store import entry_for

    out = _evidence_of_entry(entry_for(dict(record)))
    if record.get("evidence"):
        out["items"] = record["evidence"]
    return out


def assemble(job_id: str, row: Optional[Mapping[str, str]], records: List[Mapping[str, Any]],
             live: Optional[Mapping[str, str]], node_names: List[str]) -> Dict[str, Any]:
    sources: List[str] = []
    every_entry = admin_comment.parse(row.get("AdminComment")) if row else []
    entries = latest_run(every_entry)            # a requeued job: its last run; the earlier ones listed
    if row is not None:
        sources.append("accounting")
    if records:
        sources.append("records")
    if live is not None:
        sources.append("live")
    nodes: Dict[str, Dict[str, Any]] = {}
    for record in records:
        if record.get("node") != "*":
            nodes[str(record["node"])] = {"class": record["class"], "evidence": _evidence_of_record(record),
                                          "from": "records"}
    for entry in entries:
        name = str(entry.get("node"))
        if name != "*" and (name not in nodes or entry.get("late")):
            nodes[name] = {"class": entry["class"], "evidence": _evidence_of_entry(entry), "from": "accounting"}

    everything = entries + [{"node": r.get("node"), "class": r.get("class")} for r in records]
    cls = job_class(everything) if everything else UNKNOWN
    if cls == UNKNOWN and row is not None and row.get("State"):
        cls = slurm_ending(SlurmView.from_sacct(row)).cls
    elif cls == UNKNOWN and live is not None:
        cls = slurm_ending(SlurmView.from_scontrol(live)).cls
    level = next((e["class"] for e in entries if str(e.get("node")) == "*"), None) or \
        next((r["class"] for r in records if r.get("node") == "*"), None) or cls
    for name in node_names:
        nodes.setdefault(name, {"class": level, "evidence": {}, "from": "job-level"})
    view: Dict[str, Any] = {"job_id": str(job_id), "class": cls, "nodes": dict(sorted(nodes.items())),
                            "sources": sources, "entries": every_entry}
    if len(entries) < len(every_entry):
        view["earlier_runs"] = [e for e in every_entry if e not in entries]
    if row is not None:
        view.update(state=row.get("State"), exit_code=row.get("ExitCode"), elapsed=row.get("Elapsed"),
                    node_list=row.get("NodeList"))
    elif live is not None:
        view.update(state=live.get("JobState"), exit_code=live.get("ExitCode"), node_list=live.get("NodeList"))
    return view


ACCOUNTING_FIELDS = ["JobID", "JobIDRaw", "State", "ExitCode", "Elapsed", "NodeList", "AdminComment"]


def gather(config, job_id: str, backend) -> Dict[str, Any]:
    """Read accounting, records and live Slurm; each source that fails is left out (and said)."""
    from healthcheck.records import store

    from healthcheck.slurm import SlurmError

    from healthcheck.slurm.job_accounting import row_of

    problems = []
    row = None
    try:
        row = row_of(backend.accounting([job_id], ACCOUNTING_FIELDS), job_id)
    except SlurmError as exc:
        problems.append(f"accounting: {exc}")
    live = None
    try:
        job = backend.job(job_id)
        live = job.fields if job is not None else None
        if job is not None and job.problem:
            problems.append(f"live Slurm: {job.problem}")
    except SlurmError as exc:
        problems.append(f"live Slurm: {exc}")
    # The hooks keep records under the raw id (SLURM_JOB_ID): an array task's (524_7 is 531) or a
    # heterogeneous component's; sacct's JobIDRaw or scontrol's JobId says which it is.
    raw = (row or {}).get("JobIDRaw") or (live or {}).get("JobId") or str(job_id)
    records = store.read_records(config.state_dir, raw) if store.JOB_ID.match(raw) else []
    node_list = assigned_nodes((row or {}).get("NodeList")) or assigned_nodes((live or {}).get("NodeList"))
    names: List[str] = []
    if node_list:
        try:
            names = backend.expand_hostlist(node_list)
        except Exception:  # noqa: BLE001 - a list we cannot expand is shown as it is
            names = []
    view = assemble(job_id, row, records, live, names)
    view["raw_job_id"] = raw                 # SLURM_JOB_ID in the hooks; sacct's JobIDRaw
    view["shown_job_id"] = (row or {}).get("JobID") or _shown_id(live) or raw     # 524_7, 1234+1
    if problems:
        view["problems"] = problems
    return view


def _shown_id(live: Optional[Mapping[str, str]]) -> Optional[str]:
    """scontrol's fields as sacct names the job: ``ArrayJobId_ArrayTaskId``, ``HetJobId+HetJobOffset``."""
    if not live:
        return None
    if live.get("ArrayJobId") and live.get("ArrayTaskId"):
        return f"{live['ArrayJobId']}_{live['ArrayTaskId']}"
    if live.get("HetJobId") and live.get("HetJobOffset"):
        return f"{live['HetJobId']}+{live['HetJobOffset']}"
    return None
