"""Why one job (one incarnation) ended, from its sacct State and this tool's AdminComment
entries. Pure: text in, a ``Verdict`` out.

* A hardware class from any node's entry (the node that broke the job) decides the cause, the
  strongest by the epilog's precedence (``records.classify.job_class``); so does an application
  class (GPU_OOM) from a node's entry where the job-level entry is one it replaces (FAILED).
* Else a job-level entry (``node`` "*", written once per job by EpilogSlurmctld) decides it.
* Else node entries that agree on one class decide it.
* Else, and for every job without an entry of ours, the cause is the first word of sacct's
  State (``CANCELLED by 0`` -> ``CANCELLED``), and the verdict says it came from accounting.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from healthcheck.records import admin_comment
from healthcheck.records.classes import HARDWARE_CLASSES, UNKNOWN, is_application, is_hardware
from healthcheck.records.classify import job_class

SOURCE_HOOKS = "hooks"            # an entry of ours decided
SOURCE_ACCOUNTING = "sacct"       # sacct's State alone

# Rows of jobs that have not ended: not counted as endings.
UNFINISHED = frozenset(("PENDING", "RUNNING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED",
                        "RESIZING", "REVOKED", "SIGNALING", "STAGE_OUT", "SPECIAL_EXIT"))


@dataclass
class Culprit:
    """A node (and GPU, Xid) behind a hardware-caused ending."""
    node: str
    gpu: Optional[int] = None
    xid: Optional[int] = None


@dataclass
class Verdict:
    cause: str
    source: str
    hardware: bool = False
    culprits: List[Culprit] = field(default_factory=list)
    xids: Tuple[int, ...] = ()
    check: str = ""


# sacctmgr, the only way to set AdminComment once a job is COMPLETING, stores it lower-cased with
# every quote turned into a backtick (22.05.8): what sacct shows is usually that stored form.
TAGS = (admin_comment.TAG, admin_comment.TAG.lower())
STORED_QUOTE = "`"

# The common case, decided without a JSON parser: exactly one entry of ours, job-level, with no
# Xid (only plain string or number values), in either form. Anything else takes the full path.
_SIMPLE_JOB_ENTRY = re.compile(
    r'SGH1:\{(["`])v\1:\d+,\1node\1:\1\*\1,\1class\1:\1([A-Za-z_]+)\1'
    r'(?:,\1(?!xid\1)[a-z_]+\1:(?:\1[^"`\\]*\1|-?\d+(?:\.\d+)?|true|false|null))*\}', re.IGNORECASE)

HARDWARE = frozenset(HARDWARE_CLASSES)
# How our encoder starts a job-level entry (``admin_comment.encode``: "v", then the entry's
# keys), and the same as sacctmgr stores it.
SIMPLE_HEAD = 'SGH1:{"v":1,"node":"*","class":"'
STORED_HEAD = SIMPLE_HEAD.lower().replace('"', STORED_QUOTE)


def has_entry(comment: str) -> bool:
    return TAGS[0] in comment or TAGS[1] in comment


def _entry_count(comment: str) -> int:
    return comment.count(TAGS[0]) + comment.count(TAGS[1])


def quick_cause(comment: str) -> Optional[str]:
    """The cause when ``comment`` holds one simple job-level entry of a Slurm class; None
    means: use ``classify``."""
    if _entry_count(comment) != 1:
        return None
    match = _SIMPLE_JOB_ENTRY.search(comment)
    if match is None:
        return None
    cause = match.group(2).upper()
    return None if cause in HARDWARE else cause


def _entries(comment: str) -> List[Dict[str, Any]]:
    """Our entries, in our encoder's form or sacctmgr's stored form (read as encoded; the
    class upper-cased) for as long as ``records.admin_comment.parse`` reads only the former."""
    if TAGS[1] in comment:
        comment = comment.replace(STORED_QUOTE, '"').replace(TAGS[1], TAGS[0])
    entries = admin_comment.parse(comment)
    for entry in entries:
        entry["class"] = str(entry.get("class")).upper()
    return entries


def state_word(state: str) -> str:
    return state.split(" ", 1)[0] if state else "UNKNOWN"


def _int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _culprit(entry: Dict[str, Any], nodes: Tuple[str, ...]) -> Optional[Culprit]:
    node = str(entry.get("node", ""))
    if node == "*" or not node:
        # A job-level entry may name the node; else only a one-node job says which node.
        named = entry.get("failed_node") or entry.get("nodes")
        if isinstance(named, str) and named and "[" not in named and "," not in named:
            node = named
        elif len(nodes) == 1:
            node = nodes[0]
        else:
            return None
    return Culprit(node=node, gpu=_int(entry.get("gpu")), xid=_int(entry.get("xid")))


def _application_entry(node_level: List[Dict[str, Any]], job_level: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """A node's application-class entry (GPU_OOM: that node read the job's output, which
    EpilogSlurmctld does not) when ``job_class`` lets it replace the job-level entry (FAILED)."""
    entries = [e for e in node_level if is_application(str(e.get("class")))]
    if not entries:
        return None
    cls = job_class(entries + job_level[-1:])
    return next((e for e in entries if str(e.get("class")) == cls), None)


def classify(state: str, comment: str, nodes: Tuple[str, ...] = ()) -> Verdict:
    """The verdict for one row: ``state`` is sacct's State, ``comment`` its AdminComment,
    ``nodes`` the job's nodes (to place a job-level hardware entry on a one-node job)."""
    entries = _entries(comment) if comment and has_entry(comment) else []
    if not entries:
        return Verdict(cause=state_word(state), source=SOURCE_ACCOUNTING)
    job_level = [e for e in entries if str(e.get("node")) == "*"]
    node_level = [e for e in entries if str(e.get("node")) != "*"]
    hardware_entries = [e for e in node_level if is_hardware(str(e.get("class")))]
    # One rule for a job's class, the epilog's (records.classify.job_class): the strongest
    # hardware class any node reports beats the job-level entry, which EpilogSlurmctld writes
    # without the node's evidence (a job that FAILED while its GPU fell off the bus is GPU_LOST).
    strongest = job_class(hardware_entries) if hardware_entries else None
    application = _application_entry(node_level, job_level) if strongest is None else None
    if strongest is not None and strongest != UNKNOWN:
        hardware_entries.sort(key=lambda e: str(e.get("class")) != strongest)
        decided = hardware_entries[0]
    elif application is not None:
        decided = application
    elif job_level:
        decided = job_level[-1]
    else:
        classes = {str(e.get("class")) for e in node_level}
        if len(classes) != 1:
            return Verdict(cause=state_word(state), source=SOURCE_ACCOUNTING)
        decided = node_level[0]
    cause = str(decided.get("class"))
    verdict = Verdict(cause=cause, source=SOURCE_HOOKS, hardware=is_hardware(cause),
                      check=str(decided.get("check", "") or ""))
    if verdict.hardware:
        behind = hardware_entries or [decided]
        verdict.culprits = [c for c in (_culprit(e, nodes) for e in behind) if c is not None]
    xids = []
    for entry in [decided] + hardware_entries:
        code = _int(entry.get("xid"))
        if code is not None and code not in xids:
            xids.append(code)
    verdict.xids = tuple(xids)
    return verdict
