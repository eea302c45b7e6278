"""What probes hand to checks: plain data, no behaviour, picklable across the probe's child
(and sysfs's spelling of an IB port's state and rate, parsed alike by the probe and the simulator).

Every value a probe could not read is ``None``: ``unsupported`` says which features the
hardware does not have (NVML answered NotSupported: no alarm), ``errors`` which reads failed
for another reason (what NVML or the kernel said, verbatim).
"""
from __future__ import annotations

import re

from .plain import field, plain
from typing import Any, Dict, List, Optional, Tuple

# What a check (CheckSpec.needs "nvml:<group>") or a caller (run_checks extra_reads) can ask
# the NVML probe to read, beyond every GPU's identity (name, UUID, PCI bus id, minor number).
NVML_READ_GROUPS = {
    "ecc": "ECC mode and the volatile/aggregate corrected/uncorrected error counters",
    "remap": "remapped rows: correctable, uncorrectable, pending, failure",
    "retired_pages": "whether a retired page waits for a reboot (pre-Ampere)",
    "thermal": "temperature and its slowdown threshold",
    "power": "power draw and the enforced power limit",
    "clocks": "clock event (throttle) reasons",
    "pcie": "PCIe link generation and width, current and maximum (and clock event reasons)",
    "nvlink": "each NVLink's state",
    "nvlink_errors": "each NVLink's state and its data-link error counters",
    "fabric": "NVSwitch fabric registration state",
    "processes": "compute processes holding GPU memory",
    "recovery": "the driver's GPU recovery action (field value 230, driver R570+)",
    "c2c": "each NVLink-C2C link's status, GPU to CPU (field values 170-171, driver R525+)",
}

# The names a GpuFacts lists in ``unsupported`` when NVML answers NotSupported for a read
# (a simulated GPU's ``not_supported`` takes the same names).
NVML_UNSUPPORTED_NAMES = ("ecc", "remapped_rows", "retired_pages", "nvlink", "fabric", "power",
                          "temperature", "clock_event_reasons", "pcie", "processes", "recovery_action",
                          "fabric_health", "mig", "c2c")

# NVLink data-link error counters, named as in pynvml's NVML_NVLINK_ERROR_DL_* constants.
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")

# InfiniBand port counters (files under ports/<n>/counters/) the counter check watches.
IB_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
               "local_link_integrity_errors", "excessive_buffer_overrun_errors")

# Their width in bits (kernel drivers/infiniband/core/sysfs.c, the PMA PortCounters fields):
# each stops at its maximum, 2**bits - 1, until cleared. Other counters are 64-bit.
IB_COUNTER_BITS = {"symbol_error": 16, "port_rcv_errors": 16, "link_downed": 8, "link_error_recovery": 8,
                   "local_link_integrity_errors": 4, "excessive_buffer_overrun_errors": 4}

# The facts an NVML probe can lose to an old driver (healthcheck/data/nvml-functions.tsv) and
# that [[nodes]] nvml_required can demand.
NVML_DRIVER_FACTS = ("fabric", "clock_event_reasons", "processes", "fabric_health")

# NVML's GPU recovery action (nvml.h): the field id, read with nvmlDeviceGetFieldValues (pynvml
# names it NVML_FI_DEV_GET_GPU_RECOVERY_ACTION from nvidia-ml-py 13; older bindings lack the
# constant, the driver's ABI value is this), and its values (NVML_GPU_RECOVERY_ACTION_*), by
# value, as the simulator's gpu.N.recovery_action spells them. Which branch knows the field:
# healthcheck/data/nvml-fields.tsv; what each value makes us do: xid-action-map.tsv "recovery".
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
# NVLink-C2C's field ids (nvml.h, driver R525+): the GPU's C2C link count, and one link's status
# (the field value's scopeId names the link; 0 inactive, 1 active).
NVML_FI_DEV_C2C_LINK_COUNT, NVML_FI_DEV_C2C_LINK_GET_STATUS = 170, 171
GPU_RECOVERY_ACTIONS = {0: "none", 1: "reset", 2: "reboot", 3: "drain_p2p", 4: "drain_and_reset",
                        5: "recover_imex_domain", 6: "bus_reset", 7: "system_reboot"}

