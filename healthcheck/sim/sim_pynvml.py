"""A pynvml look-alike served from a simulated node's live profile.

Every public name here is pynvml's own (same argument order, return shapes and exception
classes, re-exported from pynvml itself), so ``healthcheck.probes.nvml`` runs unchanged on
it. ``tests/test_sim_nvml.py`` fails if a public name here is missing from pynvml.

Each ``nvmlInit`` re-reads the live profile, so ``slurm-gpu sim inject`` changes what the
next probe sees. The profile's ``[node] driver_version`` decides which functions exist: a call
into a C function that branch does not export raises what pynvml raises then
(``healthcheck/data/nvml-functions.tsv``).
"""
from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Dict, List, Optional

import pynvml
from pynvml import (  # noqa: F401  (re-exported: callers catch pynvml's own classes)
    NVML_AGGREGATE_ECC,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_GPU_FABRIC_STATE_COMPLETED,
    NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    NVML_GPU_FABRIC_STATE_NOT_STARTED,
    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
    NVML_MEMORY_ERROR_TYPE_CORRECTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_NVLINK_ERROR_DL_CRC_DATA,
    NVML_NVLINK_ERROR_DL_CRC_FLIT,
    NVML_NVLINK_ERROR_DL_ECC_DATA,
    NVML_NVLINK_ERROR_DL_RECOVERY,
    NVML_NVLINK_ERROR_DL_REPLAY,
    NVML_NVLINK_MAX_LINKS,
    NVML_TEMPERATURE_GPU,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    NVML_VOLATILE_ECC,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_FunctionNotFound,
    NVMLError_GpuIsLost,
    NVMLError_InvalidArgument,
    NVMLError_LibraryNotFound,
    NVMLError_NotSupported,
    NVMLError_Uninitialized,
    nvmlFriendlyObject,
    nvmlPciInfo_t,
)

from ..driver_support import driver_accepts_version as _driver_accepts_version
from ..driver_support import driver_exports as _driver_exports
from ..driver_support import driver_knows_field as _driver_knows_field
from ..facts import GPU_RECOVERY_ACTIONS as _RECOVERY_ACTIONS
from ..facts import NVML_FI_DEV_C2C_LINK_COUNT as _FI_C2C_LINK_COUNT
from ..facts import NVML_FI_DEV_C2C_LINK_GET_STATUS as _FI_C2C_LINK_STATUS
from ..facts import NVML_FI_DEV_GET_GPU_RECOVERY_ACTION as _FI_RECOVERY_ACTION
from . import profile as profiles
from .profile import FABRIC_HEALTH_SUMMARY_NAMES as _FABRIC_HEALTH_SUMMARIES

_bound_path: Optional[str] = None
_profile: Optional[Dict[str, Any]] = None
# pynvml's own mark of a process that initialised NVML (its loaded library; never unset): set by
# the first nvmlInit that succeeds (the hook server checks it before each fork).
_nvmlLib: Optional[str] = None

_FABRIC_STATES = {
    "not_supported": NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
    "not_started": NVML_GPU_FABRIC_STATE_NOT_STARTED,
    "in_progress": NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    "completed": NVML_GPU_FABRIC_STATE_COMPLETED,
}
_NVLINK_COUNTERS = {
    NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
    NVML_NVLINK_ERROR_DL_ECC_DATA: "ecc_data",
}
_ECC_KEYS = {
    (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC): "volatile_corrected",
    (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC): "volatile_uncorrected",
    (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC): "aggregate_corrected",
    (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC): "aggregate_uncorrected",
}


def _bind(live_profile_path: str) -> None:
    """Point this module at one simulated node (private: pynvml has no such call)."""
    global _bound_path, _profile
    _bound_path, _profile = live_profile_path, None


