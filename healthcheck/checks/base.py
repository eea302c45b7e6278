"""What every check receives and the helpers they share. Checks are pure: a ``CheckInput``
in, a list of findings out; no I/O, no clock, no config file."""
from __future__ import annotations

from ..plain import field, plain
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence

from ..facts import DcgmFacts, GpuFacts, IbBandwidthFacts, IbFacts, IbPortFacts, ImexFacts, KernelLogFacts, NvmlFacts
from ..facts import PcieAerFacts
from ..findings import Finding, action_for


@plain
class CheckInput:
    node: str
    expected: Mapping[str, Any] = field(default_factory=dict)      # the node's [[nodes]] entry
    thresholds: Mapping[str, float] = field(default_factory=dict)  # [thresholds]
    actions: Mapping[str, str] = field(default_factory=dict)       # [actions]
    nvml: Optional[NvmlFacts] = None
    ib: Optional[IbFacts] = None
    dcgm: Optional[DcgmFacts] = None
    kernel: Optional[KernelLogFacts] = None
    history: Mapping[str, Sequence[Sequence[float]]] = field(default_factory=dict)
    now: float = 0.0                       # unix time of this run (for counter growth)
    gpus: Optional[FrozenSet[int]] = None  # the job's GPUs (NVML indices); None: all
    tier: str = "health"
    ib_bandwidth: Optional[IbBandwidthFacts] = None
    aer: Optional[PcieAerFacts] = None      # the GPUs' PCIe AER counters (sysfs)
    imex: Optional[ImexFacts] = None       # read only where [[nodes]] imex_owned is true

    def threshold(self, name: str) -> float:
        try:
            return float(self.thresholds[name])
        except KeyError:
            raise KeyError(f"threshold {name!r} is not configured ([thresholds] in defaults.toml)") from None

    def action(self, check: str) -> str:
        return action_for(self.actions, check)

    def finding(self, check: str, status: str, message: str, *, gpu: Optional[GpuFacts] = None,
                gpu_index: Optional[int] = None, port: Optional[IbPortFacts] = None,
                hca: Optional[str] = None, port_number: Optional[int] = None,
                evidence: Optional[Dict[str, Any]] = None) -> Finding:
        out = Finding(check=check, status=status, action="none" if status == "ok" else self.action(check),
                      message=message, evidence=dict(evidence or {}))
        if gpu is not None:
            out.gpu, out.uuid, out.pci_bus_id = gpu.index, gpu.uuid, gpu.pci_bus_id
        elif gpu_index is not None:
            out.gpu = gpu_index
        if port is not None:
            out.hca, out.port = port.hca, port.port
        elif hca is not None:
            out.hca, out.port = hca, port_number
        return out

    # -- which facts to judge ---------------------------------------------------------------
    def nvml_ok(self) -> bool:
        return self.nvml is not None and self.nvml.status == "ok"

    def in_scope(self, index: int) -> bool:
        return self.gpus is None or index in self.gpus

    def gpus_in_scope(self) -> List[GpuFacts]:
        """Every GPU NVML enumerated that this run judges, whatever its state."""
        if not self.nvml_ok():
            return []
        return [gpu for gpu in self.nvml.gpus if self.in_scope(gpu.index)]

    def healthy_gpus(self) -> List[GpuFacts]:
        """GPUs in scope that answered: the ones whose facts mean something."""
        return [gpu for gpu in self.gpus_in_scope() if gpu.state == "ok"]

    def ib_ok(self) -> bool:
        return self.ib is not None and self.ib.status == "ok"

    def expected_ports(self) -> Optional[List[tuple]]:
        """[(hca, port)] from ``ib_ports``; None when the node has no such expectation."""
        ports = self.expected.get("ib_ports")
        if ports is None:
            return None
        out = []
        for text in ports:
            hca, _, number = str(text).partition(":")
            out.append((hca, int(number or 1)))
        return out

    def ports_to_watch(self) -> List[IbPortFacts]:
        """The expected ports that exist, or every port found when nothing is expected."""
        if not self.ib_ok():
            return []
        expected = self.expected_ports()
        if expected is None:
            return list(self.ib.ports)
        return [p for p in (self.ib.port(h, n) for h, n in expected) if p is not None]


def gpu_key(gpu: GpuFacts) -> str:
    """A GPU's name in the counter history: its UUID (indices move when a GPU drops out)."""
    return f"gpu/{gpu.uuid or 'index-' + str(gpu.index)}"


def plural(count: int, word: str, suffix: str = "s") -> str:
    return f"{count} {word}" + ("" if count == 1 else suffix)


def join_numbers(values: Sequence[Any]) -> str:
    return ", ".join(str(v) for v in values)
