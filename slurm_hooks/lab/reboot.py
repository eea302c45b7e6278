"""The lab's ``RebootProgram``: ``scontrol reboot`` of a lab node reboots it as on a cluster.

slurmd runs the RebootProgram (without arguments, without the node's name: several slurmd share
this host). It finds its node from the slurmd above it (``slurmd -N gpu2``), answers at once (a
real node would be going down), and in a detached process: reboots the simulated node
(``SimNode.reboot``: a new boot id, an empty kernel log, what a reboot clears cleared; with
``lab up --stateless`` the node's state and runtime directories emptied: ``stateless.py``), stops
that node's slurmd and starts it again in a new time namespace whose boot time is now
(``unshare --time --boottime``: slurmd reports its uptime from ``sysinfo(2)``, which follows the
namespace). Slurm then sees a new ``BootTime`` and ends the reboot (the node's state after it: docs/slurm-versions.md).

The node's boot is ``boots.py``'s.
"""
from __future__ import annotations

import os
import sys
import time
from typing import List, Optional

from . import stateless
from .boots import boot_file
from .paths import LabPaths, lab_dir

# What the reboot waits before the node "comes back": slurmctld must see a boot time later than
# the moment it sent the reboot (whole seconds).
DOWN_FOR_S = 2.0


# -- the RebootProgram -------------------------------------------------------------------------
def calling_node() -> Optional[str]:
    """The node of the slurmd that runs us (``slurmd -N NODE`` above us), or None."""
    from .daemons import ancestors, proc_cmdline, proc_exe_name

    for pid in sorted(ancestors(os.getppid()), reverse=True):
        if proc_exe_name(pid) != "slurmd":
            continue
        argv = proc_cmdline(pid)
        for index, part in enumerate(argv):
            if part == "-N" and index + 1 < len(argv):
                return argv[index + 1]
            if part.startswith("-N") and len(part) > 2:
                return part[2:]
    return None


def reboot_node(lab: LabPaths, node: str, say=print) -> None:
    """Reboot one lab node: the simulated hardware, then its slurmd in a new boot."""
    from healthcheck.config import Config
    from healthcheck.safeio.fsutil import atomic_write
    from healthcheck.sim.node import SimNode

    from . import daemons as D

    daemon = D.by_name(lab, f"slurmd {node}")
    D.stop(lab, [daemon], say)
    try:
        config = Config.load(lab.hooks_config)
        SimNode(config.state_dir, node, config.sim_profile_path(node)).reboot()
        if stateless.is_stateless(lab):
            gone = stateless.forget_node(config.state_dir, node, list(stateless.RUNTIME_DIRS))
            say(f"{node}: stateless boot: {len(gone)} state and runtime entries gone")
    finally:
        # A node whose reboot went wrong still boots: without its slurmd it would stay
        # "Not responding" for good (the 2-hour soak of stop 41 lost two nodes so).
        time.sleep(DOWN_FOR_S)
        atomic_write(boot_file(lab, node), f"{time.time():.3f}\n", mode=0o644)
        D.start(lab, daemon, say)
    say(f"{node}: rebooted (RebootProgram); slurmd back in a new boot")


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    lab = LabPaths(lab_dir())
    node = args[0] if args and not args[0].startswith("-") else calling_node()
    if not node:
        print("slurm-gpu lab RebootProgram: no slurmd above this process names its node", file=sys.stderr)
        return 1
    from .cluster import make_say

    say = make_say(lab, lambda message: None)
    if os.fork():
        return 0                      # slurmd's RebootProgram call returns: the node "goes down"
    os.setsid()
    if os.fork():
        os._exit(0)
    # What slurmd left open for us goes: its listening socket among them (24.11's slurmd passes
    # it on to the RebootProgram: seen in CI, the slurmd restarted below found its own port still
    # taken, by this process, and the node never came back).
    os.closerange(3, _max_fd())
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)
    try:
        reboot_node(lab, node, say)
        code = 0
    except Exception as exc:  # noqa: BLE001 - a detached process: the lab log is where it speaks
        say(f"{node}: RebootProgram failed: {type(exc).__name__}: {exc}")
        code = 1
    os._exit(code)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 1024


if __name__ == "__main__":
    sys.exit(main())
