"""The lab's ``slurm-gpu-watch``: one per simulated node, following that node's simulated
``kern.log`` and running the node's HealthCheckProgram wrapper (``$LAB/hooks/healthcheck``), as
on a real node where it runs beside slurmd. Started by ``lab up`` once the nodes answer, stopped
by ``lab down`` before them; found again by its pid file and believed only when the process is
alive, runs ``slurm-gpu-watch`` for that node and carries the lab directory in its command line.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

from . import LabError
from . import daemons as D
from . import paths as P
from .paths import LabPaths
from .commands import slurm_env

Say = Callable[[str], None]
SCRIPT = "slurm-gpu-watch"


def pidfile(lab: LabPaths, node: str) -> str:
    return os.path.join(lab.run, f"watch-{node}.pid")


def logfile(lab: LabPaths, node: str) -> str:
    return os.path.join(lab.log, f"watch-{node}.log")


def command(lab: LabPaths, node: str, config: Optional[str] = None) -> List[str]:
    """The console script beside this Python (as the hooks are installed), else the module;
    ``config``: another config file than the lab's (a test's)."""
    script = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), SCRIPT)
    head = [script] if os.path.isfile(script) and os.access(script, os.X_OK) else \
        [os.path.abspath(sys.executable), "-I", "-m", "healthcheck.watch.service"]
    chosen = ["--config", config] if config else []
    return head + chosen + ["--node", node, "--program", lab.hook("healthcheck"), "--pidfile", pidfile(lab, node)]


def pid(lab: LabPaths, node: str) -> Optional[int]:
    """The watcher of ``node`` when its pid file names a live lab watcher of that node."""
    text = D._read(pidfile(lab, node), 64).decode("ascii", "replace").strip()
    if not text.isdigit():
        return None
    found = int(text)
    if not D.alive(found):
        return None
    argv = D.proc_cmdline(found)
    ours = any(part.endswith(SCRIPT) or part == "healthcheck.watch.service" for part in argv)
    named = any(argv[at:at + 2] == ["--node", node] for at in range(len(argv)))
    return found if ours and named and D.belongs_to_lab(found, lab) else None


def rows(lab: LabPaths) -> List[tuple]:
    return [(f"watch {node}", pid(lab, node)) for node in lab.nodes()]


def start(lab: LabPaths, node: str, say: Say, timeout: float = 20, config: Optional[str] = None) -> bool:
    """Start the watcher of ``node`` unless the same one already runs; True when started. One that
    runs another command (another checkout's, another config's) is restarted."""
    wanted = command(lab, node, config)
    running = pid(lab, node)
    if running is not None:
        current = D.proc_cmdline(running)
        if current[-len(wanted):] == wanted and (config or "--config" not in current):
            return False
        D.signal_and_wait({running: f"watch {node}"}, 10, say)
    log = os.open(logfile(lab, node), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o640)
    try:
        child = subprocess.Popen(wanted, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
                                 env=slurm_env(lab), start_new_session=True, close_fds=True)
    finally:
        os.close(log)
    deadline = time.monotonic() + timeout
    while pid(lab, node) != child.pid:
        if child.poll() is not None:
            raise LabError(f"slurm-gpu-watch for {node} exited at once (rc {child.returncode}; see "
                           f"{logfile(lab, node)})")
        if time.monotonic() > deadline:
            raise LabError(f"slurm-gpu-watch for {node} wrote no pid file in {timeout:g} s")
        time.sleep(0.05)
    return True


def start_all(lab: LabPaths, say: Say) -> List[str]:
    started = [f"watch {node}" for node in lab.nodes() if start(lab, node, say)]
    if started:
        say(f"started {', '.join(started)} (slurm-gpu-watch, one per node)")
    return started


def stop_all(lab: LabPaths, say: Say) -> List[str]:
    pids: Dict[int, str] = {}
    for node in lab.nodes():
        found = pid(lab, node)
        if found is not None:
            pids[found] = f"watch {node}"
    if pids:
        D.signal_and_wait(pids, 70, say)     # a health check it started finishes first (< 60 s)
    return list(pids.values())
