"""The lab directory's layout, its ports and its nodes: one place that names every path.

::

    $LAB/
      etc/            slurm.conf, gres.conf, slurmdbd.conf (0600), slurm-gpu-hooks.toml,
                      sim/*.toml (simulator profiles), db-password (0600)
      hooks/          prolog, epilog, epilog-slurmctld, healthcheck: wrappers Slurm runs
      var/log/        slurmctld.log, slurmd-gpuN.log, slurmdbd.log, mariadbd.log, lab.log
      var/run/        pid files of the Slurm daemons
      var/ctld/       slurmctld's StateSaveLocation
      var/d/<node>/   each slurmd's spool
      fakedev/<node>/ nvidia0..7: character devices (major 195) behind GRES gpu:8; a MIG
                      node's nvidia-caps/nvidia-capN too (its MIG devices' capabilities)
      munge/          the lab's own munged: socket, pid; private/ holds key, seed, log
      mysql/          the lab's own MariaDB: data/, socket, pid, log
      state/          the hooks' state_dir (hook-runs/ journal, sim/ live node state)
      jobs/           scenario job output (and the jobs' working directory)
      bin/            the lab's Slurm commands (scontrol, sbatch, ...): wrappers that run the
                      release the lab runs (``lab env`` puts them first in PATH)
      rootfs/VERSION/ a release's Debian root filesystem (built once, kept by ``lab down``);
      rootfs/debs/    the .debs debootstrap fetched
      metrics/        the health check's Prometheus textfiles (node_exporter reads them)
      prometheus/     the lab's Prometheus: config, the shipped rules, data/ (lab/monitoring.py)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

DEFAULT_LAB_DIR = "/var/tmp/slurm-gpu-lab"
LAB_DIR_ENV = "SLURM_GPU_LAB_DIR"

DEFAULT_NODE_COUNT = 3
MAX_NODES = 256
NODE_PREFIX = "gpu"


def node_names(count: int) -> Tuple[str, ...]:
    """gpu1..gpuN: the lab's nodes, as ``lab up --nodes N`` makes them."""
    return tuple(f"{NODE_PREFIX}{number}" for number in range(1, count + 1))


# The default lab's nodes (``lab up`` without --nodes): what the lab tests and scenarios name.
NODES: Tuple[str, ...] = node_names(DEFAULT_NODE_COUNT)
GPUS_PER_NODE = 8
# A GB200 NVL72 compute tray (``lab up --gb200 N``): 4 GPUs, the rack one multi-node NVLink domain.
GB200_GPUS = 4
GB200_PROFILE = "gb200-nvl72-healthy.toml"
# A node shared with MIG (``lab up --mig N``): 8 H100, MIG on GPUs 0-2 as the profile cuts them.
MIG_PROFILE = "h100-mig.toml"
CPUS_PER_NODE = 8
REAL_MEMORY_MB = 2000
CLUSTER_NAME = "lab"

# Ports away from Slurm's defaults (6817-6819) and MariaDB's (3306), so the lab never
# collides with a real Slurm or database on the same machine.
SLURMCTLD_PORT = 16817
SLURMDBD_PORT = 16819
SLURMD_FIRST_PORT = 17001
MARIADB_PORT = 16306

# The lab's ports are machine-wide, so these locks are too (not per lab directory).
# ``lab up`` and ``lab down`` hold OPS_LOCK while they work; the lab's pytest session holds
# TESTS_LOCK from ``lab up`` to ``lab down`` so a second session waits instead of
# cancelling the first one's jobs (hold it with flock(1) for manual experiments).
OPS_LOCK = "/run/lock/slurm-gpu-lab.lock" if os.path.isdir("/run/lock") else "/var/tmp/slurm-gpu-lab.lock"
TESTS_LOCK = "/var/tmp/slurm-gpu-lab.tests.lock"

DB_NAME = "slurm_acct_db"
DB_USER = "slurm"