# NVML's fabric states (NVML_GPU_FABRIC_STATE_*), by value.
FABRIC_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}

# -- fabric health (nvmlGpuFabricInfo_v3: healthSummary, healthMask; driver R570+) -----------------
# NVML_GPU_FABRIC_HEALTH_SUMMARY_*, by value.
FABRIC_HEALTH_SUMMARIES = {0: "not supported", 1: "healthy", 2: "unhealthy", 3: "limited capacity"}
# The healthMask's fields (pynvml's NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_<NAME> and _WIDTH_<NAME>):
# name -> (shift, width mask). The 2-bit fields read 0 not supported, 1 true, 2 false.
FABRIC_HEALTH_MASK_FIELDS = {
    "degraded_bw": (0, 0x3),
    "route_recovery": (2, 0x3),
    "route_unhealthy": (4, 0x3),
    "access_timeout_recovery": (6, 0x3),
    "incorrect_configuration": (8, 0xF),
    "partition_assigned": (12, 0x3),
    "gfm_state": (14, 0x3),
}
FABRIC_HEALTH_MASK_TRUE = 1          # NVML_GPU_FABRIC_HEALTH_MASK_<NAME>_TRUE of the 2-bit fields
# NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_*, by value (0 not supported, 1 none).
FABRIC_INCORRECT_CONFIGURATIONS = {0: "not supported", 1: "none", 2: "incorrect sysguid",
                                   3: "incorrect chassis serial number", 4: "no partition",
                                   5: "insufficient NVLinks", 6: "incompatible GPU firmware",
                                   7: "invalid location", 8: "GPU state invalid"}


def fabric_health_fields(mask: int) -> Dict[str, int]:
    """The healthMask's fields, by name (FABRIC_HEALTH_MASK_FIELDS)."""
    return {name: (mask >> shift) & width for name, (shift, width) in FABRIC_HEALTH_MASK_FIELDS.items()}


def in_nvlink_domain(cluster_uuid: Optional[str], clique_id: Optional[int]) -> bool:
    """Whether a GPU's fabric says it is in a multi-node NVLink domain (GB200 NVL72: a cluster
    UUID and a clique id from the fabric manager); a single HGX box reports zeros."""
    uuid_set = bool(cluster_uuid) and any(ch not in "0-" for ch in str(cluster_uuid))
    return uuid_set or bool(clique_id)


