"""Simulated node profiles: schema, defaults, loading and dotted-path injection."""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

from ..safeio import datafiles, tomlio
from ..facts import GPU_RECOVERY_ACTIONS, NVML_UNSUPPORTED_NAMES
from ..safeio.fsutil import name_problem
from ..schema import Field, Problem, merge, validate

# NVML's counters are unsigned long long; a value past that is no reading a driver gives.
COUNTER_MAX = 2 ** 64 - 1
# Beside the live profile: one empty file per process that holds the node's GPUs open (NVML
# initialised through the simulated pynvml), named by its pid; what makes the simulated reset refuse.
HOLDERS_DIR = "open"
_INT0 = Field(int, minimum=0, maximum=COUNTER_MAX)

# fabric.health_summary's names -> NVML_GPU_FABRIC_HEALTH_SUMMARY_* values.
FABRIC_HEALTH_SUMMARY_NAMES = {"not_supported": 0, "healthy": 1, "unhealthy": 2, "limited_capacity": 3}
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _uuid_problem(value: str) -> Optional[str]:
    return None if _UUID.fullmatch(value) else f"{value!r} is not a UUID"


def _mig_uuid_problem(value: str) -> Optional[str]:
    if value.startswith("MIG-") and 4 < len(value) <= 95 and value.isascii() and value.isprintable():
        return None
    return f"{value!r} is not a MIG device UUID"


def _driver_version_problem(value: str) -> Optional[str]:
    from ..driver_support import branch_of

    try:
        branch_of(value)
    except ValueError as exc:
        return str(exc)
    return None

GPU_SCHEMA: Dict[str, Any] = {
    "name": Field(str),
    "uuid": Field(str),
    "pci_bus_id": Field(str),
    "minor_number": Field(int, minimum=-1),      # -1: the GPU's place in the profile
    # lost: NVML answers GPU_IS_LOST; unknown_error: its handle fails with NVML_ERROR_UNKNOWN
    # (what a GPU that fell off the bus often gives instead); hang: never answers.
    "state": Field(str, choices=("ok", "lost", "unknown_error", "hang", "absent")),
    # A GPU that falls off the bus in the middle of a probe: after this many calls about it
    # (since nvmlInit) it answers GPU_IS_LOST; -1: never.
    "lost_after_calls": Field(int, minimum=-1),
    # A lemon: the GPU falls off the bus again after each `slurm-gpu sim reboot` (state "lost").
    "lost_every_boot": Field(bool),
    # What the driver asks for (NVML's GPU recovery action, field 230; drivers before R570
    # do not know the field and answer it as not supported).
    "recovery_action": Field(str, choices=tuple(GPU_RECOVERY_ACTIONS.values())),
    # NVLink-C2C links to the CPU (a Grace-Blackwell superchip's), each link's status: 1 active,
    # 0 inactive (absent or []: none; drivers before R525 answer the fields as not supported).
    "c2c_links": Field(list, item=Field(int, minimum=0)),
    "temperature_c": Field(float),
    "temperature_slowdown_c": Field(float),
    "power_w": Field(float, minimum=0),
    "power_limit_w": Field(float, minimum=0),
    "clock_event_reasons": _INT0,
    "pcie": {"gen": _INT0, "gen_max": _INT0, "width": _INT0, "width_max": _INT0},
    # The kernel's PCIe AER counters of the GPU's PCI device since boot (rendered as sysfs
    # aer_dev_{fatal,nonfatal,correctable}; `sim reboot` clears them); enabled = false: a device
    # without AER (no such files).
    "aer": {"enabled": Field(bool), "fatal": _INT0, "nonfatal": _INT0, "correctable": _INT0},
    "ecc_enabled": Field(bool),
    "ecc": {"volatile_corrected": _INT0, "volatile_uncorrected": _INT0,
            "aggregate_corrected": _INT0, "aggregate_uncorrected": _INT0},
    "remapped_rows": {"correctable": _INT0, "uncorrectable": _INT0,
                      "pending": Field(bool), "failure": Field(bool)},
    "retired_pages_pending": Field(bool),
    "nvlink": {
        "links": _INT0,
        "down": Field(list, item=_INT0),
        "errors": Field(dict, values={"replay": _INT0, "recovery": _INT0,
                                      "crc_flit": _INT0, "crc_data": _INT0, "ecc_data": _INT0}),
    },
    "fabric": {"state": Field(str, choices=("not_supported", "not_started", "in_progress", "completed")),
               "status": Field(int),
               # The multi-node NVLink domain (GB200 NVL72; all zeros and 0 on a single HGX box)
               # and fabric info v3's health (drivers R570+ answer it; older ones refuse v3).
               "cluster_uuid": Field(str, check=lambda v: _uuid_problem(v), doc="a UUID, 8-4-4-4-12 hex digits"),
               "clique_id": Field(int, minimum=0, maximum=2 ** 32 - 1),
               "health_summary": Field(str, choices=tuple(FABRIC_HEALTH_SUMMARY_NAMES)),
               "health_mask": Field(int, minimum=0, maximum=2 ** 32 - 1)},
    "processes": Field(list, item={"pid": _INT0, "used_memory_mib": _INT0}),
    # MIG: whether it is on and the MIG devices (one GPU instance + compute instance each) the
    # driver serves; a MIG device's UUID is opaque (R470+: MIG-<uuid>; "": derived from the GPU's
    # place and the device's). GPUs without MIG list "mig" in not_supported.
    "mig": {"enabled": Field(bool),
            "devices": Field(list, item={"uuid": Field(str, check=lambda v: _mig_uuid_problem(v) if v else None,
                                                       doc="MIG-<uuid> or the pre-R470 MIG-GPU-<uuid>/<gi>/<ci>"),
                                         "gpu_instance": Field(int, minimum=0, maximum=2 ** 32 - 2, required=True),
                                         "compute_instance": Field(int, minimum=0, maximum=2 ** 32 - 2,
                                                                   required=True),
                                         "profile": Field(str)})},
    "not_supported": Field(list, item=Field(str, choices=NVML_UNSUPPORTED_NAMES)),
    # Where the GPU sits (rendered as sysfs PCI devices): its NUMA node (-1 unknown) and the
    # PCIe switch above it ("": directly under the root complex).
    "numa_node": Field(int, minimum=-1),
    "pcie_switch": Field(str, check=lambda v: _file_name_problem(v) if v else None, doc="a single file name: no '/', not starting with '.', no control characters"),
}

