"""Where a node's facts come from: the real driver and /sys, or a simulated node.

Probes take a ``NodeSources`` and never ask which one they got; of the node side (probes,
checks, the runner, the kernel log, the hooks) this is the only module that knows the simulator
exists (tests/test_architecture_claims.py).
"""
from __future__ import annotations

from .plain import plain
from types import ModuleType
from typing import Optional

from .config import Config


@plain
class NodeSources:
    node: str
    nvml: ModuleType          # pynvml, or healthcheck.sim.sim_pynvml bound to this node
    sysfs_root: str
    kernel_log: str           # "auto" | "kmsg" | "journal" | a file path
    state_dir: str            # where this node's state lives (cursors, counter history)
    simulated: bool = False
    boot_id_path: str = "/proc/sys/kernel/random/boot_id"   # changes at every boot
    # Where the simulator's stand-in programs (ib_write_bw) are; None: the system's programs.
    programs_dir: Optional[str] = None


def sim_sources(node: str, state_dir: str, profile_path: Optional[str]) -> NodeSources:
    from .sim import sim_pynvml as sim_nvml
    from .sim.node import SimNode

    sim = SimNode(state_dir, node, profile_path)
    sim.prepare()
    sim_nvml._bind(sim.live_path)
    return NodeSources(node=node, nvml=sim_nvml, sysfs_root=sim.sysfs_root,
                       kernel_log=sim.kernel_log_path, state_dir=state_dir, simulated=True,
                       boot_id_path=sim.boot_id_path,
                       programs_dir=sim.programs_dir)


def node_paths(config: Config, node: str):
    """(sysfs root, proc root) of ``node``, touching nothing: the TaskProlog runs as the job's
    user and only reads. A simulated node's live tree is the simulator's (rendered by the hooks)."""
    if config.backend == "sim":
        from .sim.node import SimNode

        sim = SimNode(config.state_dir, node)
        return sim.sysfs_root, sim.proc_root
    paths = config.section("paths")
    return config.resolve(paths["sysfs_root"]), config.resolve(paths["proc_root"])


def node_sources(config: Config, node: str) -> NodeSources:
    if config.backend == "sim":
        return sim_sources(node, config.state_dir, config.sim_profile_path(node))
    import pynvml

    paths = config.section("paths")
    kernel_log = paths["kernel_log"]
    if kernel_log not in ("auto", "kmsg", "journal"):
        kernel_log = config.resolve(kernel_log)
    return NodeSources(node=node, nvml=pynvml, sysfs_root=config.resolve(paths["sysfs_root"]),
                       kernel_log=kernel_log, state_dir=config.state_dir)
