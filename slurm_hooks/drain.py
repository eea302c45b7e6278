"""The prolog's and epilog's drain: the strongest hardware cause becomes our drain reason
(``healthcheck.drain_reason``, the health check's format), set with ``scontrol``.

A node someone else drained keeps their reason; a node we already drained for the same cause
is not drained again. A failing Slurm command is one loud line, never an exception: the hook
carries on (the prolog still exits non-zero, so the job does not start on the bad hardware).
"""
from __future__ import annotations

import sys
from typing import Any, Dict, Iterable, List, Optional

from healthcheck.drain_reason import DrainReason, format_reason, is_ours, parse_reason
from healthcheck.findings import Finding


def _subject(item: Dict[str, Any]) -> str:
    if item.get("gpu") is not None:
        return f"gpu{item['gpu']}"
    if item.get("port"):
        return str(item["port"])
    return "node"


def reason_for(item: Dict[str, Any]) -> DrainReason:
    """Our drain reason for one evidence item (a failing finding or a kernel-log event)."""
    if item.get("kind") == "xid":
        code = item.get("code")
        check = "kernel.sxid" if item.get("event") == "sxid" else "kernel.xid"
        what = f" ({item['mnemonic']})" if item.get("mnemonic") else ""
        where = f"GPU {item['gpu']}" if item.get("gpu") is not None else "the node"
        return DrainReason(check=check, subject=_subject(item), keys={"xid": str(code)},
                           summary=f"Xid {code}{what} on {where} during a job")
    keys = {"xid": str(item["xid"])} if item.get("xid") is not None else {}
    return DrainReason(check=str(item.get("check")), subject=_subject(item), keys=keys,
                       summary=str(item.get("message", "")))


def drain_cause(config, items: Iterable[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The item to drain for: the strongest hardware cause among items whose action is drain."""
    from healthcheck.records.classify import hardware_cause

    xid_action = config.action("kernel.xid")
    draining = [item for item in items
                if (item.get("kind") == "finding" and item.get("action") == "drain")
                or (item.get("kind") == "xid" and xid_action == "drain")]
    found = hardware_cause(draining)
    return found[1] if found else None


def drain_for(config, backend, node: str, findings: List[Finding], events: List[Dict[str, Any]]) -> Optional[str]:
    from .evidence import finding_evidence
    from .slurm.backend import SlurmError

    cause = drain_cause(config, [finding_evidence(f) for f in findings] + list(events))
    if cause is None:
        return None
    drain = config.section("drain")
    prefix = drain["reason_prefix"]
    wanted = reason_for(cause)
    text = format_reason(wanted, prefix, int(drain["max_reason_len"]))
    try:
        current = backend.node(node)
        if current.drained and not is_ours(current.reason, prefix):
            print(f"slurm-gpu: {node} is drained by someone else ({current.reason!r}); not replacing it "
                  f"with: {text}", file=sys.stderr)
            return text
        existing = parse_reason(current.reason, prefix) if current.drained else None
        if existing is not None and existing.cause == wanted.cause:
            return text
        backend.drain(node, text)
    except SlurmError as exc:
        print(f"slurm-gpu: cannot drain {node} ({text}): {exc}", file=sys.stderr)
        return None
    return text
