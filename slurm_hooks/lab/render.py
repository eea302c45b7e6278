"""The lab's configuration text: slurm.conf, gres.conf, slurmdbd.conf, the hook wrappers
and the lab's slurm-gpu-hooks config. Pure functions of the layout; no side effects.

The text itself lives in ``slurm_hooks/data/lab-*.tmpl`` (``string.Template``, ``$name``).
"""
from __future__ import annotations

import os
import shlex
import socket
import sys
from dataclasses import dataclass
from importlib import resources
from string import Template
from typing import Dict, List, Optional, Sequence, Tuple

import hostlist

from . import paths as P
from .paths import LabPaths

DEFAULT_PROFILE = "sim/h100-healthy.toml"
GB200_PROFILE = f"sim/{P.GB200_PROFILE}"
MIG_PROFILE = f"sim/{P.MIG_PROFILE}"
IB_PORTS = tuple(f"mlx5_{index}:1" for index in range(8))
REASON_PREFIX = "gpu-hooks:"
HEALTH_CHECK_INTERVAL = 10


def health_interval_for(nodes: int) -> int:
    """slurm.conf's HealthCheckInterval for a lab of ``nodes`` nodes on one host: 10 s for the
    default three, and a second per node beyond ten. Every node's health check every 10 s is 25 runs
    a second at 256 nodes, more than this 2-core host runs: they piled up in the slurmd by the
    thousand (measured, `lab up --nodes 256`). A site's nodes each have their own cores."""
    return max(HEALTH_CHECK_INTERVAL, nodes)

# name of the wrapper in $LAB/hooks -> (what Slurm calls it, console script, module)
HOOKS: Dict[str, Sequence[str]] = {
    "prolog": ("Prolog", "slurm-gpu-prolog", "slurm_hooks.prolog"),
    "epilog": ("Epilog", "slurm-gpu-epilog", "slurm_hooks.epilog"),
    "epilog-slurmctld": ("EpilogSlurmctld", "slurm-gpu-epilog", "slurm_hooks.epilog"),
    "healthcheck": ("HealthCheckProgram", "slurm-gpu-healthcheck", "healthcheck.healthcheck"),
    "taskprolog": ("TaskProlog", "slurm-gpu-taskprolog", "slurm_hooks.taskprolog"),
    # Not a hook of the product: the lab's stand-in for a node's reboot (slurm_hooks/lab/reboot.py).
    "reboot": ("RebootProgram", "", "slurm_hooks.lab.reboot"),
}


@dataclass(frozen=True)
class RenderOptions:
    host: str
    bin_dir: str            # where the console scripts are (next to the Python running us)
    python: str             # that Python, for the fallback ``python -I -m module``
    nodes: Sequence[str] = P.NODES
    health_interval: int = HEALTH_CHECK_INTERVAL
    # Memory cgroups (cgroup v1, memory only) make OUT_OF_MEMORY possible; see cgroup_v1_memory().
    cgroup: bool = False
    select_params: str = "CR_Core_Memory"
    def_mem_per_cpu: int = P.REAL_MEMORY_MB // P.CPUS_PER_NODE // 2
    # The root filesystem bin_dir and python are in ("" for the host), and the directory of the
    # lab's Slurm commands the hooks' config names ([slurm] bin_dir; "" for the usual places).
    rootfs: str = ""
    slurm_bin: str = ""
    marker: str = ""        # the file that exists only inside that root filesystem
    # False: slurm.conf names none of the hooks (``lab up --hooks-off``, bench/scale's baseline).
    hooks: bool = True
    # The nodes that are GB200 NVL72 trays (``lab up --gb200 N``): 4 GPUs, the GB200 profile.
    gb200: Sequence[str] = ()
    # The nodes shared with MIG (``lab up --mig N``): the h100-mig profile, each MIG device a GRES.
    mig: Sequence[str] = ()

    def gpus(self, node: str) -> int:
        return P.GB200_GPUS if node in self.gb200 else P.GPUS_PER_NODE

    @classmethod
    def here(cls) -> "RenderOptions":
        return cls(host=short_hostname(), bin_dir=os.path.dirname(os.path.abspath(sys.executable)),
                   python=os.path.abspath(sys.executable), cgroup=cgroup_v1_memory() is None)

    @classmethod
    def for_release(cls, lab: LabPaths, release) -> "RenderOptions":
        """The hooks of a root filesystem release run from its venv; every release's hooks
        config names the lab's commands (``$LAB/bin``), which run that release's clients."""
        from dataclasses import replace

        from .rootfs import VENV, marker

        nodes = lab.nodes()
        opts = replace(cls.here(), slurm_bin=lab.bin, nodes=nodes, health_interval=health_interval_for(len(nodes)),
                       gb200=lab.gb200_nodes(), mig=lab.mig_nodes())
        if release.rootfs:
            opts = replace(opts, bin_dir=f"{VENV}/bin", python=f"{VENV}/bin/python",
                           rootfs=lab.rootfs(release.version), marker=marker(release))
        return opts


