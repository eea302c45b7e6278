"""NVML structures the NVML probe passes to the library itself (ctypes), where pynvml's own are
laid out wrong. Imported only in the probe's child: the hook's own process never loads ctypes
for them."""
from __future__ import annotations

import ctypes


class FabricInfoV1(ctypes.Structure):
    """nvmlGpuFabricInfo_t as nvml.h lays it out. pynvml's own (c_nvmlGpuFabricInfo_t, up to
    nvidia-ml-py 12.575 at least) declares clusterUuid 80 bytes long instead of 16, so its
    state and status fields sit past what the library writes."""
    _fields_ = [("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8)]


class FabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t as nvml.h lays it out (nvmlGpuFabricState_t is an unsigned char:
    pynvml's wider field would also read the padding after it)."""
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32)]

    def __init__(self) -> None:
        super().__init__(version=ctypes.sizeof(FabricInfoV2) | (2 << 24))   # nvmlGpuFabricInfo_v2


class FabricInfoV3(ctypes.Structure):
    """nvmlGpuFabricInfo_v3_t: v2 and ``healthSummary`` (NVML_GPU_FABRIC_HEALTH_SUMMARY_*), the
    fields named and placed as pynvml's ``c_nvmlGpuFabricInfo_v3_t`` (nvidia-ml-py 13.x) places
    them but for the state, the one byte nvml.h gives it. Its version is pynvml's
    ``nvmlGpuFabricInfo_v3`` (0x3000028). Drivers before R570 answer it with
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH (the probe then asks with v2)."""
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32),
                ("healthSummary", ctypes.c_uint8)]

    def __init__(self) -> None:
        super().__init__(version=ctypes.sizeof(FabricInfoV3) | (3 << 24))   # nvmlGpuFabricInfo_v3


# The versioned call with v3 (R570+; fabric health), with v2 (R550+), then v1 (R525..R545, kept
# by later branches). pynvml < 12.550 has no wrapper for the versioned call: then v1 is all it
# can ask, on any driver.
FABRIC_CALLS = (("nvmlDeviceGetGpuFabricInfoV", FabricInfoV3), ("nvmlDeviceGetGpuFabricInfoV", FabricInfoV2),
                ("nvmlDeviceGetGpuFabricInfo", FabricInfoV1))
