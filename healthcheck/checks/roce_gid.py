"""roce.gid: on RoCE, the GID index NCCL is told to use (NCCL_IB_GID_INDEX) must be RoCE v2;
a v1 or empty GID makes NCCL fail or fall back to a slow path."""
from __future__ import annotations

from typing import List

from ..findings import Finding
from .base import CheckInput


def roce_gid(inp: CheckInput) -> List[Finding]:
    index = inp.expected.get("roce_gid_index")
    if index is None or not inp.ib_ok():
        return []
    findings: List[Finding] = []
    for port in inp.ports_to_watch():
        if port.link_layer != "Ethernet":
            continue
        kind = port.gid_types.get(index)
        if kind == "RoCE v2":
            continue
        if kind is None:
            message = f"RoCE port {port.name} has no GID at index {index} (no IP address on its interface?)"
        else:
            message = f"RoCE port {port.name}: GID index {index} is {kind}, NCCL needs RoCE v2"
        findings.append(inp.finding("roce.gid", "fail", message, port=port,
                                    evidence={"gid_index": index, "gid_type": kind,
                                              "roce_v2_indices": sorted(i for i, t in port.gid_types.items()
                                                                        if t == "RoCE v2")}))
    return findings