@plain
class GpuFacts:
    index: int
    uuid: Optional[str] = None
    pci_bus_id: Optional[str] = None           # NVML's form: 00000000:18:00.0
    minor_number: Optional[int] = None         # N of /dev/nvidiaN: how Slurm's GRES index maps to NVML
    name: Optional[str] = None
    # ok | lost (NVML says GPU is lost) | hang (did not answer in time) | error (see ``error``)
    state: str = "ok"
    error: Optional[str] = None
    unsupported: List[str] = field(default_factory=list)
    errors: Dict[str, str] = field(default_factory=dict)
    ecc_mode: Optional[List[int]] = None        # [current, pending], 1 enabled
    ecc: Dict[str, Optional[int]] = field(default_factory=dict)   # volatile_corrected, ...
    remapped_rows: Optional[Dict[str, int]] = None   # correctable, uncorrectable, pending, failure
    retired_pages_pending: Optional[bool] = None
    temperature_c: Optional[float] = None
    temperature_slowdown_c: Optional[float] = None
    power_w: Optional[float] = None
    power_limit_w: Optional[float] = None
    clock_event_reasons: Optional[int] = None
    pcie: Dict[str, Optional[int]] = field(default_factory=dict)  # gen, gen_max, width, width_max
    nvlink_states: Optional[Dict[int, int]] = None   # link -> 1 active / 0 inactive; None: no NVLink
    nvlink_errors: Dict[int, Dict[str, int]] = field(default_factory=dict)
    fabric_state: Optional[int] = None           # None: the GPU has no fabric to join
    fabric_status: Optional[int] = None          # an NVML return code once state is completed
    processes: Optional[List[Dict[str, Any]]] = None   # pid, used_memory_mib (None: unknown)
    recovery_action: Optional[int] = None        # NVML_GPU_RECOVERY_ACTION_* (None: not known)
    # NVLink-C2C, the GPU's links to its CPU (Grace): link -> 1 active / 0 inactive (None: not
    # known; {}: the GPU has none). Field values NVML_FI_DEV_C2C_LINK_COUNT / _GET_STATUS (R525+).
    c2c_links: Optional[Dict[int, int]] = None
    # Facts this driver cannot give (its libnvidia-ml lacks every call for them; pynvml said
    # FunctionNotFound or NVMLLibraryMismatchError): fact -> what was missing. Such a fact is
    # also in ``unsupported``; it fails nothing unless [[nodes]] nvml_required names it.
    driver_missing: Dict[str, str] = field(default_factory=dict)
    # -- the multi-node NVLink fabric (GB200 NVL72 and later; see FABRIC_HEALTH_* below) --
    fabric_cluster_uuid: Optional[str] = None    # the NVLink domain's cluster UUID (all zeros: none)
    fabric_clique_id: Optional[int] = None       # the GPU's clique in it (0: none)
    fabric_health_summary: Optional[int] = None  # NVML_GPU_FABRIC_HEALTH_SUMMARY_* (fabric info v3, R570+)
    fabric_health_mask: Optional[int] = None     # NVML_GPU_FABRIC_HEALTH_MASK_* fields, packed
    # -- MIG (read with the identity: the prolog maps a job's MIG devices to their parent GPU) --
    mig_mode: Optional[int] = None               # current MIG mode, 1 enabled / 0 disabled (None: unknown)
    # The GPU's MIG devices when MIG is on, as NVML enumerates them (None: not read or MIG off):
    # each {"index", "uuid", "gpu_instance", "compute_instance", "parent_uuid"}; parent_uuid is
    # what NVML says the MIG handle's parent is (nvmlDeviceGetDeviceHandleFromMigDeviceHandle),
    # never parsed from the MIG UUID (R470+ MIG UUIDs are opaque: MIG-<uuid>).
    mig_devices: Optional[List[Dict[str, Any]]] = None

    def subject(self) -> str:
        where = f" ({self.pci_bus_id})" if self.pci_bus_id else ""
        return f"GPU {self.index}{where}"


@plain
class NvmlFacts:
    # ok | library_not_found | driver_not_loaded | init_error | timeout | crashed
    status: str = "ok"
    message: str = ""
    driver_version: Optional[str] = None
    device_count: Optional[int] = None
    gpus: List[GpuFacts] = field(default_factory=list)
    timeout_s: Optional[float] = None
    elapsed_s: Optional[float] = None
    last_answer_s: Optional[float] = None   # after the probe's start, the slowest GPU that answered


@plain
class IbPortFacts:
    hca: str
    port: int
    state: Optional[int] = None                  # 4 ACTIVE (1 DOWN, 2 INIT, 3 ARMED)
    state_text: str = ""
    phys_state: Optional[int] = None             # 5 LinkUp (2 Polling, 3 Disabled)
    phys_state_text: str = ""
    rate_gbps: Optional[float] = None
    rate_text: str = ""
    link_layer: Optional[str] = None             # InfiniBand | Ethernet
    counters: Dict[str, Optional[int]] = field(default_factory=dict)   # None: "N/A (no PMA)"
    gid_types: Dict[int, str] = field(default_factory=dict)            # RoCE: index -> "RoCE v2"
    numa_node: Optional[int] = None
    errors: Dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.hca}:{self.port}"


# sysfs's spelling of a port's state and rate: read by the IB probe, written by the simulator.
_NUMBERED = re.compile(r"\s*(\d{1,9})\s*:\s*(.*)")     # 9 digits: more is no sysfs state
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def parse_numbered(text: str) -> Tuple[Optional[int], str]:
    """``4: ACTIVE`` -> (4, "ACTIVE"); anything else keeps its text."""
    match = _NUMBERED.fullmatch(text.strip())
    if not match:
        return None, text.strip()
    return int(match.group(1)), match.group(2).strip()