def _exports(symbol: str) -> Any:
    """The wrapped call goes through the C function ``symbol``: on a driver branch without
    it, raise what pynvml raises for a missing symbol."""
    def decorate(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _profile is not None and not _driver_exports(_profile["node"]["driver_version"], symbol):
                raise NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return func(*args, **kwargs)
        return wrapper
    return decorate


def _hang() -> None:
    # A driver stuck in uninterruptible sleep: only a deadline outside the call ends it.
    while True:
        time.sleep(3600)


# Calls answered per GPU since nvmlInit, for ``lost_after_calls`` (a GPU lost midway through a probe).
_calls: Dict[int, int] = {}
_calls_lock = threading.Lock()


def _falls_off_now(gpu: Dict[str, Any]) -> bool:
    limit = gpu.get("lost_after_calls", -1)
    if limit < 0:
        return False
    with _calls_lock:
        made = _calls.get(id(gpu), 0)
        _calls[id(gpu)] = made + 1
    return made >= limit


class _Handle:
    __slots__ = ("gpu",)

    def __init__(self, gpu: Dict[str, Any]):
        self.gpu = gpu


class _MigHandle(_Handle):
    """A MIG device's handle: its parent GPU (what every call about it reaches first: a lost
    parent answers GPU_IS_LOST for each of its MIG devices) and the device."""
    __slots__ = ("device",)

    def __init__(self, gpu: Dict[str, Any], device: Dict[str, Any]):
        super().__init__(gpu)
        self.device = device


def _present() -> List[Dict[str, Any]]:
    if _profile is None:
        raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
    return [gpu for gpu in _profile["gpu"] if gpu["state"] != "absent"]


def _gpu(handle: _Handle, feature: Optional[str] = None) -> Dict[str, Any]:
    gpu = handle.gpu
    if gpu["state"] == "hang":
        _hang()
    if gpu["state"] == "lost" or _falls_off_now(gpu):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    if feature and feature in gpu["not_supported"]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu


# -- system --------------------------------------------------------------------------------
def nvmlInit() -> None:
    global _profile, _nvmlLib
    if _bound_path is None:
        raise NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    profile = profiles.load_live(_bound_path)
    mode = profile["node"]["nvml"]
    if mode == "hang":
        _hang()
    if mode == "missing":
        raise NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    if mode == "driver_not_loaded":
        raise NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    _profile = profile
    _nvmlLib = _bound_path
    _calls.clear()
    # The driver's tables, read once here: the probe asks from a thread per GPU, and each
    # would read and parse them (lru_cache does not hold the others back while one fills it).
    _driver_exports(profile["node"]["driver_version"], "nvmlInit")
    _driver_knows_field(profile["node"]["driver_version"], _FI_RECOVERY_ACTION)
    _driver_accepts_version(profile["node"]["driver_version"], "nvmlDeviceGetGpuFabricInfoV", 3)
    _hold(True)


def nvmlShutdown() -> None:
    global _profile
    _profile = None
    _hold(False)


def _hold(opened: bool) -> None:
    """As a real process that initialised NVML holds the GPUs' device files open until it shuts
    NVML down or exits: this pid's file under the node's ``HOLDERS_DIR`` (a dead pid does not
    count). A state dir this process cannot write only hides it from the simulated reset."""
    from ..safeio.fsutil import atomic_write, ensure_dir

    folder = os.path.join(os.path.dirname(_bound_path or "."), profiles.HOLDERS_DIR)
    try:
        if opened:
            atomic_write(os.path.join(ensure_dir(folder), str(os.getpid())), "", durable=False)
        else:
            os.unlink(os.path.join(folder, str(os.getpid())))
    except OSError:
        pass


def nvmlSystemGetDriverVersion() -> str:
    _present()
    return _profile["node"]["driver_version"]


def nvmlDeviceGetCount() -> int:
    return len(_present())


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    present = _present()
    if not 0 <= index < len(present):
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if present[index]["state"] == "unknown_error":
        # What a GPU that fell off the bus often answers, rather than GPU_IS_LOST.
        raise NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    return _Handle(present[index])


# -- identity ------------------------------------------------------------------------------
def nvmlDeviceGetName(handle: _Handle) -> str:
    return _gpu(handle)["name"]


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    gpu = _gpu(handle)
    return handle.device["uuid"] if isinstance(handle, _MigHandle) else gpu["uuid"]


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    _gpu(handle)
    return _present().index(handle.gpu)


def nvmlDeviceGetMinorNumber(handle: _Handle) -> int:
    """N of /dev/nvidiaN (what Slurm's GRES index maps to)."""
    return int(_gpu(handle)["minor_number"])


def nvmlDeviceGetPciInfo(handle: _Handle) -> nvmlPciInfo_t:
    gpu = _gpu(handle)
    info = nvmlPciInfo_t()
    bus_id = gpu["pci_bus_id"].encode("ascii")
    info.busId = bus_id
    info.busIdLegacy = bus_id[-16:]
    domain, bus, rest = gpu["pci_bus_id"].split(":")
    device, _, _function = rest.partition(".")
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(device, 16)
    return info


# -- health --------------------------------------------------------------------------------
def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    return int(_gpu(handle, "temperature")["temperature_c"])


def nvmlDeviceGetTemperatureThreshold(handle: _Handle, threshold: int) -> int:
    gpu = _gpu(handle, "temperature")
    if threshold != NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(gpu["temperature_slowdown_c"])


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    return int(_gpu(handle, "power")["power_w"] * 1000)


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    return int(_gpu(handle, "power")["power_limit_w"] * 1000)


@_exports("nvmlDeviceGetCurrentClocksEventReasons")
def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    return int(_gpu(handle, "clock_event_reasons")["clock_event_reasons"])


@_exports("nvmlDeviceGetCurrentClocksThrottleReasons")
def nvmlDeviceGetCurrentClocksThrottleReasons(handle: _Handle) -> int:
    return int(_gpu(handle, "clock_event_reasons")["clock_event_reasons"])


def nvmlDeviceGetCurrPcieLinkGeneration(handle: _Handle) -> int:
    return _gpu(handle, "pcie")["pcie"]["gen"]


def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
    return _gpu(handle, "pcie")["pcie"]["gen_max"]


def nvmlDeviceGetCurrPcieLinkWidth(handle: _Handle) -> int:
    return _gpu(handle, "pcie")["pcie"]["width"]


def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
    return _gpu(handle, "pcie")["pcie"]["width_max"]


def nvmlDeviceGetEccMode(handle: _Handle) -> List[int]:
    enabled = int(bool(_gpu(handle, "ecc")["ecc_enabled"]))
    return [enabled, enabled]


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    gpu = _gpu(handle, "ecc")
    if not gpu["ecc_enabled"]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    key = _ECC_KEYS.get((error_type, counter_type))
    if key is None:
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return int(gpu["ecc"][key])


def nvmlDeviceGetRemappedRows(handle: _Handle):
    rows = _gpu(handle, "remapped_rows")["remapped_rows"]
    return (rows["correctable"], rows["uncorrectable"], int(rows["pending"]), int(rows["failure"]))


def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
    return int(_gpu(handle, "retired_pages")["retired_pages_pending"])


# -- NVLink and fabric ---------------------------------------------------------------------
def _link(handle: _Handle, link: int) -> Dict[str, Any]:
    gpu = _gpu(handle, "nvlink")
    if not 0 <= link < NVML_NVLINK_MAX_LINKS:
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if link >= gpu["nvlink"]["links"]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu["nvlink"]


def nvmlDeviceGetNvLinkState(handle: _Handle, link: int) -> int:
    return 0 if link in _link(handle, link)["down"] else 1


def nvmlDeviceGetNvLinkErrorCounter(handle: _Handle, link: int, counter: int) -> int:
    nvlink = _link(handle, link)
    name = _NVLINK_COUNTERS.get(counter)
    if name is None:
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return int(nvlink["errors"].get(str(link), {}).get(name, 0))


def _fill_fabric(handle: _Handle, gpuFabricInfo) -> int:
    fabric = _gpu(handle, "fabric")["fabric"]
    if fabric["state"] == "not_supported":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    info = gpuFabricInfo._obj if hasattr(gpuFabricInfo, "_obj") else gpuFabricInfo
    info.state = _FABRIC_STATES[fabric["state"]]
    info.status = fabric["status"]
    raw = bytes.fromhex(fabric.get("cluster_uuid", "").replace("-", "")) or bytes(16)
    for i, byte in enumerate(raw[:16]):
        info.clusterUuid[i] = byte
    info.cliqueId = fabric.get("clique_id", 0)
    if hasattr(info, "healthMask"):
        info.healthMask = fabric.get("health_mask", 0)
    if hasattr(info, "healthSummary"):
        info.healthSummary = _FABRIC_HEALTH_SUMMARIES[fabric.get("health_summary", "not_supported")]
    return pynvml.NVML_SUCCESS


@_exports("nvmlDeviceGetGpuFabricInfoV")
def nvmlDeviceGetGpuFabricInfoV(handle: _Handle, gpuFabricInfo) -> int:
    """The versioned call: the structure's version word (high byte) says which layout the caller
    passed; a branch that does not accept that version answers ARGUMENT_VERSION_MISMATCH
    (healthcheck/data/nvml-struct-versions.tsv), as the real library does."""
    info = gpuFabricInfo._obj if hasattr(gpuFabricInfo, "_obj") else gpuFabricInfo
    version = int(getattr(info, "version", 0)) >> 24
    if _profile is not None and not _driver_accepts_version(
            _profile["node"]["driver_version"], "nvmlDeviceGetGpuFabricInfoV", version):
        raise NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    return _fill_fabric(handle, gpuFabricInfo)


@_exports("nvmlDeviceGetGpuFabricInfo")
def nvmlDeviceGetGpuFabricInfo(handle: _Handle, gpuFabricInfo) -> int:
    """The v1 call (R525..R545): the same facts in the unversioned struct."""
    return _fill_fabric(handle, gpuFabricInfo)


# -- field values --------------------------------------------------------------------------
_RECOVERY_VALUES = {name: value for value, name in _RECOVERY_ACTIONS.items()}


@_exports("nvmlDeviceGetFieldValues")
def nvmlDeviceGetFieldValues(handle: _Handle, fieldIds: List[Any]):
    """pynvml's shape: an array of c_nvmlFieldValue_t, each field answered in its own
    nvmlReturn (a field the driver branch does not know, or the GPU does not have, is
    NVML_ERROR_NOT_SUPPORTED there; the call itself succeeds)."""
    gpu = _gpu(handle)
    values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
    for slot, requested in zip(values, fieldIds):
        field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
        slot.fieldId, slot.scopeId = field_id, scope
        value = _field(gpu, field_id, scope) if _driver_knows_field(_profile["node"]["driver_version"], field_id) \
            else None
        if value is None:
            slot.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            continue
        slot.nvmlReturn = pynvml.NVML_SUCCESS
        slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        slot.value.uiVal = value
    return values


def _field(gpu: Dict[str, Any], field_id: int, scope: int) -> Optional[int]:
    """A field value the simulated GPU has (None: not supported there)."""
    if field_id == _FI_RECOVERY_ACTION and "recovery_action" not in gpu["not_supported"]:
        return _RECOVERY_VALUES[gpu["recovery_action"]]
    if "c2c" in gpu["not_supported"]:
        return None
    # No default in sim-defaults.toml: a live profile of a GPU without C2C links has no such key,
    # and the simulator of a release before it (the lab's root filesystem, an older install)
    # still reads what this one writes.
    links = gpu.get("c2c_links", [])
    if field_id == _FI_C2C_LINK_COUNT:
        return len(links)
    if field_id == _FI_C2C_LINK_STATUS and 0 <= scope < len(links):
        return int(links[scope])
    return None


# -- processes -----------------------------------------------------------------------------
def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> List[nvmlFriendlyObject]:
    if _profile is not None and not _driver_exports(_profile["node"]["driver_version"],
                                                   "nvmlDeviceGetComputeRunningProcesses_v3"):
        # pynvml >= 12.550 wraps this call so that a missing _v3 raises its own
        # NVMLLibraryMismatchError (not an NVMLError); older bindings let FunctionNotFound out.
        mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)
        if mismatch is not None:
            raise mismatch("Unversioned function called and the pyNVML version does not match the NVML lib "
                           "version. Either use matching pyNVML and NVML lib versions or use a versioned "
                           "function such as nvmlDeviceGetComputeRunningProcesses_v2")
        raise NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    return _processes(handle)


