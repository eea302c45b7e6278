"""What Slurm says about drains: the nodes drained now (``sinfo --json``; from Slurm 23.02 on,
``scontrol --json show node``, one reason per node) and the drains that happened in the window
(``sacctmgr show event``, the node-state history slurmdbd keeps).

Parsing is pure (text in, plain data out); ``fetch_*`` run the commands through the Slurm
backend's binary lookup, environment and timeout. Our own reasons are recognised and read
back with ``healthcheck.drain_reason``.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from healthcheck.drain_reason import is_ours, parse_reason

# Reason last: it is free text and may hold the delimiter.
EVENT_FIELDS = ("NodeName", "TimeStart", "TimeEnd", "State", "User", "Reason")
EVENT_FORMAT = ",".join(EVENT_FIELDS)
_TAKEN_OUT = ("DRAIN", "FAIL")          # event states that take a node out of service on purpose


def _flags(node: Dict[str, Any]) -> List[str]:
    state = node.get("state")
    flags = list(state) if isinstance(state, list) else [str(state or "")]
    extra = node.get("state_flags")
    if isinstance(extra, list):
        flags += [str(flag) for flag in extra]
    return [flag.upper() for flag in flags if flag]


def _iso(epoch: Any) -> str:
    if isinstance(epoch, dict):                    # newer Slurm: {"set": true, "number": N}
        epoch = epoch.get("number")
    if not isinstance(epoch, (int, float)) or epoch <= 0:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def describe_reason(reason: str, prefix: str) -> Dict[str, Any]:
    """Whether a reason is ours and, if it is, what it says (check, subject, Xid)."""
    parsed = parse_reason(reason, prefix)
    if parsed is None:
        return {"ours": False}
    described: Dict[str, Any] = {"ours": True, "check": parsed.check, "subject": parsed.subject,
                                 "summary": parsed.summary}
    if parsed.keys:
        described["keys"] = dict(parsed.keys)
    if parsed.xid is not None:
        described["xid"] = parsed.xid
    return described


def _nodes_of_groups(groups: List[Any]) -> List[Dict[str, Any]]:
    """``sinfo --json`` from 23.02 on lists groups of nodes (per partition, state and reason):
    each node of a group, once, with the group's state and reason under the per-node keys."""
    nodes: Dict[str, Dict[str, Any]] = {}
    for group in groups:
        if not isinstance(group, dict):
            continue
        state = (group.get("node") or {}).get("state") if isinstance(group.get("node"), dict) else None
        reason = group.get("reason") if isinstance(group.get("reason"), dict) else {}
        names = (group.get("nodes") or {}).get("nodes") if isinstance(group.get("nodes"), dict) else None
        for name in names if isinstance(names, list) else []:
            nodes.setdefault(str(name), {"name": str(name), "state": state, "reason": reason.get("description"),
                                         "reason_set_by_user": reason.get("user"),
                                         "reason_changed_at": reason.get("time")})
    return list(nodes.values())


def drained_from_sinfo(document: Dict[str, Any], prefix: str) -> List[Dict[str, Any]]:
    """Drained (or draining, or failing) nodes, ours marked, from ``sinfo --json`` (22.05: a
    ``nodes`` list; 23.02 on: ``sinfo``, a list of node groups) or ``scontrol --json show node``
    (``nodes``)."""
    nodes = document.get("nodes") if isinstance(document, dict) else None
    if not isinstance(nodes, list) and isinstance(document, dict) and isinstance(document.get("sinfo"), list):
        nodes = _nodes_of_groups(document["sinfo"])
    if not isinstance(nodes, list):
        raise ValueError("sinfo --json: no \"nodes\" or \"sinfo\" list")
    drained = []
    for node in nodes:
        if not isinstance(node, dict):
            continue
        flags = _flags(node)
        if not any(flag.startswith("DRAIN") or flag == "FAIL" for flag in flags):
            continue
        reason = str(node.get("reason") or "")
        entry = {"node": str(node.get("name", "")), "state": "+".join(flags), "reason": reason,
                 "set_by": str(node.get("reason_set_by_user") or ""),
                 "since": _iso(node.get("reason_changed_at"))}
        entry.update(describe_reason(reason, prefix))
        drained.append(entry)
    drained.sort(key=lambda entry: entry["node"])
    return drained


def parse_events(lines: Iterable[str]) -> Iterator[Tuple[str, str, str, str]]:
    """(node, start, state, reason) of each node event in ``sacctmgr -P show event`` output
    with ``EVENT_FORMAT`` (header optional); cluster events (no node) are skipped."""
    for line in lines:
        line = line.rstrip("\r\n")
        if not line:
            continue
        parts = line.split("|")
        if len(parts) < len(EVENT_FIELDS) or tuple(parts[:len(EVENT_FIELDS)]) == EVENT_FIELDS:
            continue
        node, start, _end, state, _user = parts[:5]
        reason = "|".join(parts[5:])
        if node:
            yield node, start, state, reason


def drain_events(lines: Iterable[str], since: str, until: str, prefix: str) -> Iterator[Tuple[str, bool]]:
    """(node, ours) for every drain or fail that began in [since, until)."""
    for node, start, state, reason in parse_events(lines):
        if not any(word in state.upper() for word in _TAKEN_OUT):
            continue
        if (since and start < since) or (until and start >= until):
            continue
        yield node, is_ours(reason, prefix)


def fetch_sinfo(backend) -> Dict[str, Any]:
    """The nodes as Slurm shows them now: ``scontrol --json show node`` where the release has it
    (23.02 on: each node with its own reason), else ``sinfo --json`` (22.05)."""
    name, args = ("scontrol", ["--json", "show", "node"]) if backend.has_json() else ("sinfo", ["--json"])
    text = backend.run(name, args)
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"{name} {' '.join(args)} did not print JSON") from None


def fetch_events(backend, since: str, until: str) -> List[str]:
    text = backend.run("sacctmgr", ["-P", "-n", "show", "event", f"format={EVENT_FORMAT}",
                                    f"start={since}", f"end={until}"])
    return text.splitlines()


# A saved ``sinfo --json`` (about 3 KB a node) or a window's ``sacctmgr show event`` output (about
# 100 bytes an event) of a large cluster is a few MB; a FIFO, /dev/zero or a runaway file must not
# fill the summary's memory (issue 34: 7.9 GB in 10 s before this cap).
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


def read_document(path: str, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """A saved ``--sinfo-json`` or ``--events`` file's bytes, read with the bounded reader the
    config uses (``healthcheck.safeio.tomlio.read_bytes``): a regular file of at most ``limit``
    bytes. ``FileRefused`` (an OSError) for a FIFO, a device or a larger file, before more than
    ``limit`` bytes are read."""
    from healthcheck.safeio.tomlio import read_bytes

    return read_bytes(path, limit)


def parse_sinfo_document(raw: bytes, path: str) -> Dict[str, Any]:
    try:
        return json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        raise ValueError(f"{path}: not sinfo --json output") from None
