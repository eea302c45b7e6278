"""The Debian packages the lab needs, installed with apt when missing (Debian 12, root)."""
from __future__ import annotations

import os
import shutil
from typing import Callable, List

from . import LabError
from .paths import LabPaths
from .commands import clean_env, last_line, run

PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "mariadb-server",
            "prometheus", "prometheus-node-exporter")     # the lab's monitoring (lab/monitoring.py)

# Binaries the lab runs, by absolute path (daemons and clients never come from PATH).
BINARIES = {
    "munged": "/usr/sbin/munged", "munge": "/usr/bin/munge", "unmunge": "/usr/bin/unmunge",
    "mariadbd": "/usr/sbin/mariadbd", "mariadb-install-db": "/usr/bin/mariadb-install-db",
    "mariadb": "/usr/bin/mariadb", "mariadb-admin": "/usr/bin/mariadb-admin",
    "slurmdbd": "/usr/sbin/slurmdbd", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd",
    "sbatch": "/usr/bin/sbatch", "scontrol": "/usr/bin/scontrol", "sinfo": "/usr/bin/sinfo",
    "squeue": "/usr/bin/squeue", "sacct": "/usr/bin/sacct", "scancel": "/usr/bin/scancel",
    "srun": "/usr/bin/srun", "runuser": "/usr/sbin/runuser",
    # util-linux: a rebooted node's slurmd runs in its own time namespace (slurm_hooks/lab/reboot.py)
    "unshare": "/usr/bin/unshare",
    "sacctmgr": "/usr/bin/sacctmgr", "salloc": "/usr/bin/salloc", "sstat": "/usr/bin/sstat",
    "sprio": "/usr/bin/sprio", "sshare": "/usr/bin/sshare", "sreport": "/usr/bin/sreport",
    "sdiag": "/usr/bin/sdiag",
}


def binary(name: str) -> str:
    """The binary's path as the release has it (the host's, or inside its root filesystem)."""
    return BINARIES[name]


def command(lab: LabPaths, name: str) -> str:
    """How the lab runs ``name`` from the host: the release's binary, through ``$LAB/bin`` when
    the release lives in a root filesystem."""
    from .releases import current

    return os.path.join(lab.bin, name) if current(lab).rootfs else BINARIES[name]


def missing_packages() -> List[str]:
    if shutil.which("dpkg-query", path="/usr/bin:/bin") is None:
        raise LabError("the lab needs Debian (dpkg-query not found); see docs/lab.md")
    missing = []
    for package in PACKAGES:
        result = run(["dpkg-query", "-W", "-f=${Status}", package], check=False, timeout=30)
        if result.returncode != 0 or "install ok installed" not in result.stdout:
            missing.append(package)
    return missing


def ensure_packages(say: Callable[[str], None]) -> List[str]:
    """Install what is missing; return what was installed."""
    missing = missing_packages()
    if missing:
        if os.geteuid() != 0:
            raise LabError(f"packages missing ({', '.join(missing)}) and not root to install them")
        env = clean_env({"DEBIAN_FRONTEND": "noninteractive"})
        say(f"installing {' '.join(missing)} (apt-get, --no-install-recommends)")
        update = run(["apt-get", "update"], env=env, timeout=600, check=False)
        if update.returncode != 0:  # offline: the package cache may still have them
            say(f"apt-get update failed ({last_line(update)}); installing from what apt knows")
        run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env, timeout=1200)
        still = missing_packages()
        if still:
            raise LabError(f"apt-get did not install {', '.join(still)}")
    absent = [path for path in BINARIES.values() if not os.access(path, os.X_OK)]
    if absent:
        raise LabError(f"installed packages lack {', '.join(absent)}")
    return missing
