"""The NVML probe: every NVML call for the node, in a child process, under one deadline.

It reads facts and judges nothing. ``nvml`` is the module that serves the API (pynvml, or the
simulator bound to a node): functions are called through it; constants, structures and
exception classes come from pynvml itself, so both behave the same.

In the child each GPU is read in its own thread and reported as soon as it is done, so a GPU
that hangs costs only itself: the others are judged, and it is reported as not answering.
"""
from __future__ import annotations

import functools
import threading
import time
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ..facts import (NVLINK_COUNTERS, NVML_FI_DEV_C2C_LINK_COUNT, NVML_FI_DEV_C2C_LINK_GET_STATUS,
                     NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, NVML_READ_GROUPS, GpuFacts, NvmlFacts)
from .child import Emit

# NVML_ERROR_ARGUMENT_VERSION_MISMATCH: the driver does not know the structure version asked for.
ARGUMENT_VERSION_MISMATCH = 25


def probe_nvml(nvml: ModuleType, timeout_s: float, features: Iterable[str] = tuple(NVML_READ_GROUPS),
               gpus: Optional[Iterable[int]] = None) -> NvmlFacts:
    """NVML facts for this node, or what went wrong, within ``timeout_s`` (+ a few ms).

    ``gpus`` limits the per-GPU reads to those NVML indices (the count is always read).
    """
    return nvml_facts(start_nvml_probe(nvml, timeout_s, features, gpus))


def start_nvml_probe(nvml: ModuleType, timeout_s: float, features: Iterable[str] = tuple(NVML_READ_GROUPS),
                     gpus: Optional[Iterable[int]] = None) -> ChildProbe:
    """The probe's child, started; ``nvml_facts(child)`` collects it (other probes can run meanwhile)."""
    wanted = frozenset(features)
    only = None if gpus is None else frozenset(gpus)
    from .deadline import ChildProbe

    return ChildProbe(lambda emit: _gather(nvml, wanted, only, emit), timeout_s).start()


def nvml_facts(child) -> NvmlFacts:
    outcome = child.wait()
    return assemble(outcome.records, outcome.timed_out, outcome.error, child.timeout_s, outcome.elapsed_s,
                    started=child.started)


def assemble(records: List[Any], timed_out: bool, error: Optional[str], timeout_s: float,
             elapsed_s: float = 0.0, started: Optional[float] = None) -> NvmlFacts:
    """Facts from the child's records; GPUs that never reported did not answer in time.

    ``started``: the probe's start on the monotonic clock the child stamps its answers with;
    from it, ``last_answer_s`` (when the slowest GPU that answered did so)."""
    facts = NvmlFacts(timeout_s=timeout_s, elapsed_s=elapsed_s)
    node: Optional[Dict[str, Any]] = None
    identities: Dict[int, Dict[str, Any]] = {}
    done: Dict[int, GpuFacts] = {}
    answered_at: Dict[int, float] = {}
    for kind, value in records:
        if kind == "node":
            node = value
        elif kind == "identity":
            identities[value["index"]] = value
        elif kind == "gpu":
            done[value.index] = value
        elif kind == "answered":
            answered_at[value[0]] = value[1]
    if started is not None and done:
        # A GPU whose answer carries no stamp (cut between the two records) counts as answering
        # at the deadline: the late end, so a slow host is never read as one hung GPU.
        stamps = [answered_at.get(index, started + timeout_s) - started for index in done]
        facts.last_answer_s = round(max(0.0, max(stamps)), 3)
    if node is None:
        facts.status = "timeout" if timed_out else "crashed"
        facts.message = error or ""
        return facts
    facts.status, facts.message = node["status"], node.get("message", "")
    facts.driver_version, facts.device_count = node.get("driver_version"), node.get("device_count")
    for index in node.get("probed", []):
        gpu = done.get(index)
        if gpu is None:
            known = identities.get(index, {})
            gpu = GpuFacts(index=index, uuid=known.get("uuid"), pci_bus_id=known.get("pci_bus_id"),
                           name=known.get("name"), minor_number=known.get("minor_number"),
                           mig_mode=known.get("mig_mode"), mig_devices=known.get("mig_devices"),
                           state="hang" if timed_out else "error",
                           error=None if timed_out else (error or "the probe ended before this GPU"))
        facts.gpus.append(gpu)
    if error and facts.status == "ok":
        facts.message = error
    return facts