CGROUP_MEMORY = "/sys/fs/cgroup/memory"


def cgroup_v1_memory(root: str = CGROUP_MEMORY) -> Optional[str]:
    """None when Slurm's cgroup/v1 plugin can constrain memory here; else why not.

    Slurm 22.05's cgroup/v2 plugin wants systemd to delegate it a subtree, which the lab
    (no systemd) cannot offer, so only a writable v1 memory hierarchy will do.
    """
    if not os.path.isfile(os.path.join(root, "memory.limit_in_bytes")):
        return f"no cgroup v1 memory controller at {root}"
    probe = os.path.join(root, f"slurm-gpu-lab-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return f"cannot create a memory cgroup under {root} ({exc.strerror})"
    try:
        if not os.path.isfile(os.path.join(probe, "memory.oom_control")):
            return f"{root} has no memory.oom_control (no OOM event count)"
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass
    return None


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def _template(name: str) -> Template:
    text = resources.files("slurm_hooks").joinpath(f"data/{name}").read_text("utf-8")
    return Template(text)


def conf_value(value: str) -> str:
    """A path for a Slurm config file: Slurm has no quoting for these, so refuse oddities."""
    if not value or any(ch.isspace() or ch in "#=\"'" for ch in value):
        raise ValueError(f"{value!r} cannot be written into a Slurm config file "
                         "(no spaces, quotes, '#' or '=' allowed in the lab directory)")
    return value


def toml_string(value: str) -> str:
    import tomli_w

    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def nodelist(nodes: Sequence[str]) -> str:
    return hostlist.collect_hostlist(list(nodes))


def slurm_conf(lab: LabPaths, opts: RenderOptions) -> str:
    root = conf_value(lab.root)
    lines = []
    for node in opts.nodes:
        lines.append(
            f"NodeName={node} NodeHostname={conf_value(opts.host)} NodeAddr=127.0.0.1 "
            f"Port={P.slurmd_port(node)} CPUs={P.CPUS_PER_NODE} Sockets=1 "
            f"CoresPerSocket={P.CPUS_PER_NODE} ThreadsPerCore=1 RealMemory={P.REAL_MEMORY_MB} "
            f"Gres={node_gres(node, opts)} State=UNKNOWN")
    return _template("lab-slurm.conf.tmpl").substitute(
        cluster=P.CLUSTER_NAME, host=opts.host, lab=root,
        munge_socket=conf_value(lab.munge_socket), ctld_port=P.SLURMCTLD_PORT,
        dbd_port=P.SLURMDBD_PORT, task_plugin="task/cgroup" if opts.cgroup else "task/none",
        select_params=opts.select_params,
        def_mem_per_cpu=opts.def_mem_per_cpu,
        prolog=conf_value(lab.hook("prolog")), epilog=conf_value(lab.hook("epilog")),
        epilog_slurmctld=conf_value(lab.hook("epilog-slurmctld")),
        healthcheck=conf_value(lab.hook("healthcheck")),
        taskprolog=conf_value(lab.hook("taskprolog")), reboot=conf_value(lab.hook("reboot")),
        health_interval=opts.health_interval, node_lines="\n".join(lines), off="" if opts.hooks else "#",
        nodelist=nodelist(opts.nodes))


# A MIG device's capability file, as the driver makes /dev/nvidia-caps/nvidia-capN (its major is
# the driver's choice at load; the lab's is from Linux's range for local use).
NVIDIA_CAPS_MAJOR = 240


def mig_gres(profile: str = P.MIG_PROFILE) -> List[Tuple[str, int, Optional[int]]]:
    """A MIG node's GRES as a site lists them by hand, in gres.conf's order: (type, GPU minor,
    the MIG device's capability minor or None for a whole GPU), from the shipped profile (its MIG
    devices, and the driver's numbering the simulator renders as mig-minors)."""
    from healthcheck.sim.node import mig_cap_minor
    from healthcheck.sim.profile import load_profile

    path = str(resources.files("healthcheck").joinpath(f"data/sim/{profile}"))
    gres: List[Tuple[str, int, Optional[int]]] = []
    whole: List[Tuple[str, int, Optional[int]]] = []
    for gpu in load_profile(path)["gpu"]:
        mig = gpu.get("mig", {})
        if mig.get("enabled"):
            gres += [(device["profile"], gpu["minor_number"], mig_cap_minor(gpu["minor_number"], device["gpu_instance"]))
                     for device in mig["devices"]]
        else:
            whole.append(("h100", gpu["minor_number"], None))
    return gres + whole


def node_gres(node: str, opts: RenderOptions) -> str:
    """slurm.conf's Gres= of ``node``: gpu:N, or a MIG node's count per type."""
    if node not in opts.mig:
        return f"gpu:{opts.gpus(node)}"
    counts: Dict[str, int] = {}
    for kind, _gpu, _cap in mig_gres():
        counts[kind] = counts.get(kind, 0) + 1
    return ",".join(f"gpu:{kind}:{count}" for kind, count in counts.items())


def gres_conf(lab: LabPaths, opts: RenderOptions) -> str:
    lines = ["# Generated by `slurm-gpu lab up`: 8 fake GPUs per node (4 per GB200 tray), character devices "
             "(major 195) in $LAB/fakedev/<node>.",
             "# A MIG node (`lab up --mig N`) lists each MIG device as its GPU's file and its capability's",
             "# (fakedev/<node>/nvidia-caps), and each whole GPU as its file: one GRES a line."]
    for node in opts.nodes:
        device_dir = conf_value(lab.fake_gpu_dir(node))
        if node in opts.mig:
            # slurmd takes no MultipleFiles= of one file: a whole GPU is a File= line.
            for kind, gpu, cap in mig_gres():
                if cap is None:
                    lines.append(f"NodeName={node} Name=gpu Type={kind} File={device_dir}/nvidia{gpu}")
                    continue
                lines.append(f"NodeName={node} Name=gpu Type={kind} MultipleFiles={device_dir}/nvidia{gpu},"
                             f"{device_dir}/nvidia-caps/nvidia-cap{cap}")
            continue
        lines.append(f"NodeName={node} Name=gpu File={device_dir}/nvidia[0-{opts.gpus(node) - 1}]")
    return "\n".join(lines) + "\n"


def slurmdbd_conf(lab: LabPaths, db_password: str) -> str:
    if not db_password.isalnum():
        raise ValueError("the lab's database password must be alphanumeric")
    return _template("lab-slurmdbd.conf.tmpl").substitute(
        lab=conf_value(lab.root), munge_socket=conf_value(lab.munge_socket),
        dbd_port=P.SLURMDBD_PORT, db_port=P.MARIADB_PORT, db_user=P.DB_USER,
        db_password=db_password, db_name=P.DB_NAME)


def hook_command(hook: str, opts: RenderOptions) -> List[str]:
    """How a wrapper runs a hook: the console script by absolute path, else the module."""
    _what, script, module = HOOKS[hook]
    path = os.path.join(opts.bin_dir, script)
    seen = os.path.join(opts.rootfs, path.lstrip("/")) if opts.rootfs else path
    if script and os.path.isfile(seen) and os.access(seen, os.X_OK):
        return [path]
    return [opts.python, "-I", "-m", module]


# Slurm runs the TaskProlog as the job's user, who may not be able to start this Python at all
# (the lab's interpreter can live under /root, 0700): then the shell's "Permission denied" goes
# to the log, nothing is exported, and the task runs, as the TaskProlog promises. Exit status
# 126 from an exec'd wrapper would fail every task of every user but root.
_RUN_AS_USER = "{command} || exit 0"


def hook_wrapper(lab: LabPaths, hook: str, opts: RenderOptions) -> str:
    what = HOOKS[hook][0]
    command = " ".join(shlex.quote(part) for part in hook_command(hook, opts))
    run = _RUN_AS_USER.format(command=command) if hook == "taskprolog" else f"exec {command}"
    if hook == "reboot":        # which lab: the program gets no arguments from Slurm
        run = f"{P.LAB_DIR_ENV}={shlex.quote(lab.root)}\nexport {P.LAB_DIR_ENV}\n{run}"
    enter = ""
    if opts.rootfs:     # run by hand on the host: enter the release's root filesystem first
        from .rootfs import enter_argv

        entered = " ".join(shlex.quote(part) for part in enter_argv(opts.rootfs, [lab.hook(hook)]))
        enter = (f"# Run from outside the release's root filesystem (by hand, on the host): enter it.\n"
                 f"[ -f {shlex.quote(opts.marker)} ] || exec {entered} \"$@\"\n")
    return _template("lab-hook-wrapper.sh.tmpl").substitute(
        enter=enter, what=what, name=hook, env_dir=shlex.quote(os.path.join(lab.state, "capture-env")),
        slurm_conf=shlex.quote(lab.slurm_conf),
        hooks_config=shlex.quote(lab.hooks_config), run=run)


def hooks_config(lab: LabPaths, opts: RenderOptions, profiles: Optional[Dict[str, str]] = None) -> str:
    chosen = {node: GB200_PROFILE if node in opts.gb200 else MIG_PROFILE if node in opts.mig else DEFAULT_PROFILE
              for node in opts.nodes}
    chosen.update(profiles or {})
    sim_nodes = ", ".join(f"{node} = {toml_string(path)}" for node, path in chosen.items())
    h100 = [node for node in opts.nodes if node not in opts.gb200]
    return _template("lab-hooks.toml.tmpl").substitute(
        gb200_group=profile_group(P.GB200_PROFILE, opts.gb200) if opts.gb200 else "",
        state_dir=toml_string(lab.state), default_profile=toml_string(DEFAULT_PROFILE),
        sim_nodes=sim_nodes, node_match=toml_string(nodelist(h100)),
        gpus=P.GPUS_PER_NODE, ib_ports=", ".join(toml_string(port) for port in IB_PORTS),
        reason_prefix=toml_string(REASON_PREFIX),
        gpu_devices=toml_string(os.path.join(lab.fakedev, "{node}")),
        slurm_bin=toml_string(opts.slurm_bin),
        textfile_dir=toml_string(lab.metrics))


def profile_group(profile: str, nodes: Sequence[str]) -> str:
    """A ``[[nodes]]`` group for ``nodes``: what the shipped simulator profile says its hardware
    is (its ``[hardware]`` table, the golden tests' expectations), so the lab expects exactly the
    hardware it simulates."""
    import tomli_w

    from healthcheck.safeio import tomlio

    text = resources.files("healthcheck").joinpath(f"data/sim/{profile}").read_text("utf-8")
    group = {"match": nodelist(nodes), **tomlio.loads(text)["hardware"], "nccl_env": True}
    return f"# The GB200 NVL72 trays (`lab up --gb200 N`): the hardware {profile} simulates.\n" + \
        tomli_w.dumps({"nodes": [group]})


def cgroup_conf() -> str:
    return _template("lab-cgroup.conf.tmpl").template


def all_files(lab: LabPaths, opts: RenderOptions, db_password: str) -> Dict[str, tuple]:
    """path -> (text, mode) of every generated file."""
    files: Dict[str, tuple] = {
        lab.slurm_conf: (slurm_conf(lab, opts), 0o644),
        lab.gres_conf: (gres_conf(lab, opts), 0o644),
        lab.slurmdbd_conf: (slurmdbd_conf(lab, db_password), 0o600),
        lab.hooks_config: (hooks_config(lab, opts), 0o644),
    }
    if opts.cgroup:
        files[lab.cgroup_conf] = (cgroup_conf(), 0o644)
    for hook in HOOKS:
        files[lab.hook(hook)] = (hook_wrapper(lab, hook, opts), 0o755)
    return files
