"""imex.domain: the node's IMEX (multi-node NVLink memory export) works, where it matters.

Judged only where both hold: the node is in a multi-node NVLink domain (a GPU's fabric reports
a cluster UUID or a clique id, as on a GB200 NVL72 tray, or IMEX channels exist) and the site
says this tool owns IMEX (``[[nodes]] imex_owned = true``; off by default: an orchestrator or
the site's own checks may own it). A single HGX box (H100, B200) has no IMEX domain and never
gets an IMEX finding, whatever its IMEX daemon says (DCGM#308 and NVSentinel#1471 drained such
nodes for an IMEX that does not apply to them).
"""
from __future__ import annotations

from typing import List

from ..facts import in_nvlink_domain
from ..findings import Finding
from .base import CheckInput

READY = "READY"


def in_domain(inp: CheckInput) -> bool:
    """Whether the node is in a multi-node NVLink domain (its GPUs' fabric, or its IMEX channels)."""
    if any(in_nvlink_domain(gpu.fabric_cluster_uuid, gpu.fabric_clique_id) for gpu in inp.healthy_gpus()):
        return True
    return inp.imex is not None and bool(inp.imex.channels)


def imex_domain(inp: CheckInput) -> List[Finding]:
    imex = inp.imex
    if not inp.expected.get("imex_owned") or imex is None or not in_domain(inp):
        return []
    domain = sorted({(gpu.fabric_cluster_uuid, gpu.fabric_clique_id) for gpu in inp.healthy_gpus()
                     if in_nvlink_domain(gpu.fabric_cluster_uuid, gpu.fabric_clique_id)}, key=str)
    evidence = {"daemon": imex.daemon, "status": imex.status, "channels": list(imex.channels),
                "domain": [{"cluster_uuid": uuid, "clique_id": clique} for uuid, clique in domain]}
    if imex.status in ("timeout", "error"):
        found = inp.finding("imex.domain", "error", f"IMEX could not be asked: {imex.message}", evidence=evidence)
        found.action = "none"            # the tool could not look: never a drain
        return [found]
    problems = []
    if imex.status == "not_installed":
        problems.append("IMEX is not installed (no nvidia-imex-ctl)")
    elif imex.daemon != READY:
        problems.append(f"the IMEX daemon is {imex.daemon}, not READY")
    if not imex.channels:
        problems.append("no IMEX channel (/dev/nvidia-caps-imex-channels/channelN)")
    if not problems:
        return []
    return [inp.finding("imex.domain", "fail",
                        "node in a multi-node NVLink domain: " + "; ".join(problems)
                        + ": jobs cannot share GPU memory across the domain", evidence=evidence)]