def parse_rate(text: str) -> Optional[float]:
    """``400 Gb/sec (4X NDR)`` -> 400.0."""
    match = _RATE.match(text)
    return float(match.group(1)) if match else None


@plain
class IbFacts:
    status: str = "ok"                           # ok | timeout | error
    message: str = ""
    sysfs_root: str = "/sys"
    ports: List[IbPortFacts] = field(default_factory=list)
    timeout_s: Optional[float] = None

    def port(self, hca: str, port: int) -> Optional[IbPortFacts]:
        for entry in self.ports:
            if entry.hca == hca and entry.port == port:
                return entry
        return None


@plain
class DcgmTestResult:
    category: str
    test: str
    status: str                                  # pass | fail | skip | other (lower-cased)
    gpus: List[int] = field(default_factory=list)   # empty: the whole node
    warnings: List[str] = field(default_factory=list)
    error_ids: List[int] = field(default_factory=list)   # DCGM's dcgmError_t of each warning (4.x)


@plain
class DcgmFacts:
    # ok | not_installed | timeout | error (dcgmi failed or printed nothing we understand)
    # | skipped (every GPU it would run on is in MIG mode: dcgmi diag does not run there)
    status: str = "ok"
    message: str = ""
    level: Optional[int] = None
    version: Optional[str] = None
    results: List[DcgmTestResult] = field(default_factory=list)
    exit_code: Optional[int] = None
    timeout_s: Optional[float] = None
    skipped_gpus: List[int] = field(default_factory=list)   # GPUs in MIG mode, left out of the run


@plain
class IbBandwidthResult:
    """One perftest ``ib_write_bw`` loopback run: ``client`` writes to ``server`` (both "hca:port"
    of this node; the same port twice when the node has one)."""
    client: str
    server: str
    rate_gbps: Optional[float] = None           # the slower port's rate: what full speed means
    status: str = "ok"                           # ok | error | timeout
    message: str = ""
    bw_avg_gbps: Optional[float] = None          # perftest's "BW average", in Gb/s (10**9 bit/s)
    bw_peak_gbps: Optional[float] = None         # "BW peak" (0 in perftest's duration mode)
    message_bytes: Optional[int] = None
    unit: str = ""                               # the unit perftest printed: Gb/sec | MB/sec


@plain
class IbBandwidthFacts:
    # ok | unsupported (perftest not installed) | error (nothing could be run)
    status: str = "ok"
    message: str = ""
    program: Optional[str] = None
    results: List[IbBandwidthResult] = field(default_factory=list)
    timeout_s: Optional[float] = None


@plain
class KernelLogFacts:
    """Kernel-log events for this run (``healthcheck.xid.events.XidEvent``)."""
    status: str = "ok"                           # ok | error
    source: str = ""
    events: List[Any] = field(default_factory=list)
    message: str = ""                            # why it could not be read
    rescan: Optional[str] = None                 # why the cursor was not used (a bounded rescan)
    capped: Optional[str] = None                 # why the read stopped early (it resumes next run)
    # The read itself (kernellog.api.KernelLogRead): its commit() saves the cursor. Not for checks.
    read: Any = field(default=None, repr=False, compare=False)


@plain
class ImexFacts:
    """The node's IMEX (multi-node NVLink memory export): its daemon and its channels."""
    # ok | not_installed (no nvidia-imex-ctl) | timeout | error (it failed or printed nothing)
    status: str = "ok"
    message: str = ""
    daemon: Optional[str] = None                 # what `nvidia-imex-ctl -q` printed: READY, WAITING_FOR_PEERS, ...
    channels: List[int] = field(default_factory=list)   # N of /dev/nvidia-caps-imex-channels/channelN


