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


# R550+ has the versioned call, R525..R545 only v1 (which later branches keep). pynvml
# < 12.550 has no wrapper for the versioned call: then v1 is all it can ask, on any driver.
FABRIC_CALLS = (("nvmlDeviceGetGpuFabricInfoV", FabricInfoV2), ("nvmlDeviceGetGpuFabricInfo", FabricInfoV1))