def lab_dir(explicit: Optional[str] = None, env: Mapping[str, str] = os.environ) -> str:
    chosen = explicit or env.get(LAB_DIR_ENV) or DEFAULT_LAB_DIR
    return os.path.abspath(chosen)


@dataclass(frozen=True)
class LabPaths:
    root: str

    def _p(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    # -- configuration ---------------------------------------------------------------------
    @property
    def etc(self) -> str:
        return self._p("etc")

    @property
    def slurm_conf(self) -> str:
        return self._p("etc", "slurm.conf")

    @property
    def gres_conf(self) -> str:
        return self._p("etc", "gres.conf")

    @property
    def cgroup_conf(self) -> str:
        return self._p("etc", "cgroup.conf")

    @property
    def slurmdbd_conf(self) -> str:
        return self._p("etc", "slurmdbd.conf")

    @property
    def hooks_config(self) -> str:
        return self._p("etc", "slurm-gpu-hooks.toml")

    @property
    def sim_profiles(self) -> str:
        return self._p("etc", "sim")

    @property
    def db_password_file(self) -> str:
        return self._p("etc", "db-password")

    @property
    def nodes_file(self) -> str:
        """How many nodes the lab was last brought up with (``lab up --nodes N``)."""
        return self._p("etc", "nodes")

    @property
    def gb200_file(self) -> str:
        """How many of the last nodes are GB200 trays (``lab up --gb200 N``)."""
        return self._p("etc", "gb200")

    def gb200_nodes(self) -> Tuple[str, ...]:
        """The lab's GB200 trays: its last N nodes, as the last ``lab up --gb200 N`` made them
        (none recorded, or not fewer than the nodes: none)."""
        return _last_counted(self.nodes(), self.gb200_file)

    @property
    def mig_file(self) -> str:
        """How many of the H100 nodes are MIG nodes (``lab up --mig N``)."""
        return self._p("etc", "mig")

    def mig_nodes(self) -> Tuple[str, ...]:
        """The lab's MIG nodes: the last N of its H100 nodes (those before any GB200 tray), as
        the last ``lab up --mig N`` made them (none recorded, or not fewer than those: none)."""
        return _last_counted(tuple(node for node in self.nodes() if node not in self.gb200_nodes()), self.mig_file)

    def gpus(self, node: str) -> int:
        """How many GPUs the lab gives ``node``."""
        return GB200_GPUS if node in self.gb200_nodes() else GPUS_PER_NODE

    @property
    def stateless_file(self) -> str:
        """Present while the lab's nodes boot as a diskless image (``lab up --stateless``)."""
        return self._p("etc", "stateless")

    def nodes(self) -> Tuple[str, ...]:
        """The lab's nodes: gpu1..gpuN as the last ``lab up`` made them (none recorded: the default 3)."""
        try:
            with open(self.nodes_file, encoding="ascii") as handle:
                count = int(handle.read().strip())
        except (OSError, ValueError):
            return NODES
        return node_names(count) if 1 <= count <= MAX_NODES else NODES

    @property
    def release_file(self) -> str:
        """The Slurm release the lab was last brought up with ("24.11")."""
        return self._p("etc", "release")

    @property
    def bin(self) -> str:
        return self._p("bin")

    @property
    def rootfs_dir(self) -> str:
        return self._p("rootfs")

    def rootfs(self, version: str) -> str:
        return self._p("rootfs", version)

    @property
    def hooks(self) -> str:
        return self._p("hooks")

    def hook(self, name: str) -> str:
        return self._p("hooks", name)

    # -- runtime ---------------------------------------------------------------------------
    @property
    def var(self) -> str:
        return self._p("var")

    @property
    def log(self) -> str:
        return self._p("var", "log")

    @property
    def run(self) -> str:
        return self._p("var", "run")

    @property
    def ctld_state(self) -> str:
        return self._p("var", "ctld")

    @property
    def spool(self) -> str:
        return self._p("var", "d")

    @property
    def fakedev(self) -> str:
        return self._p("fakedev")

    def fake_gpu_dir(self, node: str) -> str:
        return self._p("fakedev", node)

    @property
    def state(self) -> str:
        return self._p("state")

    @property
    def metrics(self) -> str:
        """The health check's Prometheus textfiles, read by the lab's node_exporter (lab/monitoring.py)."""
        return self._p("metrics")

    @property
    def jobs(self) -> str:
        return self._p("jobs")

    @property
    def lab_log(self) -> str:
        return self._p("var", "log", "lab.log")

    # -- munge -----------------------------------------------------------------------------
    @property
    def munge(self) -> str:
        return self._p("munge")

    @property
    def munge_private(self) -> str:
        return self._p("munge", "private")

    @property
    def munge_socket(self) -> str:
        return self._p("munge", "munge.socket")

    @property
    def munge_pid(self) -> str:
        return self._p("munge", "munged.pid")

    @property
    def munge_key(self) -> str:
        return self._p("munge", "private", "munge.key")

    @property
    def munge_log(self) -> str:
        return self._p("munge", "private", "munged.log")

    @property
    def munge_seed(self) -> str:
        return self._p("munge", "private", "munged.seed")

    # -- MariaDB ---------------------------------------------------------------------------
    @property
    def mysql(self) -> str:
        return self._p("mysql")

    @property
    def mysql_data(self) -> str:
        return self._p("mysql", "data")

    @property
    def mysql_socket(self) -> str:
        return self._p("mysql", "mysqld.sock")

    @property
    def mysql_pid(self) -> str:
        return self._p("mysql", "mariadbd.pid")

    @property
    def mysql_log(self) -> str:
        return self._p("mysql", "mariadbd.log")

    # -- Slurm pid and log files (must match what render.py writes into slurm.conf) ------
    @property
    def slurmctld_pid(self) -> str:
        return self._p("var", "run", "slurmctld.pid")

    @property
    def slurmdbd_pid(self) -> str:
        return self._p("var", "run", "slurmdbd.pid")

    def slurmd_pid(self, node: str) -> str:
        return self._p("var", "run", f"slurmd-{node}.pid")

    @property
    def slurmctld_log(self) -> str:
        return self._p("var", "log", "slurmctld.log")

    @property
    def slurmdbd_log(self) -> str:
        return self._p("var", "log", "slurmdbd.log")

    def slurmd_log(self, node: str) -> str:
        return self._p("var", "log", f"slurmd-{node}.log")

    def log_files(self) -> Tuple[Tuple[str, str], ...]:
        """(what, path) of every log an admin would read."""
        rows = [("slurmctld", self.slurmctld_log), ("slurmdbd", self.slurmdbd_log)]
        rows += [(f"slurmd {node}", self.slurmd_log(node)) for node in self.nodes()]
        rows += [("mariadbd", self.mysql_log), ("munged", self.munge_log),
                 ("lab (this tool)", self.lab_log),
                 ("hook-run journal", os.path.join(self.state, "hook-runs")),
                 ("job output", self.jobs)]
        return tuple(rows)


def slurmd_port(node: str) -> int:
    """gpuN listens on SLURMD_FIRST_PORT + N - 1 (one port per slurmd on the one host)."""
    return SLURMD_FIRST_PORT + int(node[len(NODE_PREFIX):]) - 1


def _last_counted(nodes: Tuple[str, ...], count_file: str) -> Tuple[str, ...]:
    """The last N of ``nodes``, N as ``count_file`` holds it (none when it is missing, unreadable,
    or not fewer than the nodes)."""
    try:
        with open(count_file, encoding="ascii") as handle:
            count = int(handle.read().strip())
    except (OSError, ValueError):
        return ()
    return nodes[len(nodes) - count:] if 0 < count < len(nodes) else ()
