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
        minor = _char_minor(os.path.join(directory, name)) if match else None
        if minor is not None:
            found.append((int(match.group(1)), name, minor))
    return [(name, minor) for _, name, minor in sorted(found)]


def _char_minor(path: str) -> Optional[int]:
    """The minor number of the character device at ``path`` (``lstat``: a link is not followed);
    None when it is none."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return os.minor(info.st_rdev) if stat.S_ISCHR(info.st_mode) else None


def owners_of_minor(minor: int, by_minor: Mapping[int, Any], unread: List[Any]) -> List[Any]:
    """The GPU(s) a device file's minor number belongs to: the readable GPU with that minor, else
    every GPU whose minor NVML could not read (a GPU that fell off the bus has none to match, and
    is exactly the one to catch)."""
    return [by_minor[minor]] if minor in by_minor else list(unread)


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
        owners = owners_of_minor(minor, by_minor, unreadable)
        if not owners:
            return gres, f"identity (no NVML GPU has minor number {minor})"
        if minor not in by_minor:
            how = "minor, unreadable"
        mapped.extend(i for i in owners if i not in mapped)
    return mapped, how


def devices_dir(template: str, node: str) -> str:
    """``[prolog] gpu_devices`` with ``{node}`` replaced (the lab keeps one directory per node)."""
    return template.replace("{node}", node)


# -- MIG --------------------------------------------------------------------------------------------
# With gres.conf MIG types, Slurm's GPU list holds MIG devices: SLURM_JOB_GPUS indexes that list
# (no nvidiaN file of its own). Where CUDA_VISIBLE_DEVICES names the job's MIG devices by UUID
# (NVML autodetection; not measured here), the UUIDs say which. A MIG UUID is opaque from R470 on
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


# -- MIG devices a site lists in gres.conf ------------------------------------------------------------
# Without NVML autodetection a site lists each MIG device in gres.conf as one GRES: Type=<profile>
# MultipleFiles=/dev/nvidiaN,/dev/nvidia-caps/nvidia-capM, the parent GPU's device file and the
# instance's capability file (Slurm 22.05's gres.conf has no UniqueId, and refuses a MultipleFiles=
# of one file: whole GPUs are File= lines). Slurm then gives the Prolog and Epilog GRES indices
# only, in SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES alike; and for a job asking for two MIG types
# at once, only the last type's. Measured on 22.05 (docs/slurm-versions.md): the indices follow
# the node's Gres= in slurm.conf type by type, and within a type gres.conf's lines in their order,
# a File= range one index per file. So the indices name the job's MIG devices in its record,
# while every GPU of the node is still judged: some of the job's may be missing from them.

_CAP = re.compile(r"^nvidia-cap([0-9]+)$")
_MIG_MINOR = re.compile(r"^gpu([0-9]+)/gi([0-9]+)(?:/ci([0-9]+))?/access\s+([0-9]+)$")
MAX_CONFIG_BYTES = 1 << 20


def _fields(line: str) -> Dict[str, str]:
    """A Slurm config line's key=value words (keys in lower case), comments dropped."""
    fields = {}
    for word in line.split("#", 1)[0].split():
        key, sep, value = word.partition("=")
        if sep:
            fields[key.lower()] = value
    return fields


def gres_gpu_types(slurm_conf: str, node: str) -> Optional[List[str]]:
    """The GPU types of ``node``'s Gres= in slurm.conf (its NodeName line's, else the NodeName=
    DEFAULT before it), in their order; [] when its GPUs are counted untyped; None when no line of
    this text gives the node's Gres (an Include, a configless node: not known)."""
    import hostlist

    default: Optional[str] = None
    for line in slurm_conf.splitlines():
        fields = _fields(line)
        name = fields.get("nodename")
        if name is None:
            continue
        if name.lower() == "default":
            default = fields.get("gres", default)
            continue
        try:
            if node not in hostlist.expand_hostlist(name):
                continue
        except hostlist.BadHostlist:
            continue
        gres = fields.get("gres", default)
        if gres is None:
            return None
        types: List[str] = []
        for item in gres.split(","):
            parts = item.split("(", 1)[0].split(":")
            if parts[0] != "gpu":
                continue
            kind = parts[1] if len(parts) == 3 or (len(parts) == 2 and not parts[1].isdigit()) else None
            if kind is None:
                return []
            if kind not in types:
                types.append(kind)
        return types
    return None