@_exports("nvmlDeviceGetComputeRunningProcesses_v2")
def nvmlDeviceGetComputeRunningProcesses_v2(handle: _Handle) -> List[nvmlFriendlyObject]:
    return _processes(handle)


def _processes(handle: _Handle) -> List[nvmlFriendlyObject]:
    procs = []
    for proc in _gpu(handle, "processes")["processes"]:
        procs.append(nvmlFriendlyObject({
            "pid": proc["pid"],
            "usedGpuMemory": proc["used_memory_mib"] * 1024 * 1024,
            "gpuInstanceId": 0xFFFFFFFF,
            "computeInstanceId": 0xFFFFFFFF,
        }))
    return procs



# -- MIG -----------------------------------------------------------------------------------
# The calls exist on every branch modelled (MIG came with R450); a GPU without MIG answers
# NOT_SUPPORTED ("mig" in its not_supported), as a V100 or an L40S does.
_MAX_MIG_DEVICES = 7


def _parent(handle: _Handle) -> Dict[str, Any]:
    if isinstance(handle, _MigHandle):
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)   # a MIG device has no MIG of its own
    return _gpu(handle, "mig")


@_exports("nvmlDeviceGetMigMode")
def nvmlDeviceGetMigMode(device: _Handle) -> List[int]:
    enabled = int(bool(_parent(device)["mig"]["enabled"]))
    return [enabled, enabled]


