"""Slurm's GPU indices -> NVML's, through the device files' minor numbers.

``SLURM_JOB_GPUS`` holds GRES indices: positions in Slurm's list of the node's GPU device files,
which Slurm orders by the files' numeric suffix (``nvidia0``, ``nvidia1``, ...; gres.conf lists
them so, and AutoDetect sorts them so). NVML numbers GPUs by PCI bus order, and the driver's
minor numbers (``/dev/nvidiaN`` is ``c 195 N``) need not follow it. So GRES index i is the i-th
device file, whose minor number m is the GPU for which ``nvmlDeviceGetMinorNumber`` says m.
"""
from __future__ import annotations

import os
import re
import stat
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

_DEVICE = re.compile(r"^nvidia([0-9]+)$")


def parse_gpu_list(text: Optional[str]) -> Optional[List[int]]:
    """"3,4" / "0-2,5" -> [3, 4] / [0, 1, 2, 5]; None when the job has no GPUs (no variable)."""
    if text is None or not text.strip():
        return None
    indices: List[int] = []
    for part in text.split(","):
        part = part.strip()
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"SLURM_JOB_GPUS {text!r} is not a list of GPU indices")
        indices.extend(range(int(low), int(high) + 1) if sep else [int(low)])
    return indices


def device_minors(directory: str) -> List[Tuple[str, int]]:
    """The ``nvidiaN`` character devices in ``directory`` as (name, minor), in Slurm's order.
    Links are not followed: a device file is what the driver (or the lab) made."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        match = _DEVICE.match(name)
        if not match:
            continue
        try:
            info = os.lstat(os.path.join(directory, name))
        except OSError:
            continue
        if stat.S_ISCHR(info.st_mode):
            found.append((int(match.group(1)), name, os.minor(info.st_rdev)))
    return [(name, minor) for _, name, minor in sorted(found)]


def gres_to_nvml(gres: Iterable[int], devices: List[Tuple[str, int]],
                 nvml_minors: Mapping[int, Optional[int]]) -> Tuple[List[int], str]:
    """Map GRES indices to NVML indices. ``devices`` from ``device_minors``, ``nvml_minors``
    NVML index -> minor number (None: NVML could not read it, as for a GPU that fell off the bus).

    Returns (indices, how): "minor" when every index mapped through minor numbers; "minor,
    unreadable" when a device file's minor matched no readable GPU and was taken to be the GPU(s)
    whose minor NVML could not read (a lost GPU is exactly the one to catch: when in doubt the job
    gets those GPUs judged); "identity (why)" when there is nothing to map with -- GRES index =
    NVML index, right whenever the driver numbered devices in PCI order."""
    gres = list(gres)
    by_minor: Dict[int, int] = {minor: index for index, minor in nvml_minors.items() if minor is not None}
    unreadable = sorted(index for index, minor in nvml_minors.items() if minor is None)
    if not devices:
        return gres, "identity (no nvidiaN device files found)"
    if not by_minor:
        return gres, "identity (NVML gave no minor numbers)"
    mapped: List[int] = []
    how = "minor"
    for index in gres:
        if index >= len(devices):
            return gres, f"identity (GRES index {index} but only {len(devices)} device files)"
        minor = devices[index][1]
        if minor in by_minor:
            mapped.append(by_minor[minor])
        elif unreadable:
            mapped.extend(i for i in unreadable if i not in mapped)
            how = "minor, unreadable"
        else:
            return gres, f"identity (no NVML GPU has minor number {minor})"
    return mapped, how


def devices_dir(template: str, node: str) -> str:
    """``[prolog] gpu_devices`` with ``{node}`` replaced (the lab keeps one directory per node)."""
    return template.replace("{node}", node)


# -- MIG --------------------------------------------------------------------------------------------
# With gres.conf MIG types (AutoDetect=nvml, or File= lists of /dev/nvidia-caps files), Slurm's GPU
# list holds MIG devices: SLURM_JOB_GPUS indexes that list (no nvidiaN file of its own), and
# CUDA_VISIBLE_DEVICES names the job's MIG devices by UUID. A MIG UUID is opaque from R470 on
# (MIG-<uuid>; R450's MIG-GPU-<uuid>/<gi>/<ci> is matched whole, never taken apart): its parent
# GPU is the one NVML says (the probe's mig_devices, from the MIG handle's parent handle).

def mig_uuids(*texts: Optional[str]) -> List[str]:
    """The MIG device UUIDs in comma-separated lists (CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS), in order."""
    found: List[str] = []
    for text in texts:
        for part in (text or "").split(","):
            part = part.strip()
            if part.startswith("MIG-") and part not in found:
                found.append(part)
    return found


def mig_to_parents(uuids: Iterable[str], gpus: Iterable[Any]) -> Tuple[List[int], List[Dict[str, Any]], str]:
    """The job's MIG devices -> their parent GPUs' NVML indices (pure: ``gpus`` are the NVML
    probe's GpuFacts). Returns (parents, instances, how); each instance names its MIG device and
    its GPU ({"uuid", "gpu", "gpu_uuid", "gpu_instance", "compute_instance"}).

    A UUID no GPU lists is taken to be on the GPU(s) whose MIG devices NVML could not read (a
    lost parent answers nothing about its instances: exactly the one to judge), "mig, unreadable";
    when no GPU is unread, every GPU is judged ("mig, unknown ...")."""
    gpus = list(gpus)
    by_uuid = {g.uuid: g for g in gpus if g.uuid}
    owner: Dict[str, Tuple[Any, Dict[str, Any]]] = {}
    for gpu in gpus:
        for device in gpu.mig_devices or ():
            parent = by_uuid.get(device.get("parent_uuid")) or gpu
            if device.get("uuid"):
                owner[device["uuid"]] = (parent, device)
    unread = [g.index for g in gpus if g.state != "ok" or (g.mig_mode == 1 and g.mig_devices is None)]
    parents: List[int] = []
    instances: List[Dict[str, Any]] = []
    how = "mig"
    for uuid in uuids:
        if uuid in owner:
            parent, device = owner[uuid]
            instances.append({"uuid": uuid, "gpu": parent.index, "gpu_uuid": parent.uuid,
                              "gpu_instance": device.get("gpu_instance"),
                              "compute_instance": device.get("compute_instance")})
            found = [parent.index]
        elif unread:
            instances.append({"uuid": uuid, "gpu": None, "gpu_uuid": None, "gpu_instance": None,
                              "compute_instance": None})
            found, how = unread, "mig, unreadable"
        else:
            instances.append({"uuid": uuid, "gpu": None, "gpu_uuid": None, "gpu_instance": None,
                              "compute_instance": None})
            found, how = [g.index for g in gpus], f"mig, unknown (no GPU has MIG device {uuid}: every GPU judged)"
        parents.extend(i for i in found if i not in parents)
    return parents, instances, how


def has_mig(gpus: Iterable[Any]) -> bool:
    """Whether NVML says a GPU of the node is in MIG mode."""
    return any(g.mig_mode == 1 for g in gpus)