def gres_mig_files(text: str, node: str, types: Optional[List[str]] = None) -> List[List[str]]:
    """The device files of each of the node's GPU GRES indices, in Slurm's order (``types`` from
    ``gres_gpu_types``: that order of types, gres.conf's within each; [] or None: gres.conf's),
    when gres.conf lists MIG devices (a ``MultipleFiles=`` line); [] when it does not, or when a
    line's type is not among ``types`` (the order is not known then)."""
    import hostlist

    listed: List[Tuple[str, List[str]]] = []
    mig = False
    for raw in text.splitlines():
        fields = _fields(raw)
        if fields.get("name") != "gpu":
            continue
        try:
            if "nodename" in fields and node not in hostlist.expand_hostlist(fields["nodename"]):
                continue
            kind = fields.get("type", "")
            if "multiplefiles" in fields:
                listed.append((kind, hostlist.expand_hostlist(fields["multiplefiles"])))
                mig = True
            elif "file" in fields:
                listed += [(kind, [path]) for path in hostlist.expand_hostlist(fields["file"])]
            else:
                return []           # AutoDetect, or a count alone: the devices are not named here
        except hostlist.BadHostlist:
            return []
    if not mig:
        return []
    if types:
        if any(kind not in types for kind, _ in listed):
            return []
        listed.sort(key=lambda entry: types.index(entry[0]))     # stable: gres.conf's order within a type
    return [files for _, files in listed]


def mig_cap_minors(text: str) -> Dict[int, Tuple[int, int, Optional[int]]]:
    """``/proc/driver/nvidia-caps/mig-minors``: capability minor -> (GPU minor, GPU instance,
    compute instance or None for a GPU instance's own capability)."""
    caps: Dict[int, Tuple[int, int, Optional[int]]] = {}
    for line in text.splitlines():
        match = _MIG_MINOR.match(line.strip())
        if match:
            gpu, gi, ci, minor = match.groups()
            caps[int(minor)] = (int(gpu), int(gi), int(ci) if ci is not None else None)
    return caps


def mig_devices_of(files: List[str]) -> Tuple[Optional[int], Optional[int]]:
    """One gres.conf MultipleFiles= list -> (parent GPU minor, capability minor): each file's
    minor number, else the number its name ends with (a file not there, as on a host that lists
    devices it has not made yet)."""
    found: Dict[Any, Optional[int]] = {_DEVICE: None, _CAP: None}
    for path in files:
        for pattern in found:
            match = pattern.match(os.path.basename(path))
            if match and found[pattern] is None:
                minor = _char_minor(path)
                found[pattern] = int(match.group(1)) if minor is None else minor
    return found[_DEVICE], found[_CAP]


def mig_from_gres(gres: Iterable[int], devices: List[Tuple[Optional[int], Optional[int]]],
                  caps: Mapping[int, Tuple[int, int, Optional[int]]], gpus: Iterable[Any]) -> List[Dict[str, Any]]:
    """The job's MIG devices from its GRES indices (pure): ``devices`` per index (parent minor,
    capability minor), ``caps`` from ``mig_cap_minors``, ``gpus`` the NVML probe's GpuFacts.
    Each {"gres_index", "uuid", "gpu", "gpu_uuid", "gpu_instance", "compute_instance"}, None where
    unknown. A parent NVML cannot read (a lost GPU has no minor number to match) answers nothing
    of its instances: a minor no readable GPU has is the unread GPU's when there is exactly one
    (``owners_of_minor``, the rule ``gres_to_nvml`` uses)."""
    gpus = list(gpus)
    by_minor = {g.minor_number: g for g in gpus if g.minor_number is not None}
    unread = [g for g in gpus if g.minor_number is None]
    found: List[Dict[str, Any]] = []
    for index in gres:
        parent_minor, cap = devices[index] if 0 <= index < len(devices) else (None, None)
        gpu_minor, gi, ci = caps.get(cap, (parent_minor, None, None)) if cap is not None else (parent_minor, None, None)
        owners = owners_of_minor(gpu_minor, by_minor, unread) if gpu_minor is not None else []
        parent = owners[0] if len(owners) == 1 else None
        device: Dict[str, Any] = {}
        if parent is not None and gi is not None:
            matches = [d for d in parent.mig_devices or () if d.get("gpu_instance") == gi
                       and (ci is None or d.get("compute_instance") == ci)]
            device = matches[0] if len(matches) == 1 else {}
        found.append({"gres_index": index, "uuid": device.get("uuid"),
                      "gpu": parent.index if parent is not None else None,
                      "gpu_uuid": parent.uuid if parent is not None else None,
                      "gpu_instance": gi, "compute_instance": device.get("compute_instance", ci)})
    return found