def _file_name_problem(name: str) -> Optional[str]:
    problem = name_problem(name)
    return f"{name!r} {problem}" if problem else None


def _file_names_problem(table: Dict[str, Any]) -> Optional[str]:
    """Counter names become file names under the rendered sysfs tree."""
    for key in table:
        problem = _file_name_problem(key)
        if problem:
            return problem
    return None


def _gid_indexes_problem(table: Dict[str, Any]) -> Optional[str]:
    bad = [key for key in table if not (key.isascii() and key.isdigit() and len(key) <= 4)]
    return f"{', '.join(repr(key) for key in bad)} is not a GID index" if bad else None


_FILE_NAME_DOC = "a single file name: no '/', not starting with '.', no control characters"
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


def _pci_problem(value: str) -> Optional[str]:
    return None if _PCI_ADDRESS.fullmatch(value) else f"{value!r} is not a PCI address"

IB_SCHEMA: Dict[str, Any] = {
    "hca": Field(str, required=True, check=_file_name_problem, doc=_FILE_NAME_DOC),
    "port": Field(int, minimum=1, required=True),
    "state": Field(str),
    "phys_state": Field(str),
    "rate": Field(str),
    "link_layer": Field(str, choices=("InfiniBand", "Ethernet")),
    "counters": Field(dict, values=Field(int, minimum=0, maximum=COUNTER_MAX), check=_file_names_problem, doc=_FILE_NAME_DOC),
    "gid_types": Field(dict, values=Field(str), check=_gid_indexes_problem, doc="GID indexes 0-9999"),
    "numa_node": Field(int),
    # What the ib_write_bw stand-in measures from this port (Gb/s); negative: 96% of its rate.
    "write_bw_gbps": Field(float, minimum=-1),
    # Where the HCA sits: its PCI address ("": derived from its place in the profile), the
    # PCIe switch above it ("": the root complex), its network interface ("": none).
    "pci_bus_id": Field(str, check=lambda v: _pci_problem(v) if v else None, doc="a PCI address 0000:19:00.0"),
    "pcie_switch": Field(str, check=lambda v: _file_name_problem(v) if v else None, doc=_FILE_NAME_DOC),
    "netdev": Field(str, check=lambda v: _file_name_problem(v) if v else None, doc=_FILE_NAME_DOC),
}