# -- child side --------------------------------------------------------------------------------
def _gather(nvml: ModuleType, wanted: frozenset, only: Optional[frozenset], emit: Emit) -> None:
    import pynvml

    try:
        nvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound as exc:
        emit(("node", {"status": "library_not_found", "message": _text(exc)}))
        return
    except pynvml.NVMLError_DriverNotLoaded as exc:
        emit(("node", {"status": "driver_not_loaded", "message": _text(exc)}))
        return
    except pynvml.NVMLError as exc:
        emit(("node", {"status": "init_error", "message": _text(exc)}))
        return
    try:
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
        except pynvml.NVMLError:
            driver = None
        count = nvml.nvmlDeviceGetCount()
        probed = [i for i in range(count) if only is None or i in only]
        emit(("node", {"status": "ok", "driver_version": _str(driver), "device_count": count,
                       "probed": probed}))
        threads = [threading.Thread(target=_gather_gpu_safely, args=(nvml, index, wanted, emit),
                                    name=f"nvml-gpu{index}", daemon=True) for index in probed]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        try:
            nvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _gather_gpu_safely(nvml: ModuleType, index: int, wanted: frozenset, emit: Emit) -> None:
    try:
        emit(("gpu", gather_gpu(nvml, index, wanted, emit)))
    except Exception as exc:  # noqa: BLE001 - a probe bug on one GPU must not hide the others
        emit(("gpu", GpuFacts(index=index, state="error", error=f"{type(exc).__name__}: {exc}")))
    # When it answered, on the clock the parent started its deadline on (CLOCK_MONOTONIC is one
    # clock for the whole host): whether the siblings of a GPU that hangs answered early (one
    # broken GPU) or only late (a host too slow to finish; checks.probe_health tells them apart).
    emit(("answered", (index, time.monotonic())))


class _Lost(Exception):
    """NVML said GPU_IS_LOST: stop asking this GPU anything."""


