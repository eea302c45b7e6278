"""Where a node's facts come from: the real driver and /sys, or a simulated node.

Probes take a ``NodeSources`` and never ask which one they got; of the node side (probes,
checks, the runner, the kernel log, the hooks) this is the only module that knows the simulator
exists (tests/test_architecture_claims.py).
"""
from __future__ import annotations

from .config.settings import PathsSettings
from .plain import plain
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from .config import Config


class LazyModule:
    """A module imported at its first use (its first attribute read), from any thread.

    ``NodeSources.nvml`` is one: the hooks' own process never imports pynvml (nor the
    simulator's look-alike); the NVML probe's child does, when it first calls it. The child
    starts earlier and smaller, and the binding's import (the floor's whole cost) runs there
    while the hook loads the rest of its code. An import that fails there is the probe's error
    (``probe.error``, no drain), as a driver call that fails is."""

    __slots__ = ("_load", "_module", "_lock", "spec")

    def __init__(self, load: Callable[..., ModuleType], *args: Any):
        import threading

        self._load, self._module, self._lock = (lambda: load(*args)) if args else load, None, threading.Lock()
        # (module, function, args) that load it: what ``repr`` names.
        self.spec = (load.__module__, load.__name__, args)

    def __getattr__(self, name: str) -> Any:
        module = self._module
        if module is None:
            with self._lock:
                if self._module is None:
                    self._module = self._load()
                module = self._module
        return getattr(module, name)

    def __repr__(self) -> str:
        return f"<LazyModule {self.spec[1]}{self.spec[2] or ''}{'' if self._module is None else ' loaded'}>"


def _pynvml() -> ModuleType:
    import pynvml

    return pynvml


def _sim_pynvml(live_path: str) -> ModuleType:
    from .sim import sim_pynvml as sim_nvml

    sim_nvml._bind(live_path)
    return sim_nvml


@plain
class NodeSources:
    node: str
    nvml: ModuleType          # pynvml, or healthcheck.sim.sim_pynvml bound to this node (a LazyModule of either)
    sysfs_root: str
    kernel_log: str           # "auto" | "kmsg" | "journal" | a file path
    state_dir: str            # where this node's state lives (cursors, counter history)
    simulated: bool = False
    boot_id_path: str = "/proc/sys/kernel/random/boot_id"   # changes at every boot
    # Where the simulator's stand-in programs (ib_write_bw) are; None: the system's programs.
    programs_dir: Optional[str] = None
    dev_root: str = "/dev"    # device files (the IMEX channels); the simulator's own tree


def sim_sources(node: str, state_dir: str, profile_path: Optional[str]) -> NodeSources:
    from .sim.node import SimNode

    sim = SimNode(state_dir, node, profile_path)
    sim.prepare()
    return NodeSources(node=node, nvml=LazyModule(_sim_pynvml, sim.live_path), sysfs_root=sim.sysfs_root,
                       kernel_log=sim.kernel_log_path, state_dir=state_dir, simulated=True,
                       boot_id_path=sim.boot_id_path,
                       programs_dir=sim.programs_dir, dev_root=sim.dev_root)


def node_paths(config: Config, node: str):
    """(sysfs root, proc root) of ``node``, touching nothing: the TaskProlog runs as the job's
    user and only reads. A simulated node's live tree is the simulator's (rendered by the hooks)."""
    if config.backend == "sim":
        from .sim.node import SimNode

        sim = SimNode(config.state_dir, node)
        return sim.sysfs_root, sim.proc_root
    paths = config.typed(PathsSettings)
    return config.resolve(paths.sysfs_root), config.resolve(paths.proc_root)


def node_sources(config: Config, node: str) -> NodeSources:
    if config.backend == "sim":
        return sim_sources(node, config.state_dir, config.sim_profile_path(node))
    paths = config.typed(PathsSettings)
    kernel_log = paths.kernel_log
    if kernel_log not in ("auto", "kmsg", "journal"):
        kernel_log = config.resolve(kernel_log)
    return NodeSources(node=node, nvml=LazyModule(_pynvml), sysfs_root=config.resolve(paths.sysfs_root),
                       kernel_log=kernel_log, state_dir=config.state_dir)