@plain
class RunFacts:
    """Everything one ``run_checks`` gathered (None: not probed this run)."""
    nvml: Optional[NvmlFacts] = None
    ib: Optional[IbFacts] = None
    dcgm: Optional[DcgmFacts] = None
    kernel: Optional[KernelLogFacts] = None
    ib_bandwidth: Optional[IbBandwidthFacts] = None
    aer: Optional["PcieAerFacts"] = None         # the GPUs' PCIe AER counters
    imex: Optional[ImexFacts] = None
    # Counters as read, before this run's samples are committed: {key: [[time, value], ...]}
    history: Dict[str, List[List[float]]] = field(default_factory=dict)


# -- PCIe AER (Advanced Error Reporting) ------------------------------------------------------
# The kernel's AER statistics per PCI device (Linux 4.19+, Documentation/ABI/testing/
# sysfs-bus-pci-devices-aer_stats): <sysfs>/bus/pci/devices/<address>/aer_dev_{correctable,
# fatal,nonfatal}, each one "NAME COUNT" line per error kind the kernel names (a bit it does not
# name and that counted: "<array>_bit[N] COUNT"), then the total of ERR_* messages the device
# sent ("TOTAL_ERR_COR N", "TOTAL_ERR_FATAL N", "TOTAL_ERR_NONFATAL N"; since one message can
# carry several errors, not the sum of the lines). Counters since boot (64-bit), never cleared
# otherwise. Read by the AER probe, written by the simulator.
AER_KINDS = ("fatal", "nonfatal", "correctable")
AER_FILES = {"fatal": "aer_dev_fatal", "nonfatal": "aer_dev_nonfatal", "correctable": "aer_dev_correctable"}
AER_TOTALS = {"fatal": "TOTAL_ERR_FATAL", "nonfatal": "TOTAL_ERR_NONFATAL", "correctable": "TOTAL_ERR_COR"}
# The names the kernel prints (drivers/pci/pcie/aer.c, aer_{un,}correctable_error_string, 5.x
# on; 4.19 spelled them out, "Receiver Error", which parses the same: the count is the last word).
AER_CORRECTABLE_NAMES = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr",
                         "HeaderOF")
AER_UNCORRECTABLE_NAMES = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF",
                           "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP",
                           "AtomicOpBlocked", "TLPBlockedErr", "PoisonTLPBlocked")
_SYSFS_PCI = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def sysfs_pci_address(nvml_bus_id: str) -> Optional[str]:
    """NVML's ``00000000:18:00.0`` as sysfs names the device, ``0000:18:00.0``; None for
    anything that is no PCI address (it becomes a path component)."""
    domain, _, rest = str(nvml_bus_id).strip().partition(":")
    address = f"{domain[-4:]}:{rest}".lower()
    return address if _SYSFS_PCI.fullmatch(address) else None


def parse_aer(text: str, kind: str) -> Tuple[Optional[int], Dict[str, int]]:
    """An ``aer_dev_*`` file -> (its TOTAL_ERR_* count, {error name: count}); the total is None
    when the file has no total line (not the kernel's format)."""
    total: Optional[int] = None
    counts: Dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.strip().rpartition(" ")
        name = name.strip()
        if not name or not value.isdigit():
            continue
        if name == AER_TOTALS[kind]:
            total = int(value)
        else:
            counts[name] = int(value)
    return total, counts


@plain
class PcieAerDevice:
    address: str                                 # sysfs's 0000:18:00.0
    # kind -> the TOTAL_ERR_* count; None: no such file (no AER capability, kernel before 4.19)
    totals: Dict[str, Optional[int]] = field(default_factory=dict)
    counts: Dict[str, Dict[str, int]] = field(default_factory=dict)   # kind -> {error name: count}
    errors: Dict[str, str] = field(default_factory=dict)              # kind -> why unreadable


@plain
class PcieAerFacts:
    status: str = "ok"                           # ok | error
    message: str = ""
    devices: Dict[str, PcieAerDevice] = field(default_factory=dict)   # by NVML bus id

    def device(self, nvml_bus_id: Optional[str]) -> Optional[PcieAerDevice]:
        return self.devices.get(nvml_bus_id) if nvml_bus_id else None