def gather_gpu(nvml: ModuleType, index: int, wanted: frozenset, emit: Optional[Emit] = None) -> GpuFacts:
    """Every wanted fact about one GPU (runs in the probe's child; callable directly in tests)."""
    import pynvml

    gpu = GpuFacts(index=index)

    mismatch = _mismatch_error(pynvml)

    def read(feature: str, call: Callable[[], Any]) -> Any:
        """``call()``; None when unsupported or failed (noted), _Lost when the GPU is gone."""
        return first_exported(feature, [("", call)])

    def first_exported(feature: str, calls: List[Tuple[str, Callable[[], Any]]]) -> Any:
        """The first of ``calls`` whose NVML function this driver exports (older drivers lack
        the newer calls: fall back); when none is, the fact is unsupported by the driver."""
        missing = []
        for name, call in calls:
            try:
                return call()
            except pynvml.NVMLError_GpuIsLost as exc:
                gpu.state, gpu.error = "lost", _text(exc)
                raise _Lost() from None
            except pynvml.NVMLError_NotSupported:
                break
            except (pynvml.NVMLError_FunctionNotFound, mismatch) as exc:
                missing.append(name or type(exc).__name__)
                continue
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) == ARGUMENT_VERSION_MISMATCH:
                    # The driver does not know this version of the call's structure (an older
                    # branch): the next, older version is asked.
                    missing.append(name or type(exc).__name__)
                    continue
                gpu.errors.setdefault(feature, _text(exc))
                return None
        if missing and len(missing) == len(calls):
            gpu.driver_missing.setdefault(feature, ", ".join(dict.fromkeys(missing)))
        if feature not in gpu.unsupported:
            gpu.unsupported.append(feature)
        return None

    try:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError_GpuIsLost as exc:
            gpu.state, gpu.error = "lost", _text(exc)
            return gpu
        except pynvml.NVMLError_Unknown as exc:
            # What a GPU that fell off the bus often answers instead of GPU_IS_LOST.
            gpu.state, gpu.error = "lost", f"{_text(exc)} when opening it"
            return gpu
        except pynvml.NVMLError as exc:
            gpu.state, gpu.error = "error", _text(exc)
            return gpu
        gpu.name = _str(read("identity", lambda: nvml.nvmlDeviceGetName(handle)))
        gpu.uuid = _str(read("identity", lambda: nvml.nvmlDeviceGetUUID(handle)))
        pci = read("identity", lambda: nvml.nvmlDeviceGetPciInfo(handle))
        gpu.pci_bus_id = _str(pci.busId) if pci is not None else None
        minor = read("identity", lambda: nvml.nvmlDeviceGetMinorNumber(handle))
        gpu.minor_number = None if minor is None else int(minor)
        if emit is not None:
            emit(("identity", _identity(gpu)))
        # MIG is read with the identity: it is what maps a job's MIG devices to their GPU.
        _read_mig(nvml, pynvml, handle, gpu, read, first_exported)
        if emit is not None and gpu.mig_mode:
            emit(("identity", _identity(gpu)))
        if "ecc" in wanted:
            _read_ecc(nvml, pynvml, handle, gpu, read)
        if "remap" in wanted:
            rows = read("remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
            if rows is not None:
                gpu.remapped_rows = {"correctable": int(rows[0]), "uncorrectable": int(rows[1]),
                                     "pending": int(rows[2]), "failure": int(rows[3])}
        if "retired_pages" in wanted:
            pending = read("retired_pages", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
            gpu.retired_pages_pending = None if pending is None else bool(pending)
        if "thermal" in wanted:
            gpu.temperature_c = read("temperature", lambda: nvml.nvmlDeviceGetTemperature(
                handle, pynvml.NVML_TEMPERATURE_GPU))
            gpu.temperature_slowdown_c = read("temperature", lambda: nvml.nvmlDeviceGetTemperatureThreshold(
                handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
        if "power" in wanted:
            usage = read("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
            limit = read("power", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
            gpu.power_w = None if usage is None else usage / 1000.0      # NVML: milliwatts
            gpu.power_limit_w = None if limit is None else limit / 1000.0
        if "clocks" in wanted or "pcie" in wanted:
            # The "event" spelling exists from R535 (and pynvml 12.535); older drivers have
            # only the "throttle" one, with the same bits.
            gpu.clock_event_reasons = first_exported("clock_event_reasons", _calls(
                nvml, handle, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"))
        if "pcie" in wanted:
            gpu.pcie = {
                "gen": read("pcie", lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
                "gen_max": read("pcie", lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
                "width": read("pcie", lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
                "width_max": read("pcie", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
            }
        if "nvlink" in wanted or "nvlink_errors" in wanted:
            _read_nvlink(nvml, pynvml, handle, gpu, "nvlink_errors" in wanted)
        if "fabric" in wanted:
            _read_fabric(nvml, pynvml, handle, gpu, first_exported)
        if "processes" in wanted:
            # R470-era drivers lack the _v3 call that pynvml's unversioned one makes.
            procs = first_exported("processes", _calls(
                nvml, handle, "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"))
            if procs is not None:
                gpu.processes = [{"pid": int(p.pid), "used_memory_mib": _mib(getattr(p, "usedGpuMemory", None))}
                                 for p in procs]
        if "recovery" in wanted:
            _read_recovery_action(nvml, pynvml, handle, gpu, read)
        if "c2c" in wanted:
            _read_c2c(nvml, pynvml, handle, gpu, read)
    except _Lost:
        pass
    return gpu


def _identity(gpu: GpuFacts) -> Dict[str, Any]:
    """What is known of a GPU before its health is read (kept if the GPU stops answering)."""
    return {"index": gpu.index, "uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id, "name": gpu.name,
            "minor_number": gpu.minor_number, "mig_mode": gpu.mig_mode, "mig_devices": gpu.mig_devices}


def _read_mig(nvml, pynvml, handle, gpu: GpuFacts, read, first_exported) -> None:
    """MIG mode and, when it is on, each MIG device: its UUID, GPU instance and compute instance
    ids, and its parent as NVML names it (the MIG handle's parent handle, then that GPU's UUID):
    a MIG UUID is opaque from R470 on (MIG-<uuid>) and is never parsed. A GPU without MIG (V100,
    L40S, ...) answers NOT_SUPPORTED, bindings without the call have no MIG: the fact is
    unsupported, never a failure."""
    mode = first_exported("mig", _calls(nvml, handle, "nvmlDeviceGetMigMode"))
    if mode is None:
        return
    gpu.mig_mode = int(mode[0])
    if gpu.mig_mode != 1:
        return
    top = read("mig", lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    if top is None:
        return
    devices: List[Dict[str, Any]] = []
    for slot in range(int(top)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_GpuIsLost as exc:
            gpu.state, gpu.error = "lost", _text(exc)
            raise _Lost() from None
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) not in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                gpu.errors.setdefault("mig", f"MIG device {slot}: {_text(exc)}")
            continue     # no MIG device in this slot
        if not read("mig", lambda: nvml.nvmlDeviceIsMigDeviceHandle(mig)):
            gpu.errors.setdefault("mig", f"MIG device {slot}: NVML does not call its handle a MIG device's")
            continue
        parent = read("mig", lambda: nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig))
        devices.append({
            "index": slot,
            "uuid": _str(read("mig", lambda: nvml.nvmlDeviceGetUUID(mig))),
            "gpu_instance": _int(read("mig", lambda: nvml.nvmlDeviceGetGpuInstanceId(mig))),
            "compute_instance": _int(read("mig", lambda: nvml.nvmlDeviceGetComputeInstanceId(mig))),
            "parent_uuid": None if parent is None else _str(read("mig", lambda: nvml.nvmlDeviceGetUUID(parent))),
        })
    gpu.mig_devices = devices


def _int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _read_ecc(nvml, pynvml, handle, gpu: GpuFacts, read) -> None:
    mode = read("ecc", lambda: nvml.nvmlDeviceGetEccMode(handle))
    if mode is None:
        return
    gpu.ecc_mode = [int(mode[0]), int(mode[1])]
    if not gpu.ecc_mode[0]:
        return    # counters are not kept while ECC is off
    kinds = {
        "volatile_corrected": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
        "volatile_uncorrected": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
        "aggregate_corrected": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
        "aggregate_uncorrected": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
    }
    for key, (error_type, counter_type) in kinds.items():
        gpu.ecc[key] = read("ecc", lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type))


_NVLINK_COUNTER_CONSTANTS = {
    "replay": "NVML_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
    "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
    "ecc_data": "NVML_NVLINK_ERROR_DL_ECC_DATA",
}


def _read_nvlink(nvml, pynvml, handle, gpu: GpuFacts, with_errors: bool) -> None:
    states: Dict[int, int] = {}
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            states[link] = int(nvml.nvmlDeviceGetNvLinkState(handle, link))
        except pynvml.NVMLError_GpuIsLost as exc:
            gpu.state, gpu.error = "lost", _text(exc)
            raise _Lost() from None
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue    # no such link on this GPU (PCIe cards: none at all)
        except pynvml.NVMLError as exc:
            gpu.errors.setdefault("nvlink", f"link {link}: {_text(exc)}")
    if not states:
        if "nvlink" not in gpu.errors:
            gpu.unsupported.append("nvlink")
        return
    gpu.nvlink_states = states
    if not with_errors:
        return
    for link in states:
        counters: Dict[str, int] = {}
        for name in NVLINK_COUNTERS:
            constant = getattr(pynvml, _NVLINK_COUNTER_CONSTANTS[name], None)
            if constant is None:
                continue
            try:
                counters[name] = int(nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, constant))
            except pynvml.NVMLError_GpuIsLost as exc:
                gpu.state, gpu.error = "lost", _text(exc)
                raise _Lost() from None
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue   # NVLink5 reports these through field values instead
            except pynvml.NVMLError as exc:
                gpu.errors.setdefault("nvlink_errors", f"link {link}: {_text(exc)}")
        if counters:
            gpu.nvlink_errors[link] = counters


def _read_recovery_action(nvml, pynvml, handle, gpu: GpuFacts, read) -> None:
    """The driver's GPU recovery action (R570+). nvmlDeviceGetFieldValues answers each field
    with its own nvmlReturn (pynvml raises only for the call): a driver that does not know the
    field says so there, and that is unsupported, never a failure."""
    values = read("recovery_action", lambda: nvml.nvmlDeviceGetFieldValues(
        handle, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]))
    if values is not None:
        gpu.recovery_action = _field_value(pynvml, values[0], gpu, "recovery_action")


MAX_C2C_LINKS = 64


def _read_c2c(nvml, pynvml, handle, gpu: GpuFacts, read) -> None:
    """Each NVLink-C2C link's status (R525+): the link count, then one status field per link
    (its scopeId). A driver or a GPU without C2C answers the count NOT_SUPPORTED in its field:
    unsupported, never a failure; a count of 0 is a GPU without C2C links ({})."""
    counted = read("c2c", lambda: nvml.nvmlDeviceGetFieldValues(handle, [NVML_FI_DEV_C2C_LINK_COUNT]))
    if counted is None:
        return
    count = _field_value(pynvml, counted[0], gpu, "c2c")
    if count is None:
        return
    if count > MAX_C2C_LINKS:        # a driver's nonsense is not a loop of billions
        gpu.errors.setdefault("c2c", f"NVML reports {count} C2C links")
        return
    links: Dict[int, int] = {}
    if count:
        statuses = read("c2c", lambda: nvml.nvmlDeviceGetFieldValues(
            handle, [(NVML_FI_DEV_C2C_LINK_GET_STATUS, link) for link in range(int(count))]))
        if statuses is None:
            return
        for link, value in enumerate(statuses):
            status = _field_value(pynvml, value, gpu, "c2c")
            if status is None:
                return
            links[link] = int(status)
    gpu.c2c_links = links


def _field_value(pynvml, value, gpu: GpuFacts, fact: str) -> Optional[int]:
    """One field value's unsigned int; None (the fact unsupported) when its own nvmlReturn says
    the driver or the GPU does not have it. A lost GPU raises _Lost."""
    status = int(value.nvmlReturn)
    if status == pynvml.NVML_SUCCESS:
        return int(value.value.uiVal)
    if status == pynvml.NVML_ERROR_GPU_IS_LOST:
        gpu.state, gpu.error = "lost", _text(pynvml.NVMLError(status))
        raise _Lost()
    if fact not in gpu.unsupported:
        gpu.unsupported.append(fact)
    return None


def _read_fabric(nvml, pynvml, handle, gpu: GpuFacts, first_exported) -> None:
    from .nvml_structs import FABRIC_CALLS

    calls = [(function, _fabric_reader(getattr(nvml, function), struct_type, handle))
             for function, struct_type in FABRIC_CALLS if getattr(nvml, function, None) is not None]
    info = first_exported("fabric", calls) if calls else None
    if info is None:
        if not calls and "fabric" not in gpu.unsupported:
            gpu.unsupported.append("fabric")
        return
    state = int(info.state)
    if state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        if "fabric" not in gpu.unsupported:
            gpu.unsupported.append("fabric")
        return
    gpu.fabric_state, gpu.fabric_status = state, int(info.status)
    _read_fabric_domain(info, gpu)


def _read_fabric_domain(info, gpu: GpuFacts) -> None:
    """The multi-node NVLink domain the GPU is in (every version of the structure: cluster UUID
    and clique id) and, from fabric info v3 (driver R570+), the fabric's health. A driver that
    answers only an older version leaves the health unknown: unsupported, never a failure."""
    gpu.fabric_cluster_uuid = _uuid(bytes(info.clusterUuid))
    gpu.fabric_clique_id = int(info.cliqueId)
    if hasattr(info, "healthSummary"):
        gpu.fabric_health_summary, gpu.fabric_health_mask = int(info.healthSummary), int(info.healthMask)
        return
    gpu.driver_missing.setdefault("fabric_health", "nvmlGpuFabricInfo_v3")
    if "fabric_health" not in gpu.unsupported:
        gpu.unsupported.append("fabric_health")


def _uuid(raw: bytes) -> str:
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"


def _fabric_reader(call, struct_type, handle) -> Callable[[], Any]:
    import ctypes

    def read() -> Any:
        info = struct_type()
        call(handle, ctypes.byref(info))
        return info
    return read


def _calls(nvml: ModuleType, handle: Any, *functions: str) -> List[Tuple[str, Callable[[], Any]]]:
    """(name, call) for each of ``functions`` that the bindings have, newest first."""
    out = []
    for name in functions:
        function = getattr(nvml, name, None)
        if function is not None:
            out.append((name, functools.partial(function, handle)))
    return out


def _mismatch_error(pynvml: ModuleType) -> type:
    """pynvml >= 12.550 raises NVMLLibraryMismatchError (a plain Exception, not an NVMLError)
    when an unversioned call's versioned C function is missing; older bindings have no such
    class (a class nothing raises stands in)."""
    return getattr(pynvml, "NVMLLibraryMismatchError", None) or _NeverRaised


class _NeverRaised(Exception):
    pass


# -- small conversions ---------------------------------------------------------------------------
def _str(value: Any) -> Optional[str]:
    """pynvml returns str on Python 3, but older wheels and raw ctypes fields give bytes."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("ascii", "replace").rstrip("\x00")
    return str(value)


def _mib(used: Any) -> Optional[int]:
    if used is None:
        return None
    try:
        value = int(used)
    except (TypeError, ValueError):
        return None
    # NVML_VALUE_NOT_AVAILABLE (all ones) means the driver cannot tell, e.g. under WDDM.
    if value >= (1 << 64) - 1:
        return None
    return value // (1024 * 1024)


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
