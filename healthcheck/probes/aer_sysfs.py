"""The PCIe AER probe: ``<sysfs_root>/bus/pci/devices/<address>/aer_dev_{fatal,nonfatal,correctable}``
for each GPU NVML named (by its PCI bus id).

Reads facts, judges nothing. The files are the kernel's in-memory AER statistics
(``pdev->aer_info``): reading one asks no hardware, so it runs in the caller, without the child
and deadline NVML and the IB counters need. sysfs is written only by the kernel, so following its
own links (``bus/pci/devices/<address>`` is one) is safe, as the IB probe does; the address comes
from NVML and must be a PCI address before it becomes a path component, and the file itself is
opened without following a link and read to a bound.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

from ..facts import AER_FILES, AER_KINDS, PcieAerDevice, PcieAerFacts, parse_aer, sysfs_pci_address

_MAX_BYTES = 16384     # sysfs shows at most a page; a bigger file is not the kernel's


def probe_aer(sysfs_root: str, bus_ids: Iterable[str]) -> PcieAerFacts:
    facts = PcieAerFacts()
    for bus_id in bus_ids:
        address = sysfs_pci_address(bus_id)
        if address is None:
            continue          # not a PCI address: nothing to read (and never a path)
        facts.devices[bus_id] = read_device(os.path.join(sysfs_root, "bus", "pci", "devices", address), address)
    return facts


def read_device(device_dir: str, address: str) -> PcieAerDevice:
    device = PcieAerDevice(address=address)
    for kind in AER_KINDS:
        path = os.path.join(device_dir, AER_FILES[kind])
        try:
            text = _read(path)
        except FileNotFoundError:
            device.totals[kind] = None      # no AER capability, or a kernel before 4.19
            continue
        except OSError as exc:
            device.totals[kind] = None
            device.errors[kind] = exc.strerror or str(exc)
            continue
        total, counts = parse_aer(text, kind)
        device.totals[kind] = total
        device.counts[kind] = counts
        if total is None:
            device.errors[kind] = f"{AER_FILES[kind]} has no total line"
    return device


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        data = os.read(fd, _MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_BYTES:
        raise OSError(0, f"longer than {_MAX_BYTES} bytes", path)
    return data.decode("utf-8", errors="replace")


def aer_for_gpus(sysfs_root: str, nvml) -> Optional[PcieAerFacts]:
    """The AER counters of the GPUs NVML answered for (None when NVML gave no GPUs)."""
    if nvml is None or nvml.status != "ok":
        return None
    return probe_aer(sysfs_root, [gpu.pci_bus_id for gpu in nvml.gpus if gpu.state == "ok" and gpu.pci_bus_id])
