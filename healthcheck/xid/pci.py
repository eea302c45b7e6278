"""PCI addresses as numbers, and which GPU (NVML index, UUID) an address belongs to.

The kernel writes ``0000:3b:00``, NVML ``00000000:3B:00.0``, sysfs ``0000:3b:00.0``: compare the
(domain, bus, device) integers, never the strings.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterable, Optional, Tuple

PciKey = Tuple[int, int, int]

_ADDRESS = re.compile(r"(?:PCI:)?(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?")


def pci_key(address: Any) -> Optional[PciKey]:
    """(domain, bus, device) from any of the three forms; None when it is not a PCI address."""
    if isinstance(address, bytes):
        address = address.decode("ascii", "replace")
    if not isinstance(address, str):
        return None
    match = _ADDRESS.fullmatch(address.strip())
    if not match:
        return None
    domain = int(match.group(1), 16) if match.group(1) else 0
    return domain, int(match.group(2), 16), int(match.group(3), 16)


def format_pci(key: PciKey) -> str:
    """The form this project reports: ``dddd:bb:dd``, lowercase (the kernel's own)."""
    return f"{key[0]:04x}:{key[1]:02x}:{key[2]:02x}"


def normalise_pci(address: Any) -> Optional[str]:
    key = pci_key(address)
    return format_pci(key) if key else None


def _field(gpu: Any, name: str) -> Any:
    return gpu.get(name) if isinstance(gpu, dict) else getattr(gpu, name, None)


class GpuMap:
    """PCI address -> (NVML index, UUID), from NVML facts and from the driver's companion lines
    (``NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-...``)."""

    def __init__(self, gpus: Iterable[Any] = (), uuids: Optional[Dict[str, str]] = None):
        self._by_pci: Dict[PciKey, Tuple[Optional[int], Optional[str], Optional[str]]] = {}
        self._by_uuid: Dict[str, Tuple[Optional[int], Optional[str]]] = {}
        self.learned: Dict[str, str] = {}
        for gpu in gpus or ():
            key = pci_key(_field(gpu, "pci_bus_id"))
            index, uuid = _field(gpu, "index"), _field(gpu, "uuid")
            if key is not None:
                self._by_pci[key] = (index, uuid, _field(gpu, "pci_bus_id"))
            if uuid:
                self._by_uuid[uuid.lower()] = (index, _field(gpu, "pci_bus_id"))
        for pci, uuid in (uuids or {}).items():
            self.learn(pci, uuid)

    def learn(self, pci: str, uuid: str) -> None:
        """A companion line: NVML's facts win where they disagree (the line may be from an old boot)."""
        key = pci_key(pci)
        if key is None or len(self.learned) >= 4096:
            return
        self.learned[format_pci(key)] = uuid
        if key not in self._by_pci:
            index, bus_id = self._by_uuid.get(uuid.lower(), (None, None))
            self._by_pci[key] = (index, uuid, bus_id)

    def lookup(self, pci: Optional[str]) -> Tuple[Optional[int], Optional[str], Optional[str]]:
        """(NVML index, UUID, NVML's pci_bus_id string) for an address; Nones when unknown."""
        key = pci_key(pci) if pci else None
        return self._by_pci.get(key, (None, None, None)) if key else (None, None, None)

    def annotate(self, event: Any) -> None:
        if event.kind == "sxid":       # an NVSwitch, not a GPU
            return
        index, uuid, _ = self.lookup(event.pci)
        if index is not None:
            event.gpu = index
        if uuid:
            event.uuid = uuid
