"""The InfiniBand / RoCE probe: ``<sysfs_root>/class/infiniband/<hca>/ports/<n>/...``.

Reads facts, judges nothing. sysfs is written only by the kernel, so following its own
links (``class/infiniband/mlx5_0`` is one) is safe. Reading a counter asks the HCA's
firmware (a PMA query), which can stall on a sick adapter: the runner calls this under a
deadline too.
"""
from __future__ import annotations

import errno
import os
from typing import Dict, Iterable, Optional, Tuple

from ..facts import IB_COUNTERS, IbFacts, IbPortFacts, parse_numbered, parse_rate



def probe_ib(sysfs_root: str, counters: Iterable[str] = IB_COUNTERS) -> IbFacts:
    facts = IbFacts(sysfs_root=sysfs_root)
    base = os.path.join(sysfs_root, "class", "infiniband")
    try:
        hcas = sorted(os.listdir(base))
    except FileNotFoundError:
        return facts        # no RDMA devices (or the driver is not loaded): no ports
    except OSError as exc:
        facts.status, facts.message = "error", f"{base}: {exc.strerror or exc}"
        return facts
    wanted = tuple(counters)
    for hca in hcas:
        ports_dir = os.path.join(base, hca, "ports")
        try:
            ports = sorted(int(p) for p in os.listdir(ports_dir) if p.isdigit())
        except OSError as exc:
            facts.ports.append(IbPortFacts(hca=hca, port=0, errors={"ports": exc.strerror or str(exc)}))
            continue
        numa = _read_int(os.path.join(base, hca, "device", "numa_node"))
        for number in ports:
            facts.ports.append(read_port(os.path.join(ports_dir, str(number)), hca, number, wanted, numa))
    return facts


def read_port(port_dir: str, hca: str, number: int, counters: Tuple[str, ...],
              numa_node: Optional[int] = None) -> IbPortFacts:
    port = IbPortFacts(hca=hca, port=number, numa_node=numa_node)

    def text(name: str) -> Optional[str]:
        try:
            return _read(os.path.join(port_dir, name))
        except OSError as exc:
            port.errors[name] = exc.strerror or str(exc)
            return None

    state = text("state")
    if state is not None:
        port.state, port.state_text = parse_numbered(state)
    phys = text("phys_state")
    if phys is not None:
        port.phys_state, port.phys_state_text = parse_numbered(phys)
    rate = text("rate")
    if rate is not None:
        port.rate_text, port.rate_gbps = rate, parse_rate(rate)
    port.link_layer = text("link_layer")
    for name in counters:
        port.counters[name] = _read_counter(os.path.join(port_dir, "counters", name))
    if port.link_layer == "Ethernet":
        port.gid_types = _read_gid_types(os.path.join(port_dir, "gid_attrs", "types"))
    return port


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read().strip()


def _read_int(path: str) -> Optional[int]:
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return None


def _read_counter(path: str) -> Optional[int]:
    try:
        value = _read(path)
    except OSError:
        return None
    try:
        return int(value)
    except ValueError:
        return None         # "N/A (no PMA)": the port has no performance-management agent


def _read_gid_types(types_dir: str) -> Dict[int, str]:
    out: Dict[int, str] = {}
    try:
        names = os.listdir(types_dir)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            out[int(name)] = _read(os.path.join(types_dir, name))
        except OSError as exc:
            # An index with no GID reads as EINVAL: it is simply empty.
            if exc.errno not in (errno.EINVAL, errno.ENOENT):
                out[int(name)] = f"unreadable: {exc.strerror or exc}"
    return out


def start_ib_probe(sysfs_root: str, timeout_s: float, counters: Iterable[str] = IB_COUNTERS):
    """``probe_ib`` in a child under a deadline; ``ib_facts(child)`` collects it."""
    from .deadline import ChildProbe

    wanted = tuple(counters)
    child = ChildProbe(lambda emit: emit(probe_ib(sysfs_root, wanted)), timeout_s)
    child.sysfs_root = sysfs_root
    return child.start()


def ib_facts(child) -> IbFacts:
    outcome = child.wait()
    if outcome.records:
        facts = outcome.records[0]
    elif outcome.timed_out:
        facts = IbFacts(status="timeout", message="no answer", sysfs_root=child.sysfs_root)
    else:
        facts = IbFacts(status="error", sysfs_root=child.sysfs_root,
                        message=outcome.error or "the probe process exited without an answer")
    facts.timeout_s = child.timeout_s
    return facts
