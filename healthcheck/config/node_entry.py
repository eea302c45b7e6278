"""A ``[[nodes]]`` entry from what the probes saw on a node (``slurm-gpu genconf``), and how
Slurm's Gres for the node compares with it. Pure: facts in, data out.

The entry describes the node as it runs now, so it is only as good as the node it was taken
on: take it on a node known to be healthy. Where GPUs or ports differ, it keeps the best one
(the most NVLinks, the highest power limit, the widest link), so a reference node with one
weak GPU or port gives an entry that the check of that node fails, instead of one that
blesses the fault.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from ..facts import IbFacts, NvmlFacts

# The keys taken from the hardware, in NODE_SCHEMA's order. The other keys are the admin's
# choices, not facts a probe can see: match (which nodes), nvml_required (what a future
# driver must keep reporting), nccl_env (whether the TaskProlog exports NCCL variables),
# imex_owned (whether this tool judges the node's IMEX domain).
PROBED_KEYS = ("gpus", "gpu_model", "nvlinks_per_gpu", "nvswitch_fabric", "ib_ports", "ib_rate_gbps",
               "ib_link_layer", "roce_gid_index", "power_limit_w", "pcie_gen", "pcie_width")

# What the probes must read for it (run_checks extra_reads).
READS = ("nvml:power", "nvml:pcie", "nvml:nvlink", "nvml:fabric", "ib")

_ACTIVE = 4                   # an IB port's state: 4 ACTIVE
_GPU_IDLE = 0x1               # nvmlClocksEventReasonGpuIdle: an idle GPU lowers its PCIe generation
_FABRIC_PRESENT = (1, 2, 3)   # not started, in progress, completed: the GPU has a fabric to join
_ROCE_V2 = "RoCE v2"


def node_entry(match: str, nvml: NvmlFacts, ib: IbFacts) -> Tuple[Dict[str, Any], List[str]]:
    """(the entry, notes for the admin): ``match`` first, then ``PROBED_KEYS`` that the node
    has a value for. ``nvml`` and ``ib`` must be probes that answered (status "ok")."""
    notes: List[str] = []
    found = {**_gpu_keys(nvml, notes), **_ib_keys(ib, notes)}
    return {"match": match, **{key: found[key] for key in PROBED_KEYS if key in found}}, notes


def _gpu_keys(nvml: NvmlFacts, notes: List[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"gpus": nvml.device_count or 0}
    answered = [gpu for gpu in nvml.gpus if gpu.state == "ok"]
    silent = [f"GPU {gpu.index} ({gpu.state})" for gpu in nvml.gpus if gpu.state != "ok"]
    if silent:
        notes.append(f"{', '.join(silent)} did not answer: the other GPUs describe the node")
    names = sorted({gpu.name for gpu in answered if gpu.name})
    if len(names) == 1:
        out["gpu_model"] = names[0]
    elif names:
        notes.append(f"GPUs of several models ({', '.join(names)}): gpu_model left out")
    if not answered:
        return out
    # No NVLink reported, or every link present but down (PCIe cards without a bridge): 0.
    out["nvlinks_per_gpu"] = max(sum(1 for up in (gpu.nvlink_states or {}).values() if up) for gpu in answered)
    out["nvswitch_fabric"] = any(gpu.fabric_state in _FABRIC_PRESENT for gpu in answered)
    if not out["nvswitch_fabric"] and any("fabric" in gpu.driver_missing for gpu in answered):
        notes.append("this driver cannot report the NVSwitch fabric: nvswitch_fabric = false may be wrong")
    limits = [gpu.power_limit_w for gpu in answered if gpu.power_limit_w is not None]
    if limits:
        out["power_limit_w"] = max(limits)
    # An idle GPU's generation is not the one its link trained at: judge the busy ones, and
    # when all are idle, the link's maximum (what gpu.pcie expects when nothing is set).
    busy = [gpu for gpu in answered if gpu.clock_event_reasons is not None
            and not gpu.clock_event_reasons & _GPU_IDLE]
    gens = [gpu.pcie.get("gen") for gpu in busy] or [gpu.pcie.get("gen_max") for gpu in answered]
    widths = [gpu.pcie.get("width") for gpu in answered]
    if any(gens):
        out["pcie_gen"] = max(g for g in gens if g)
    if any(widths):
        out["pcie_width"] = max(w for w in widths if w)
    return out


def _ib_keys(ib: IbFacts, notes: List[str]) -> Dict[str, Any]:
    """The ACTIVE ports of the link layer most ports have (a down port is often an unused one;
    a management NIC of the other layer is not a rail); the others are named in a note."""
    active = [port for port in ib.ports if port.state == _ACTIVE and port.link_layer]
    down = [port.name for port in ib.ports if port not in active]
    if down:
        notes.append(f"not ACTIVE, left out of ib_ports: {', '.join(down)}")
    if not active:
        return {"ib_ports": []}
    layers = sorted({port.link_layer for port in active},
                    key=lambda layer: (-sum(p.link_layer == layer for p in active), layer != "InfiniBand"))
    chosen = [port for port in active if port.link_layer == layers[0]]
    others = [f"{port.name} ({port.link_layer})" for port in active if port not in chosen]
    if others:
        notes.append(f"another link layer, left out of ib_ports: {', '.join(others)}")
    out: Dict[str, Any] = {"ib_ports": [port.name for port in chosen]}
    rates = [port.rate_gbps for port in chosen if port.rate_gbps is not None]
    if rates:
        out["ib_rate_gbps"] = max(rates)
    out["ib_link_layer"] = layers[0]
    if layers[0] == "Ethernet":
        index = _roce_gid_index(chosen, notes)
        if index is not None:
            out["roce_gid_index"] = index
    return out


def _roce_gid_index(ports, notes: List[str]) -> Optional[int]:
    """The last RoCE v2 GID index every port has: the link-local GIDs come first, so this is
    one of an address the interface was given (NCCL_IB_GID_INDEX must name such a one)."""
    shared = set.intersection(*({i for i, kind in port.gid_types.items() if kind == _ROCE_V2} for port in ports))
    if not shared:
        notes.append("no RoCE v2 GID index shared by every port: roce_gid_index left out")
        return None
    if len(shared) > 1:
        notes.append(f"RoCE v2 GID indices on every port: {', '.join(map(str, sorted(shared)))}; "
                     "roce_gid_index must be the one NCCL_IB_GID_INDEX names")
    return max(shared)


def gres_problems(gres: Dict[str, int], gres_text: str, nvml: NvmlFacts) -> List[str]:
    """How Slurm's Gres (``gpu_gres`` of ``gres_text``) disagrees with the GPUs NVML sees: the
    count, and each GPU type that names none of them (compared as Slurm's AutoDetect spells
    types: lower case, words joined by "_", so "h100" matches "NVIDIA H100 80GB HBM3")."""
    problems = []
    promised, seen = sum(gres.values()), nvml.device_count or 0
    if promised != seen:
        problems.append(f"Slurm's Gres={gres_text or '(none)'} promises {promised} GPU{'s' * (promised != 1)}, "
                        f"NVML sees {seen}")
    names = sorted({gpu.name for gpu in nvml.gpus if gpu.name})
    for gpu_type in sorted(t for t in gres if t):
        if not any(_words(gpu_type) in _words(name) for name in names):
            problems.append(f"Slurm's GPU type {gpu_type!r} names none of the GPUs NVML sees ({', '.join(names)})")
    return problems


def _words(text: str) -> str:
    return "_" + re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") + "_"
