"""One job's classification with its evidence, from accounting, the state dir's records and
live Slurm: what ``slurm-gpu job`` shows. ``assemble`` is pure; ``gather`` does the reading.

JSON (a contract; keys may be added, never renamed)::

    {"job_id": "123", "class": "GPU_LOST",
     "nodes": {"gpu1": {"class": "GPU_LOST", "evidence": {"gpu": 3, "xid": 79}, "from": "accounting"},
               "gpu2": {"class": "FAILED", "evidence": {}, "from": "job-level"}},
     "sources": ["accounting", "records"],
     "state": "FAILED", "exit_code": "1:0", "entries": [...]}

A node's own entry (accounting) or record (state dir) speaks for it; a node with neither has the
job-level class ("from": "job-level"), since an ordinary node writes no entry of its own.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from healthcheck.records import admin_comment
from healthcheck.records.classes import UNKNOWN
from healthcheck.records.classify import SlurmView, job_class, slurm_ending

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
    entries = admin_comment.parse(row.get("AdminComment")) if row else []
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
                            "sources": sources, "entries": entries}
    if row is not None:
        view.update(state=row.get("State"), exit_code=row.get("ExitCode"), elapsed=row.get("Elapsed"),
                    node_list=row.get("NodeList"))
    elif live is not None:
        view.update(state=live.get("JobState"), exit_code=live.get("ExitCode"), node_list=live.get("NodeList"))
    return view


ACCOUNTING_FIELDS = ["JobID", "State", "ExitCode", "Elapsed", "NodeList", "AdminComment"]


def gather(config, job_id: str, backend) -> Dict[str, Any]:
    """Read accounting, records and live Slurm; each source that fails is left out (and said)."""
    from healthcheck.records import store

    from healthcheck.slurm import SlurmError

    problems = []
    row = None
    try:
        rows = backend.accounting([job_id], ACCOUNTING_FIELDS)
        row = next((r for r in rows if r.get("JobID") == str(job_id)), None)
    except SlurmError as exc:
        problems.append(f"accounting: {exc}")
    records = store.read_records(config.state_dir, job_id)
    live = None
    try:
        job = backend.job(job_id)
        live = job.fields if job is not None else None
        if job is not None and job.problem:
            problems.append(f"live Slurm: {job.problem}")
    except SlurmError as exc:
        problems.append(f"live Slurm: {exc}")
    node_list = (row or {}).get("NodeList") or (live or {}).get("NodeList") or ""
    names: List[str] = []
    if node_list and node_list not in ("None assigned", "(null)"):
        try:
            names = backend.expand_hostlist(node_list)
        except Exception:  # noqa: BLE001 - a list we cannot expand is shown as it is
            names = []
    view = assemble(job_id, row, records, live, names)
    if problems:
        view["problems"] = problems
    return view