@_exports("nvmlDeviceGetMaxMigDeviceCount")
def nvmlDeviceGetMaxMigDeviceCount(device: _Handle) -> int:
    _parent(device)
    return _MAX_MIG_DEVICES


@_exports("nvmlDeviceGetMigDeviceHandleByIndex")
def nvmlDeviceGetMigDeviceHandleByIndex(device: _Handle, index: int) -> _MigHandle:
    gpu = _parent(device)
    if not gpu["mig"]["enabled"] or not 0 <= index < _MAX_MIG_DEVICES:
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    devices = gpu["mig"]["devices"]
    if index >= len(devices):
        raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
    return _MigHandle(gpu, devices[index])


@_exports("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice: _Handle) -> _Handle:
    if not isinstance(migDevice, _MigHandle):
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    _gpu(migDevice)
    return _Handle(migDevice.gpu)


@_exports("nvmlDeviceIsMigDeviceHandle")
def nvmlDeviceIsMigDeviceHandle(device: _Handle) -> int:
    return int(isinstance(device, _MigHandle))


@_exports("nvmlDeviceGetGpuInstanceId")
def nvmlDeviceGetGpuInstanceId(device: _Handle) -> int:
    if not isinstance(device, _MigHandle):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    _gpu(device)
    return int(device.device["gpu_instance"])


@_exports("nvmlDeviceGetComputeInstanceId")
def nvmlDeviceGetComputeInstanceId(device: _Handle) -> int:
    if not isinstance(device, _MigHandle):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    _gpu(device)
    return int(device.device["compute_instance"])
