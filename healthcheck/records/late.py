"""Late evidence: a hardware fault found on a node shortly after a job ended there amends that
job's class (a GPU that fell off the bus as the job ended is why the job ended).

``amend_recent_jobs`` is called with the evidence a later check run found (the next job's
prolog, the health check); every job that ended on the node within ``[records]
late_evidence_window_s`` is reclassified with that evidence added (``classify.reclassify``:
the same precedence as the epilog), its record rewritten and its new entry queued for accounting.

Only evidence that could have ended the job counts: a fault on one of the job's GPUs, or a
node-wide one (an InfiniBand port, fabric manager), that no check run saw clean after the job
ended (``store.note_clean``: the next job's prolog and every health-check run record what they
found clean). A GPU the job was never given falling off the bus a minute later, or the job's
GPU failing under the next job, says nothing about why that job ended; a job its own epilog
already explained with a hardware cause keeps that cause.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List

from ..config.settings import RecordsSettings
from ..findings import Finding
from . import store

if TYPE_CHECKING:
    from ..config import Config


def amend_recent_jobs(state_dir: str, node: str, evidence: Iterable[Dict[str, Any]], now: float,
                      window_s: float, queue: bool = True) -> List[Dict[str, Any]]:
    late = [dict(item, late=True) for item in evidence]
    if not late:
        return []
    # Only here: the health check calls this module every run, and most runs find nothing.
    from . import outbox
    from .classes import is_hardware
    from .classify import reclassify

    amended = []
    clean = store.clean_since(state_dir, node)
    for ending in store.recent_endings(state_dir, node, since=now - window_s):
        record = store.read_record(state_dir, ending["job_id"], node)
        if record is None or record.get("amended_at"):
            continue
        if is_hardware(str(record.get("class"))):
            continue
        ended = float(ending["ended_at"])
        relevant = [item for item in _touching(late, record.get("gpus"))
                    if clean.get(store.subject_of(item), float("-inf")) < ended]
        if not relevant:
            continue
        everything = list(record.get("evidence") or []) + relevant
        cls, cause = reclassify(str(record.get("slurm_class", record.get("class"))), everything)
        if cls == record.get("class") or not is_hardware(cls):
            continue
        record.update({"class": cls, "cause": cause, "evidence": everything, "amended_at": now,
                       "amended_from": record.get("class")})
        if queue:
            record["entry_wanted"] = True
        store.write_record(state_dir, record)
        if queue:
            outbox.queue_record(state_dir, record, now=now)
        amended.append(record)
    return amended


def _touching(evidence: List[Dict[str, Any]], job_gpus: Any) -> List[Dict[str, Any]]:
    """The items about the job's GPUs or the whole node; all of them when the job's GPUs are unknown."""
    if not isinstance(job_gpus, list):
        return evidence
    return [item for item in evidence if item.get("gpu") is None or item.get("gpu") in job_gpus]


def finding_evidence(finding: Finding) -> Dict[str, Any]:
    """A check's finding as an evidence item (the shape ``classify`` reads)."""
    item: Dict[str, Any] = {"kind": "finding", "check": finding.check, "status": finding.status,
                            "action": finding.action, "message": finding.message}
    if finding.gpu is not None:
        item["gpu"] = finding.gpu
    if finding.hca:
        item["port"] = f"{finding.hca}:{finding.port}"
    if finding.evidence.get("xid") is not None:
        item["xid"] = finding.evidence["xid"]
    return item


def amend_from_health_run(run: Any, config: "Config") -> List[Dict[str, Any]]:
    """The health check's post-decision step (``run`` is its HealthRun): what it found failing
    with a drain action is late evidence for the jobs that just ended on the node (whether or not
    a budget held the drain back: the fault is there either way); what it found clean is noted."""
    bad = [finding_evidence(f) for f in run.report.findings if f.status == "fail" and f.action == "drain"]
    amended: List[Dict[str, Any]] = []
    if bad:
        records = config.typed(RecordsSettings)
        amended = amend_recent_jobs(config.state_dir, run.node, bad, run.started,
                                    records.late_evidence_window_s, queue=records.accounting)
    nvml = run.report.facts.nvml
    gpus = [g.index for g in nvml.gpus] if nvml is not None else []
    store.note_clean_run(config.state_dir, run.node, run.report.findings, gpus, run.started)
    return amended