PROFILE_SCHEMA: Dict[str, Any] = {
    "node": {
        # Decides which NVML functions exist (healthcheck/data/nvml-functions.tsv).
        "driver_version": Field(str, check=_driver_version_problem,
                                doc="a driver version such as 535.161.08"),
        "nvml": Field(str, choices=("ok", "missing", "driver_not_loaded", "hang")),
        "description": Field(str),
        "perftest": Field(bool, doc="whether perftest (the ib_write_bw stand-in) is installed"),
        # The IMEX daemon's state as `nvidia-imex-ctl -q` prints it ("": IMEX not installed), and
        # the IMEX channels (/dev/nvidia-caps-imex-channels/channelN) that exist.
        "imex_daemon": Field(str, choices=("", "INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS",
                                            "WAITING_FOR_RECOVERY", "INIT_GPU", "READY", "SHUTTING_DOWN",
                                            "UNAVAILABLE")),
        "imex_channels": Field(list, item=Field(int, minimum=0, maximum=2047)),
    },
    "gpu": Field(list, item=GPU_SCHEMA),
    "ib": Field(list, item=IB_SCHEMA),
    "kernel_log": {"lines": Field(list, item=Field(str))},
    # A fault profile names a healthy one and the few values that differ, in the
    # same dotted syntax as ``slurm-gpu sim inject`` (``"gpu.3.state" = "lost"``).
    "base": Field(str, doc="a profile path, relative to this file"),
    "overrides": Field(dict),
    # The [[nodes]] entry (without match) this node's hardware should match: `slurm-gpu check
    # --sim` judges the profile against it when the config has no entry for the node. A fault
    # profile inherits its base's.
    "hardware": Field(dict, doc="a [[nodes]] entry without match (gpus, gpu_model, ib_ports, ...)"),
    "expect": {
        # What the checks must find on this profile: used by the test suite, `check --sim` and the demo.
        "findings": Field(list, item=Field(str)),
    },
}


