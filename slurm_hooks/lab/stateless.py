"""``slurm-gpu lab up --stateless``: the lab's nodes boot as a diskless image does (Warewulf,
OpenHPC's default): ``/var`` and ``/run`` are in RAM, so a reboot empties the node's state and
runtime directories.

The lab's nodes share one state directory (each node's files carry its name), so a reboot of one
node removes that node's files only: its health state, remediation ledger, counter history,
kernel-log cursors, run journal, outbox entries and job records; never the simulated hardware
(``sim/<node>``: the GPUs do not change with the image), never another node's files. The
hooks' compiled config in ``/run`` goes too (it is rebuilt on the next run).
"""
from __future__ import annotations

import os
import shutil
from typing import List

from .paths import LabPaths

# The hardware of the simulated node (healthcheck/sim/node.py): not part of the image.
HARDWARE_DIR = "sim"
# What the hooks keep in /run (the compiled config, healthcheck.compiled.CACHE_DIR; a test holds
# the two equal, the lab does not import the hooks' config cache).
RUNTIME_DIRS = ("/run/slurm-gpu-hooks",)


def is_stateless(lab: LabPaths) -> bool:
    return os.path.isfile(lab.stateless_file)


def set_stateless(lab: LabPaths, on: bool) -> None:
    """Record the mode for the lab's RebootProgram (``lab up`` without ``--stateless``: off)."""
    from healthcheck.safeio.fsutil import atomic_write

    if on:
        atomic_write(lab.stateless_file, "1\n", mode=0o644)
    elif os.path.lexists(lab.stateless_file):
        os.unlink(lab.stateless_file)


def _belongs(name: str, node: str) -> bool:
    """Whether a state entry is the node's: ``gpu1``, ``gpu1.json``, ``.gpu1.lock``,
    ``.gpu1.decide.lock`` (never ``gpu10.json``), an outbox entry ``<job>.gpu1.json``."""
    bare = name[1:] if name.startswith(".") else name
    return bare == node or bare.startswith(node + ".") or name.endswith(f".{node}.json")


def forget_node(state_dir: str, node: str, runtime_dirs: List[str] = ()) -> List[str]:
    """Remove what ``node`` kept under ``state_dir`` (except its simulated hardware) and every
    entry of ``runtime_dirs``, as a reboot of a diskless node does. Links are removed, never
    followed. Returns the paths removed."""
    removed: List[str] = []
    for top in sorted(os.listdir(state_dir)) if os.path.isdir(state_dir) else []:
        if top == HARDWARE_DIR:
            continue
        path = os.path.join(state_dir, top)
        if _belongs(top, node):
            removed.append(_remove(path))
        elif os.path.isdir(path) and not os.path.islink(path):
            removed += _forget_in(path, node)
    for directory in runtime_dirs:
        if os.path.isdir(directory) and not os.path.islink(directory):
            removed += [_remove(os.path.join(directory, name)) for name in sorted(os.listdir(directory))]
    return removed


def _forget_in(directory: str, node: str) -> List[str]:
    removed: List[str] = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if _belongs(name, node):
            removed.append(_remove(path))
        elif os.path.isdir(path) and not os.path.islink(path):
            removed += _forget_in(path, node)
    return removed


def _remove(path: str) -> str:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return path
