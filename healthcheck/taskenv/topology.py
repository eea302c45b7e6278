"""Where a node's GPUs and HCAs sit: PCI paths and NUMA nodes read from sysfs and the NVIDIA
driver's /proc files, for choosing the HCAs closest to a task's GPUs (the TaskProlog).

Everything read here is readable by any user (the TaskProlog runs as the job's user) and is
read without a subprocess or NVML, so a task start costs a few small file reads:

* ``<proc>/driver/nvidia/gpus/<pci address>/information``: ``Device Minor: N`` (N of
  /dev/nvidiaN, the index Slurm's GRES gives) for each GPU the driver knows.
* ``<sys>/bus/pci/devices/<pci address>``: a link into ``<sys>/devices/pci<domain>:<bus>/...``;
  the directories on the way are the PCIe bridges and switches above the device, and two
  devices under the same switch share more of that path. ``numa_node`` beside it (-1: unknown).
* ``<sys>/class/infiniband/<hca>/device``: the same link for an HCA; ``device/net/<netdev>``
  its network interfaces, each with ``operstate``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

INFO_CAP = 4096      # an information file is ~400 bytes


@dataclass
class PciPlace:
    address: str = ""
    path: Tuple[str, ...] = ()     # components under <sys>/devices, ending with the device
    numa_node: Optional[int] = None


@dataclass
class GpuPlace:
    minor: int
    place: PciPlace


@dataclass
class HcaPlace:
    hca: str
    place: PciPlace
    netdevs: Dict[str, str] = field(default_factory=dict)    # interface -> operstate


def _read(path: str, cap: int = INFO_CAP) -> Optional[str]:
    try:
        with open(path, "rb") as handle:
            return handle.read(cap).decode("utf-8", "replace")
    except OSError:
        return None


def _names(directory: str) -> List[str]:
    """The entries of ``directory``, sorted; none where it cannot be listed (no such driver, no HCA)."""
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def _numa(device_dir: str) -> Optional[int]:
    text = (_read(os.path.join(device_dir, "numa_node"), 64) or "").strip()
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None


def pci_place(sysfs_root: str, device_dir: str) -> PciPlace:
    """Where ``device_dir`` (a link to a PCI device under ``<sys>/devices``) sits."""
    devices = os.path.realpath(os.path.join(sysfs_root, "devices"))
    real = os.path.realpath(device_dir)
    path: Tuple[str, ...] = ()
    if real.startswith(devices + os.sep):
        path = tuple(part for part in real[len(devices) + 1:].split(os.sep) if part)
    return PciPlace(address=os.path.basename(real), path=path, numa_node=_numa(real))


def parse_minor(text: str) -> Optional[int]:
    """``Device Minor:`` from the driver's information file."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "Device Minor":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


def gpu_places(sysfs_root: str, proc_root: str) -> Dict[int, GpuPlace]:
    """Every GPU the driver lists, by device minor number."""
    base = os.path.join(proc_root, "driver", "nvidia", "gpus")
    out: Dict[int, GpuPlace] = {}
    for address in _names(base):
        minor = parse_minor(_read(os.path.join(base, address, "information")) or "")
        if minor is None:
            continue
        place = pci_place(sysfs_root, os.path.join(sysfs_root, "bus", "pci", "devices", address.lower()))
        place.address = place.address or address
        out[minor] = GpuPlace(minor=minor, place=place)
    return out


def hca_places(sysfs_root: str) -> Dict[str, HcaPlace]:
    base = os.path.join(sysfs_root, "class", "infiniband")
    out: Dict[str, HcaPlace] = {}
    for hca in _names(base):
        device = os.path.join(base, hca, "device")
        netdevs = {name: (_read(os.path.join(device, "net", name, "operstate"), 64) or "").strip()
                   for name in _names(os.path.join(device, "net"))}
        out[hca] = HcaPlace(hca=hca, place=pci_place(sysfs_root, device), netdevs=netdevs)
    return out


def shared_depth(a: PciPlace, b: PciPlace) -> int:
    """How many PCI path components two devices share (0: different root complexes)."""
    depth = 0
    for left, right in zip(a.path[:-1], b.path[:-1]):
        if left != right:
            break
        depth += 1
    return depth


def closeness(gpu: PciPlace, hca: PciPlace) -> Tuple[int, int]:
    """Bigger is closer: the shared PCI path first (same switch beats same root complex),
    then the same NUMA node."""
    same_numa = int(gpu.numa_node is not None and gpu.numa_node == hca.numa_node)
    return shared_depth(gpu, hca), same_numa


def closest(gpu: PciPlace, hcas: List[HcaPlace]) -> List[HcaPlace]:
    """The HCAs closest to ``gpu`` (ties: all of them)."""
    if not hcas:
        return []
    best = max(closeness(gpu, h.place) for h in hcas)
    return [h for h in hcas if closeness(gpu, h.place) == best]