class ProfileError(Exception):
    def __init__(self, source: str, problems: List[Problem]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {k}: {w}; {a}" for k, w, a in problems))


def _sim_defaults() -> Dict[str, Any]:
    text = datafiles.read_text("sim-defaults.toml")
    return tomlio.loads(text)


# -- the live profile's completed rendition ---------------------------------------------------
# Every nvmlInit of the simulated driver loads the live profile: a TOML parse of it and of the
# defaults plus a schema walk, 5 ms in each hook's probe that no real driver makes a hook pay.
# SimNode writes the completed profile as JSON next to the live file whenever it writes that
# file, keyed by a hash of the bytes it was made from; a live file changed any other way no
# longer matches and is parsed as before.

def completed_path(live_path: str) -> str:
    return os.path.splitext(live_path)[0] + ".completed.json"


def _made_from(live_bytes: bytes) -> str:
    from ..safeio.sha256 import sha256

    return sha256(live_bytes + b"\0" + datafiles.read_text("sim-defaults.toml").encode("utf-8")).hexdigest()


def completed_rendition(live_bytes: bytes, source: str) -> str:
    """The JSON that ``load_live`` accepts for a live file holding ``live_bytes``."""
    import json

    profile = complete(tomlio.loads(live_bytes.decode("utf-8")), source)
    return json.dumps({"made_from": _made_from(live_bytes), "profile": profile}, sort_keys=True)


def load_live(path: str) -> Dict[str, Any]:
    """The live profile at ``path``, completed (``complete``); from its rendition when that was
    made from these very bytes and defaults."""
    import json

    live = tomlio.read_bytes(path)
    try:
        with open(completed_path(path), "rb") as handle:
            rendition = json.loads(handle.read(tomlio.MAX_TOML_BYTES * 4))
        if isinstance(rendition, dict) and rendition.get("made_from") == _made_from(live):
            return rendition["profile"]
    except (OSError, ValueError):
        pass
    return complete(tomlio.loads(live.decode("utf-8")), path)


def load_profile(path: str, _depth: int = 0) -> Dict[str, Any]:
    try:
        doc = tomlio.load_file(path)
    except FileNotFoundError:
        raise ProfileError(path, [("(file)", "does not exist", "a simulator profile (TOML)")]) from None
    except (tomlio.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(path, [("(syntax)", str(exc), "valid TOML")]) from None
    except (OSError, ValueError) as exc:
        # Not a regular file, too big, a directory, a symlink loop, ENOTDIR, a NUL byte.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ProfileError(path, [("(file)", f"cannot be read ({reason})", "a simulator profile (TOML)")]) from None
    if "base" not in doc:
        return complete(doc, path)
    if _depth > 4:
        raise ProfileError(path, [("base", "nests too deep", "at most 4 levels of base profiles")])
    problems = validate(doc, PROFILE_SCHEMA)
    if problems:
        raise ProfileError(path, problems)
    base = load_profile(os.path.join(os.path.dirname(os.path.abspath(path)), doc["base"]), _depth + 1)
    base["node"] = merge(base["node"], doc.get("node", {}))
    for key in ("gpu", "ib"):
        if key in doc:
            base[key] = complete({key: doc[key]}, path)[key]
    base["kernel_log"]["lines"].extend(doc.get("kernel_log", {}).get("lines", []))
    if "hardware" in doc:
        base["hardware"] = merge(base.get("hardware", {}), doc["hardware"])
    if "expect" in doc:
        base["expect"] = _deepcopy(doc["expect"])
    try:
        return apply_injection(base, list(doc.get("overrides", {}).items()), path)
    except KeyError as exc:
        raise ProfileError(path, [("overrides", str(exc.args[0]), "gpu.N.KEY, ib.HCA:PORT.KEY or node.KEY")]) from None


def complete(doc: Dict[str, Any], source: str) -> Dict[str, Any]:
    """Validate a profile and fill every default, so readers never guess."""
    problems = validate(doc, PROFILE_SCHEMA)
    if problems:
        raise ProfileError(source, problems)
    base = _sim_defaults()
    out: Dict[str, Any] = {"node": merge(base["node"], doc.get("node", {}))}
    out["gpu"] = [_complete_gpu(base["gpu"], g, i) for i, g in enumerate(doc.get("gpu", []))]
    out["ib"] = [merge(base["ib"], p) for p in doc.get("ib", [])]
    out["kernel_log"] = {"lines": list(doc.get("kernel_log", {}).get("lines", []))}
    if "hardware" in doc:
        out["hardware"] = _deepcopy(doc["hardware"])
    if "expect" in doc:
        out["expect"] = _deepcopy(doc["expect"])
    return out


def _complete_gpu(base: Dict[str, Any], gpu: Dict[str, Any], index: int) -> Dict[str, Any]:
    out = merge(base, gpu)
    if not out["uuid"]:
        out["uuid"] = f"GPU-5a1e0000-0000-4000-8000-{index:012x}"
    if not out["pci_bus_id"]:
        out["pci_bus_id"] = f"00000000:{0x18 + 0x10 * index:02X}:00.0"
    if out["minor_number"] < 0:
        # An absent GPU keeps its device file number: the ones after it keep theirs too.
        out["minor_number"] = index
    mig = out["mig"]
    mig["devices"] = [dict(device, profile=device.get("profile", ""), uuid=device.get("uuid") or f"MIG-5a1e0000-0000-4000-9000-{index:04x}{place:08x}")
                      for place, device in enumerate(mig["devices"])]
    return out


# -- dotted-path injection --------------------------------------------------------------

_SEGMENT = re.compile(r"[^.]+")


def _split_key(key: str) -> List[str]:
    """``ib.mlx5_2:1.state`` -> ["ib", "mlx5_2:1", "state"]; HCA names hold no dots."""
    return _SEGMENT.findall(key)


def _find_port(ports: List[Dict[str, Any]], ref: str) -> Dict[str, Any]:
    hca, _, port = ref.partition(":")
    for entry in ports:
        if entry["hca"] == hca and str(entry["port"]) == (port or "1"):
            return entry
    raise KeyError(f"no IB port {ref!r} in this profile")


def set_path(profile: Dict[str, Any], key: str, value: Any) -> None:
    """Apply one ``KEY=VALUE`` from ``sim inject`` to a completed profile (in place)."""
    parts = _split_key(key)
    if len(parts) < 2:
        raise KeyError(f"{key!r} is not a dotted path such as gpu.3.state or ib.mlx5_0:1.state")
    head, ref, rest = parts[0], parts[1], parts[2:]
    if head == "gpu":
        if not ref.isdigit() or int(ref) >= len(profile["gpu"]):
            raise KeyError(f"no GPU {ref!r} (this profile has {len(profile['gpu'])})")
        target = profile["gpu"][int(ref)]
    elif head == "ib":
        target = _find_port(profile["ib"], ref)
    elif head == "node":
        target, rest = profile["node"], [ref] + rest
    else:
        raise KeyError(f"{key!r} must start with gpu.N, ib.HCA:PORT or node.")
    if not rest:
        raise KeyError(f"{key!r} names a whole GPU or port; name a field inside it")
    for part in rest[:-1]:
        target = target.setdefault(part, {})
        if not isinstance(target, dict):
            raise KeyError(f"{key!r}: {part!r} is not a table")
    target[rest[-1]] = value


def apply_injection(profile: Dict[str, Any], assignments: List[Tuple[str, Any]], source: str) -> Dict[str, Any]:
    """A new, validated profile with the assignments applied; the input is untouched."""
    updated = _deepcopy(profile)
    for key, value in assignments:
        set_path(updated, key, value)
    problems = validate(updated, PROFILE_SCHEMA)
    if problems:
        raise ProfileError(source, problems)
    return updated


def parse_assignment(text: str) -> Tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r} is not KEY=VALUE")
    try:
        value = tomlio.parse_value(raw)
    except tomlio.TOMLDecodeError:
        # An unquoted word (state=lost) is what people type; take it as a string.
        if raw and re.fullmatch(r"[A-Za-z_][\w\-: ]*", raw):
            value = raw
        else:
            raise ValueError(f"{raw!r} is not a TOML value (quote strings: \"1: DOWN\")") from None
    return key.strip(), value


def _deepcopy(value: Any) -> Any:
    import copy             # only when a profile is built or changed, not when a hook reads the live one

    return copy.deepcopy(value)
