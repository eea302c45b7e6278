"""A simulated node's live state: a copy of its profile in the state dir, plus the
sysfs tree and kernel-log file rendered from it.

Layout under ``<state_dir>/sim/<node>/``::

    profile.toml          the live profile (what ``sim inject`` changes)
    profile.completed.json  the same, completed, as each simulated ``nvmlInit`` reads it
                          (``profile.load_live``; ignored once profile.toml changes otherwise)
    source                the shipped profile it was made from (for ``sim reset``)
    sys/class/infiniband  the rendered IB ports (the sysfs reader's root is ``sys``)
    sys/devices, sys/bus/pci/devices   the GPUs' and HCAs' PCI devices (NUMA node, PCIe switch;
                          a GPU's PCIe AER counters, aer_dev_{fatal,nonfatal,correctable})
    proc/driver/nvidia/gpus            the driver's information file per GPU (device minor)
    kern.log              the kernel log (``--log`` lines are appended, never rewritten)
    boot_id               the node's boot id (``/proc/sys/kernel/random/boot_id``); ``sim reboot``
                          and ``sim reset`` (a reboot into mended hardware) change it
    bin/ib_write_bw       perftest's stand-in (``[node] perftest = true``; healthcheck/sim/sim_ib_write_bw.py)
    bin/nvidia-smi        nvidia-smi's stand-in for a GPU reset (healthcheck/sim/sim_nvidia_smi.py)
    bin/nvidia-imex-ctl   the IMEX daemon's query tool, answering ``-q`` with ``[node] imex_daemon``
                          (absent when that is "": IMEX not installed)
    dev/nvidia-caps-imex-channels/channelN   the IMEX channels (``[node] imex_channels``)
    open/<pid>            a process that holds the GPUs open (NVML initialised through sim_pynvml)
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..safeio import tomlio
from ..facts import AER_CORRECTABLE_NAMES, AER_FILES, AER_KINDS, AER_TOTALS, AER_UNCORRECTABLE_NAMES, IB_COUNTER_BITS
from ..safeio.fsutil import (_process_alive, append_line, atomic_write, ensure_dir, ensure_state_dir, locked,
                             path_component)
from . import profile as profiles


class SimNode:
    def __init__(self, state_dir: str, node: str, profile_path: Optional[str] = None):
        self.node = path_component(node)
        self.state_dir = state_dir
        self.profile_path = profile_path
        self.dir = os.path.join(state_dir, "sim", node)
        self.live_path = os.path.join(self.dir, "profile.toml")
        self.source_path = os.path.join(self.dir, "source")
        self.sysfs_root = os.path.join(self.dir, "sys")
        self.proc_root = os.path.join(self.dir, "proc")
        self.kernel_log_path = os.path.join(self.dir, "kern.log")
        self.boot_id_path = os.path.join(self.dir, "boot_id")
        self.programs_dir = os.path.join(self.dir, "bin")
        self.dev_root = os.path.join(self.dir, "dev")
        self._lock_path = os.path.join(self.dir, ".lock")

    # -- lifecycle -------------------------------------------------------------------------
    def ensure(self) -> Dict[str, Any]:
        """The live profile, created from the shipped one on first use."""
        return self.prepare() or self.load()

    def prepare(self) -> Optional[Dict[str, Any]]:
        """Make sure the live state exists (created from the shipped profile on first use).

        Returns the profile when it had to be written, None when the node was ready: the hooks
        only need the files (each ``nvmlInit`` reads the live profile itself), so a ready node
        costs a few stat calls, not a TOML parse a real node would never do."""
        ensure_state_dir(self.state_dir)
        if os.path.exists(self.live_path) and self._source_unchanged() and os.path.exists(self.boot_id_path):
            return None
        with locked(self._lock_path):
            if os.path.exists(self.live_path) and self._source_unchanged():
                if not os.path.exists(self.boot_id_path):
                    self._new_boot()
                return None
            return self._start_from_profile()

    def reset(self) -> Dict[str, Any]:
        with locked(self._lock_path):
            return self._start_from_profile()

    def reboot(self) -> Dict[str, Any]:
        """A reboot: a new boot id, an empty kernel log, and what a reboot clears cleared (a
        lost or hung GPU answers again, volatile ECC counts restart, pending row remaps and
        page retirements are applied, the driver's recovery action is back to none). What
        hardware keeps stays (the PCIe AER counters restart at boot, not at a GPU reset): lifetime ECC counts, a row remap failure, a link or port that is
        down, a missing GPU; a GPU with ``lost_every_boot`` (a lemon) falls off the bus again."""
        self.ensure()
        with locked(self._lock_path):
            live = self.load()
            for gpu in live["gpu"]:
                _cleared(gpu)
                _aer_cleared(gpu)
                if gpu.get("lost_every_boot") and gpu.get("state") != "absent":
                    gpu["state"] = "lost"
            if live.get("node", {}).get("nvml") == "hang":
                live["node"]["nvml"] = "ok"
            live["kernel_log"]["lines"] = []
            self._write(live)
            atomic_write(self.kernel_log_path, "")
            self._new_boot()
            return live

    def gpu_reset(self, target: str) -> Tuple[int, str]:
        """A GPU reset (``nvidia-smi --gpu-reset -i TARGET``) of one GPU, named by index, PCI bus id
        or UUID: what a reset clears cleared on that GPU alone (as a reboot clears it), the boot
        and the kernel log unchanged. Refused, changing nothing, when a process holds the GPU (a
        job's process in the profile, or a live process with NVML initialised on the node) or the
        GPU is absent. (exit status, what nvidia-smi prints)."""
        self.ensure()
        with locked(self._lock_path):
            live = self.load()
            gpu = find_gpu(live["gpu"], target)
            if gpu is None or gpu.get("state") == "absent":
                return 6, f"No devices were found matching {target!r}."
            bus_id = str(gpu.get("pci_bus_id", ""))
            if gpu.get("processes") or self.holders():
                return 255, (f"GPU {bus_id}: Unable to reset this GPU because it's being used by some other "
                             "process (e.g. CUDA application, graphics application like X server, monitoring "
                             "application like other instance of nvidia-smi). Please first kill all processes "
                             "using this GPU and all compute applications running in the system.")
            _cleared(gpu)
            self._write(live)
            return 0, f"GPU {bus_id} was successfully reset.\nAll done."

    def holders(self) -> List[int]:
        """The live processes that hold this node's GPUs open (``sim_pynvml``'s ``open/<pid>``);
        a dead one's file is removed."""
        folder = os.path.join(self.dir, profiles.HOLDERS_DIR)
        try:
            names = os.listdir(folder)
        except OSError:
            return []
        alive = []
        for name in names:
            if not name.isdigit():
                continue
            if _process_alive(int(name)):
                alive.append(int(name))
            else:
                try:
                    os.unlink(os.path.join(folder, name))
                except OSError:
                    pass
        return alive

    def boot_id(self) -> str:
        try:
            with open(self.boot_id_path, encoding="ascii") as handle:
                return handle.read().strip()
        except OSError:
            return ""

    def _new_boot(self) -> None:
        import uuid         # only at a (simulated) boot: with platform, 3 ms on every hook's path

        atomic_write(self.boot_id_path, str(uuid.uuid4()) + "\n")

    def load(self) -> Dict[str, Any]:
        return profiles.complete(tomlio.load_file(self.live_path), self.live_path)

    def inject(self, assignments: List[Tuple[str, Any]], log_lines: Iterable[str] = ()) -> Dict[str, Any]:
        self.ensure()
        with locked(self._lock_path):
            live = self.load()
            updated = profiles.apply_injection(live, assignments, self.live_path)
            lines = [line for line in log_lines]
            updated["kernel_log"]["lines"].extend(lines)
            self._write(updated)
            for line in lines:
                append_line(self.kernel_log_path, line)
            return updated

    # -- internals -------------------------------------------------------------------------
    def _source_unchanged(self) -> bool:
        """A node rebound to another profile starts over; the same profile keeps its injections."""
        if self.profile_path is None:
            return True
        try:
            with open(self.source_path, encoding="utf-8") as handle:
                return handle.read().strip() == os.path.abspath(self.profile_path)
        except FileNotFoundError:
            return False

    def _start_from_profile(self) -> Dict[str, Any]:
        if not self.profile_path:
            raise profiles.ProfileError(self.node, [("(node)", "has no simulator profile",
                                                     "[sim] profile or [sim] nodes.<node> in the config")])
        profile = profiles.load_profile(self.profile_path)
        ensure_dir(self.dir)
        atomic_write(self.source_path, os.path.abspath(self.profile_path) + "\n")
        self._write(profile)
        # A reset is a reboot into mended hardware: a new boot id, and the kernel log starts
        # again (readers see it shrink).
        atomic_write(self.kernel_log_path, "".join(line + "\n" for line in profile["kernel_log"]["lines"]))
        self._new_boot()
        return profile

    def _write(self, profile: Dict[str, Any]) -> None:
        text = tomlio.dumps(profile)
        # The rendition first: a live file newer than its rendition no longer matches it.
        atomic_write(profiles.completed_path(self.live_path),
                     profiles.completed_rendition(text.encode("utf-8"), self.live_path))
        atomic_write(self.live_path, text)
        render_sysfs(profile, self.sysfs_root)
        render_driver_proc(profile, self.proc_root)
        render_programs(profile, self.programs_dir, self.live_path)
        render_imex(profile, self.programs_dir, self.dev_root)


def _cleared(gpu: Dict[str, Any]) -> None:
    """What a reboot or a GPU reset clears on one GPU: a lost or hung GPU answers again, volatile
    ECC counts restart, a pending row remap and pending page retirements are applied, the
    driver's recovery action is back to none."""
    if gpu.get("state") in ("lost", "hang"):
        gpu["state"] = "ok"
    if gpu.get("lost_after_calls", -1) >= 0:
        gpu["lost_after_calls"] = -1
    for key in list(gpu.get("ecc", {})):
        if key.startswith("volatile_"):
            gpu["ecc"][key] = 0
    rows = gpu.get("remapped_rows")
    if isinstance(rows, dict) and rows.get("pending"):
        rows["pending"] = False
    if gpu.get("retired_pages_pending"):
        gpu["retired_pages_pending"] = False
    gpu["recovery_action"] = "none"


def find_gpu(gpus: List[Dict[str, Any]], target: str) -> Optional[Dict[str, Any]]:
    """The GPU ``nvidia-smi -i`` names: an index, a PCI bus id (NVML's 00000000:18:00.0 or
    sysfs' 0000:18:00.0, any case) or a UUID."""
    target = target.strip()
    for index, gpu in enumerate(gpus):
        bus_id = str(gpu.get("pci_bus_id", ""))
        if target == str(index) or target == gpu.get("uuid") or (
                bus_id and ":" in target and sysfs_address(bus_id) == sysfs_address(target)):
            return gpu
    return None


def render_programs(profile: Dict[str, Any], programs_dir: str, live_path: str) -> None:
    """The stand-in programs this node has: ``nvidia-smi`` (its GPU reset,
    ``healthcheck/sim/sim_nvidia_smi.py``), and ``ib_write_bw`` when perftest is installed."""
    ensure_dir(programs_dir)
    sim_dir = os.path.dirname(os.path.abspath(live_path))
    state_dir, node = os.path.dirname(os.path.dirname(sim_dir)), os.path.basename(sim_dir)
    atomic_write(os.path.join(programs_dir, "nvidia-smi"),
                 f"#!{sys.executable}\n"
                 "import sys\n"
                 "from healthcheck.sim.sim_nvidia_smi import main\n"
                 f"sys.exit(main(sys.argv[1:], {state_dir!r}, {node!r}))\n", mode=0o755)
    path = os.path.join(programs_dir, "ib_write_bw")
    if not profile["node"]["perftest"]:
        if os.path.lexists(path):
            os.unlink(path)
        return
    launcher = (f"#!{sys.executable}\n"
                "import sys\n"
                "from healthcheck.sim.sim_ib_write_bw import main\n"
                f"sys.exit(main(sys.argv[1:], {live_path!r}))\n")
    atomic_write(path, launcher, mode=0o755)


IMEX_CHANNELS_DIR = "nvidia-caps-imex-channels"


def render_imex(profile: Dict[str, Any], programs_dir: str, dev_root: str) -> None:
    """The node's IMEX: ``nvidia-imex-ctl`` answering ``-q`` with the daemon's state (one word,
    READY when the domain is usable), and its channels as ``<dev>/nvidia-caps-imex-channels/
    channelN`` (character devices on a real node; empty files here: only their names are read)."""
    ensure_dir(programs_dir)
    path = os.path.join(programs_dir, "nvidia-imex-ctl")
    state = profile["node"]["imex_daemon"]
    if state:
        atomic_write(path, f"#!{sys.executable}\n"
                           "import sys\n"
                           "if sys.argv[1:] != ['-q']:\n"
                           "    print('the simulated nvidia-imex-ctl answers only -q', file=sys.stderr)\n"
                           "    sys.exit(2)\n"
                           f"print({state!r})\n", mode=0o755)
    elif os.path.lexists(path):
        os.unlink(path)
    folder = os.path.join(ensure_dir(dev_root), IMEX_CHANNELS_DIR)
    wanted = {f"channel{n}" for n in profile["node"]["imex_channels"]}
    if wanted:
        ensure_dir(folder)
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            if name not in wanted:
                os.unlink(os.path.join(folder, name))
    for name in sorted(wanted):
        atomic_write(os.path.join(folder, name), "")


def sysfs_address(nvml_bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` as sysfs names it: ``0000:18:00.0``."""
    domain, _, rest = nvml_bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def hca_address(profile: Dict[str, Any], hca: str) -> str:
    """The HCA's PCI address: the profile's, else one derived from its first port's place."""
    names = list(dict.fromkeys(port["hca"] for port in profile["ib"]))
    for port in profile["ib"]:
        if port["hca"] == hca and port.get("pci_bus_id"):
            return sysfs_address(port["pci_bus_id"]) if port["pci_bus_id"].count(":") == 2 else port["pci_bus_id"]
    return f"0000:{(0x19 + 0x10 * names.index(hca)) % 0x100:02x}:00.0"


def render_sysfs(profile: Dict[str, Any], root: str) -> None:
    """Write the ``[[ib]]`` ports as ``<root>/class/infiniband/<hca>/ports/<n>/...`` and the
    GPUs' and HCAs' PCI devices under ``<root>/devices`` (linked from ``bus/pci/devices`` and
    each HCA's ``device``), as the TaskProlog reads them.

    Files are replaced one by one (each atomically) rather than the tree swapped, so a
    probe running during an injection never sees a port vanish.
    """
    base = os.path.join(root, "class", "infiniband")
    ensure_dir(base)
    for gpu in profile["gpu"]:
        if gpu["state"] != "absent":
            device = _pci_device(root, sysfs_address(gpu["pci_bus_id"]), gpu.get("pcie_switch", ""),
                                 gpu.get("numa_node", -1))
            _render_aer(device, gpu.get("aer", {}))
    for port in profile["ib"]:
        # The profile schema already refuses these; checked again where they become paths.
        hca_dir = os.path.join(base, path_component(port["hca"]))
        port_dir = os.path.join(hca_dir, "ports", str(int(port["port"])))
        for name in ("state", "phys_state", "rate", "link_layer"):
            _put(os.path.join(port_dir, name), port[name])
        for name, value in port["counters"].items():
            # The kernel's PMA counters stop at their width's maximum, as real ones do.
            bits = IB_COUNTER_BITS.get(name)
            _put(os.path.join(port_dir, "counters", path_component(name)),
                 value if bits is None else min(value, (1 << bits) - 1))
        for index, kind in port["gid_types"].items():
            index = str(int(index))
            _put(os.path.join(port_dir, "gid_attrs", "types", index), kind)
            _put(os.path.join(port_dir, "gids", index), "fe80:0000:0000:0000:0000:0000:0000:0001")
        device = _pci_device(root, hca_address(profile, port["hca"]), port.get("pcie_switch", ""), port["numa_node"])
        if port.get("netdev"):
            up = str(port["state"]).strip().startswith("4")
            _put(os.path.join(device, "net", path_component(port["netdev"]), "operstate"), "up" if up else "down")
        _link(os.path.join(hca_dir, "device"), device)
    wanted = {port["hca"] for port in profile["ib"]}
    for stale in set(os.listdir(base)) - wanted:
        _rmtree(os.path.join(base, stale), ignore_errors=True)


# Where the simulator counts a profile's AER totals, in the kernel's names (facts.AER_*_NAMES):
# a receiver error, a completion timeout, a data link protocol error.
_AER_NAMED = {"correctable": "RxErr", "nonfatal": "CmpltTO", "fatal": "DLP"}


def aer_text(kind: str, total: int) -> str:
    """An ``aer_dev_<kind>`` file as the kernel writes it, ``total`` counted on one error kind."""
    names = AER_CORRECTABLE_NAMES if kind == "correctable" else AER_UNCORRECTABLE_NAMES
    lines = [f"{name} {total if name == _AER_NAMED[kind] else 0}" for name in names]
    return "\n".join(lines + [f"{AER_TOTALS[kind]} {total}"]) + "\n"


def _render_aer(device: str, aer: Dict[str, Any]) -> None:
    for kind in AER_KINDS:
        path = os.path.join(device, AER_FILES[kind])
        if aer.get("enabled", True):
            atomic_write(path, aer_text(kind, int(aer.get(kind, 0))), mode=0o444)
        elif os.path.lexists(path):
            os.unlink(path)


def _aer_cleared(gpu: Dict[str, Any]) -> None:
    """The kernel's AER counters start again at boot."""
    for kind in AER_KINDS:
        if kind in gpu.get("aer", {}):
            gpu["aer"][kind] = 0


def _pci_device(root: str, address: str, switch: str, numa_node: int) -> str:
    """``<root>/devices/pci<domain>:00/[<switch>/]<address>`` with its numa_node, linked from
    ``bus/pci/devices/<address>``; returns the device directory."""
    parts = [root, "devices", f"pci{address[:4]}:00"] + ([path_component(switch)] if switch else [])
    device = os.path.join(*parts, path_component(address))
    _put(os.path.join(device, "numa_node"), numa_node)
    _link(os.path.join(root, "bus", "pci", "devices", address), device)
    return device


def _link(path: str, target: str) -> None:
    """``path`` -> ``target`` (relative), replacing whatever was there (a directory from an
    older layout too) in one rename."""
    relative = os.path.relpath(target, os.path.dirname(path))
    if os.path.islink(path) and os.readlink(path) == relative:
        return
    ensure_dir(os.path.dirname(path))
    if os.path.isdir(path) and not os.path.islink(path):
        _rmtree(path)
    temp = f"{path}.{os.getpid()}.tmp"
    if os.path.lexists(temp):
        os.unlink(temp)
    os.symlink(relative, temp)
    os.replace(temp, path)


def render_driver_proc(profile: Dict[str, Any], proc_root: str) -> None:
    """The NVIDIA driver's ``/proc/driver/nvidia/gpus/<address>/information`` per GPU it knows
    (not an absent one), in the driver's format; ``Device Minor`` is what Slurm's GRES uses."""
    base = os.path.join(proc_root, "driver", "nvidia", "gpus")
    ensure_dir(base)
    wanted = set()
    for gpu in profile["gpu"]:
        if gpu["state"] == "absent":
            continue
        address = sysfs_address(gpu["pci_bus_id"])
        wanted.add(address)
        text = (f"Model: \t\t {gpu['name']}\n"
                "IRQ:   \t\t 0\n"
                f"GPU UUID: \t {gpu['uuid']}\n"
                "Video BIOS: \t 96.00.74.00.01\n"
                "Bus Type: \t PCIe\n"
                "DMA Size: \t 52 bits\n"
                "DMA Mask: \t 0xfffffffffffff\n"
                f"Bus Location: \t {address}\n"
                f"Device Minor: \t {gpu['minor_number']}\n"
                "GPU Excluded:\t No\n")
        atomic_write(os.path.join(base, path_component(address), "information"), text, mode=0o444)
    for stale in set(os.listdir(base)) - wanted:
        _rmtree(os.path.join(base, stale), ignore_errors=True)
    render_mig_minors(profile, proc_root)


# The driver's numbering of MIG capabilities (``/dev/nvidia-caps/nvidia-capN``): per GPU minor,
# up to 15 GPU instances, each with its own capability and up to 8 compute instances'. The
# hooks read the numbers from the file, never from this layout.
MIG_GPU_INSTANCES, MIG_COMPUTE_INSTANCES, MIG_FIRST_MINOR = 15, 8, 3


def mig_cap_minor(gpu_minor: int, gpu_instance: int, compute_instance: Optional[int] = None) -> int:
    per_gi = 1 + MIG_COMPUTE_INSTANCES
    minor = MIG_FIRST_MINOR + (gpu_minor * MIG_GPU_INSTANCES + gpu_instance) * per_gi
    return minor if compute_instance is None else minor + 1 + compute_instance


def render_mig_minors(profile: Dict[str, Any], proc_root: str) -> None:
    """``/proc/driver/nvidia-caps/mig-minors`` (capability -> minor) for the GPUs in MIG mode;
    no file when none is."""
    path = os.path.join(proc_root, "driver", "nvidia-caps", "mig-minors")
    minors = sorted(gpu["minor_number"] for gpu in profile["gpu"]
                    if gpu["state"] != "absent" and gpu.get("mig", {}).get("enabled"))
    if not minors:
        if os.path.lexists(path):
            os.unlink(path)
        return
    lines = ["config 1", "monitor 2"]
    for gpu in minors:
        for gi in range(MIG_GPU_INSTANCES):
            lines.append(f"gpu{gpu}/gi{gi}/access {mig_cap_minor(gpu, gi)}")
            lines.extend(f"gpu{gpu}/gi{gi}/ci{ci}/access {mig_cap_minor(gpu, gi, ci)}"
                         for ci in range(MIG_COMPUTE_INSTANCES))
    ensure_dir(os.path.dirname(path))
    atomic_write(path, "\n".join(lines) + "\n", mode=0o444)


def _put(path: str, value: Any) -> None:
    atomic_write(path, f"{value}\n", mode=0o644)


def _rmtree(path: str, ignore_errors: bool = False) -> None:
    import shutil           # only when a rendered tree is redone: a hook's healthy run loads none

    shutil.rmtree(path, ignore_errors=ignore_errors)
