"""``lab up``, ``down``, ``status`` and ``env``: bring the lab cluster up idempotently, take
it down leaving nothing behind, and say what runs."""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import os
import shutil
import secrets
import shlex
import stat
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from . import LabError
from . import daemons as D
from . import monitoring
from . import paths as P
from . import releases, render, rootfs, stateless, statefs
from . import watchers
from .files import _check_safe_dir, make_dir, write_if_changed  # noqa: F401 (lab API)
from .install import command, ensure_packages
from .paths import LabPaths
from .commands import run, slurm_env

Say = Callable[[str], None]

NVIDIA_MAJOR = 195


# -- the lab directory -------------------------------------------------------------------------
def prepare_tree(lab: LabPaths) -> None:
    make_dir(lab.root)
    for path in (lab.etc, lab.sim_profiles, lab.hooks, lab.var, lab.log, lab.run, lab.spool,
                 lab.fakedev, lab.state, lab.jobs, lab.bin, lab.rootfs_dir):
        make_dir(path)
    make_dir(lab.ctld_state, 0o700)
    for node in lab.nodes():
        make_dir(os.path.join(lab.spool, node))
        make_dir(lab.fake_gpu_dir(node))


def make_fake_gpus(lab: LabPaths) -> None:
    """nvidia0..7 per node (0..3 on a GB200 tray): character devices (major 195) that slurmd
    accepts as GPU files; on a MIG node also nvidia-caps/nvidia-capN, its MIG devices' capabilities."""
    mig = lab.mig_nodes()
    for node in lab.nodes():
        for index in range(lab.gpus(node)):
            _device(os.path.join(lab.fake_gpu_dir(node), f"nvidia{index}"), os.makedev(NVIDIA_MAJOR, index))
        caps = os.path.join(lab.fake_gpu_dir(node), "nvidia-caps")
        if node in mig:
            make_dir(caps)
            for _kind, _gpu, cap in render.mig_gres():
                if cap is not None:
                    _device(os.path.join(caps, f"nvidia-cap{cap}"), os.makedev(render.NVIDIA_CAPS_MAJOR, cap))
        elif os.path.isdir(caps) and not os.path.islink(caps):
            shutil.rmtree(caps)


def _device(path: str, wanted: int) -> None:
    if os.path.lexists(path):
        info = os.lstat(path)
        if stat.S_ISCHR(info.st_mode) and info.st_rdev == wanted:
            return
        os.unlink(path)
    os.mknod(path, 0o600 | stat.S_IFCHR, wanted)


def db_password(lab: LabPaths) -> str:
    path = lab.db_password_file
    if os.path.exists(path) and not os.path.islink(path):
        with open(path, encoding="ascii") as handle:
            value = handle.read().strip()
        if value.isalnum():
            return value
    value = secrets.token_hex(16)
    write_if_changed(path, value + "\n", 0o600)
    return value


def copy_sim_profiles(lab: LabPaths) -> None:
    """Copy the shipped simulator profiles (package data) into the lab's etc/sim."""
    from healthcheck.config import shipped

    source = shipped.shipped_dir()
    profiles = sorted(glob.glob(os.path.join(source, "*.toml")))
    if not any(os.path.basename(p) == "h100-healthy.toml" for p in profiles):
        raise LabError(f"no simulator profiles in {source}: this installation of slurm-gpu-hooks is incomplete "
                       "(reinstall it, or run from a checkout of the repository)")
    for profile in profiles:
        with open(profile, encoding="utf-8") as handle:
            write_if_changed(os.path.join(lab.sim_profiles, os.path.basename(profile)), handle.read(), 0o644)


def render_all(lab: LabPaths, opts: Optional[render.RenderOptions] = None) -> List[str]:
    """Write every generated file; return those that changed."""
    opts = opts or render.RenderOptions.for_release(lab, releases.current(lab))
    try:
        files = render.all_files(lab, opts, db_password(lab))
    except ValueError as exc:
        raise LabError(str(exc)) from None
    changed = [path for path, (text, mode) in files.items() if write_if_changed(path, text, mode)]
    if lab.cgroup_conf not in files and os.path.lexists(lab.cgroup_conf):
        os.unlink(lab.cgroup_conf)
        changed.append(lab.cgroup_conf)
    return changed


def remove_cgroups(lab: LabPaths, root: str = render.CGROUP_MEMORY) -> None:
    """rmdir the empty cgroups task/cgroup leaves behind (slurm_gpuN/...), deepest first."""
    for node in lab.nodes():
        top = os.path.join(root, f"slurm_{node}")
        if not os.path.isdir(top) or os.path.islink(top):
            continue
        for current, _dirs, _files in sorted(os.walk(top), key=lambda row: -row[0].count("/")):
            try:
                os.rmdir(current)
            except OSError:
                pass  # still in use (or not ours to remove): leave it


def check_hooks_config(lab: LabPaths) -> None:
    from healthcheck.config import Config, ConfigError

    try:
        Config.load(lab.hooks_config)
    except ConfigError as exc:
        raise LabError(f"the lab's hooks config is invalid: {exc.lines()[0]}") from None


def reset_sim_nodes(lab: LabPaths) -> None:
    from healthcheck.config import Config
    from healthcheck.sim.node import SimNode

    config = Config.load(lab.hooks_config)
    for node in lab.nodes():
        sim = SimNode(config.state_dir, node, config.sim_profile_path(node))
        # `lab up` starts every node from its profile. The lab's state dir outlives checkouts
        # (it is machine-wide), so what another version of the simulator left there is removed,
        # not trusted: a layout this version refuses (a link in the sysfs tree) must not stop the lab.
        shutil.rmtree(sim.dir, ignore_errors=True)
        sim.reset()


# -- a logger that prints and keeps a copy ------------------------------------------------------
def make_say(lab: LabPaths, echo: Callable[[str], None]) -> Say:
    def say(message: str) -> None:
        echo(message)
        try:
            if os.path.isdir(lab.log):
                from healthcheck.safeio.fsutil import append_line

                append_line(lab.lab_log, time.strftime("%Y-%m-%dT%H:%M:%S ") + message)
        except OSError:
            pass
    return say


@contextlib.contextmanager
def machine_lock(echo: Callable[[str], None], what: str, timeout: float = 600) -> Iterator[None]:
    """One ``lab up``/``lab down`` at a time on this machine (the ports are machine-wide)."""
    fd = os.open(P.OPS_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    echo(f"another `slurm-gpu lab up/down` is running; {what} waits for it")
                    told = True
                if time.monotonic() > deadline:
                    raise LabError(f"another `slurm-gpu lab up/down` held {P.OPS_LOCK} for {timeout:g} s") from None
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab runs Slurm's daemons and must run as root")


# -- up ----------------------------------------------------------------------------------------
def check_lab_dir(lab: LabPaths) -> None:
    """Refuse a lab directory Slurm's config files cannot name, or one that is not safe."""
    try:
        render.conf_value(lab.root)
    except ValueError as exc:
        raise LabError(str(exc)) from None
    if lab.root == "/" or not os.path.isabs(lab.root):
        raise LabError(f"{lab.root!r} cannot be the lab directory")
    if os.path.lexists(lab.root):
        _check_safe_dir(lab.root)


def up(lab: LabPaths, echo: Callable[[str], None], version: Optional[str] = None,
       health_interval: Optional[int] = None, clean: bool = False, nodes: Optional[int] = None,
       stateless_nodes: bool = False, hooks: bool = True, gb200: int = 0, mig: int = 0) -> Dict[str, object]:
    """Bring the lab up on Slurm ``version`` (None: the default release). ``health_interval``:
    slurm.conf's HealthCheckInterval (None: the lab's default, 10 s). ``nodes``: how many nodes,
    gpu1..gpuN (None: the default 3); another count than the running lab's stops it first.
    ``stateless_nodes``: a node's reboot empties its state as a diskless image's does
    (``stateless.py``; off again at the next ``up`` without it). ``hooks`` False: slurm.conf
    names no hook and no watcher runs (bench/scale's baseline; on again at the next ``up``
    without it). ``gb200``: the last N nodes are GB200 NVL72 trays (4 GPUs, one NVLink domain;
    fewer than the nodes; none again at the next ``up`` without it). ``mig``: the last N H100
    nodes are shared with MIG (the h100-mig profile, each MIG device a GRES listed in gres.conf;
    none again at the next ``up`` without it). ``clean``: stop the lab
    and wipe its state first (``wipe_state``): the cluster and the hooks start as on a new
    machine, whatever an earlier run left."""
    require_root()
    check_lab_dir(lab)
    release = releases.get(version)
    with machine_lock(echo, "lab up"):
        wiped: List[str] = []
        if clean:
            _down(lab, echo)
            wiped = wipe_state(lab, make_say(lab, echo))
        result = _up(lab, echo, release, health_interval, nodes, hooks, gb200, mig)
        stateless.set_stateless(lab, stateless_nodes)
        result["wiped"], result["stateless"] = wiped, stateless_nodes
        return result


def state_paths(lab: LabPaths) -> List[str]:
    """What a run of the lab leaves behind that the next one would inherit (and that another
    Slurm release cannot read): slurmctld's StateSaveLocation (job ids, node states), the slurmd
    spools, the database, the hooks' state dir (outbox, journal, kernel-log cursors, simulated
    nodes) and jobs' output."""
    return [lab.ctld_state, lab.spool, lab.mysql, lab.state, lab.jobs]


def _running(lab: LabPaths) -> bool:
    return bool(D.leftovers(lab)) or any(daemon.pid(lab) is not None for daemon in D.daemons(lab))


def wipe_state(lab: LabPaths, say: Say) -> List[str]:
    """Remove ``state_paths`` of a stopped lab (never through a link: one is refused);
    configuration, logs, installed packages and the munge key stay. Returns what it removed."""
    if _running(lab):
        raise LabError("the lab is still running: `slurm-gpu lab down` first")
    removed = []
    for path in state_paths(lab):
        if os.path.islink(path):
            raise LabError(f"{path} is a symbolic link: not removed; remove it yourself")
        if os.path.lexists(path):
            if statefs.own_filesystem(path):
                statefs.clear(path)         # the hooks' state filesystem: emptied, left mounted
            else:
                shutil.rmtree(path)
            removed.append(path)
    if removed:
        say(f"clean start: removed {', '.join(removed)}")
    return removed


# A lab directory from before `--slurm` ran the host's 22.05.
LEGACY_RELEASE = "22.05"


def switch_release(lab: LabPaths, release: releases.Release, echo: Callable[[str], None]) -> Optional[str]:
    """When the lab last ran another release: stop it (with its own commands) and remove the
    state no other release can read (slurmctld's and slurmd's state, the database, the hooks'
    state) and the job output (job ids start again at 1: an old ``<scenario>-<id>.out`` would
    pass for a new job's). Logs stay. The release it ran before, when it switched."""
    if not os.path.isdir(lab.root):
        return None
    before = releases.recorded(lab) or (LEGACY_RELEASE if os.path.isdir(lab.ctld_state) else None)
    if before is None or before == release.version:
        return None
    _down(lab, echo)
    wipe_state(lab, lambda _: None)
    return before


def _up(lab: LabPaths, echo: Callable[[str], None], release: releases.Release,
        health_interval: Optional[int] = None, nodes: Optional[int] = None,
        hooks: bool = True, gb200: int = 0, mig: int = 0) -> Dict[str, object]:
    began = time.monotonic()
    before = switch_release(lab, release, echo)
    resized = resize(lab, nodes or P.DEFAULT_NODE_COUNT, echo)
    reshaped = set_gb200(lab, gb200)
    reshaped = set_mig(lab, mig) or reshaped
    prepare_tree(lab)
    say = make_say(lab, echo)
    if not _running(lab):
        statefs.ensure(lab.state, say)      # what the soak fills for "the state disk is full"
    if resized:
        say(f"the lab had {resized} node(s): stopped it to start it with {len(lab.nodes())}")
    if before:
        say(f"switched the lab from Slurm {before} to {release.version}: stopped it and removed its state")
    write_if_changed(lab.release_file, release.version + "\n", 0o644)
    installed: List[str] = []
    built: Optional[float] = None
    if release.rootfs:
        rootfs.checkout()       # the hooks come from a checkout's wheel: say so before building
        built = rootfs.build(lab, release, say)
        rootfs.sync_etc(lab.rootfs(release.version))
        rootfs.install_hooks(lab, release, say)
    else:
        installed = ensure_packages(echo)
        if installed:
            say(f"installed {', '.join(installed)}")
    rootfs.write_wrappers(lab, release)
    table = D.daemons(lab)
    slurm_running = any(d.pid(lab) is not None for d in table if d.name.startswith("slurm"))
    copy_sim_profiles(lab)
    opts = render.RenderOptions.for_release(lab, release)
    if health_interval is not None:
        opts = dataclasses.replace(opts, health_interval=health_interval)
    opts = dataclasses.replace(opts, hooks=hooks)
    changed = render_all(lab, opts)
    check_hooks_config(lab)
    make_fake_gpus(lab)

    # A changed slurm.conf needs slurmctld and every slurmd restarted (facts: gotcha 10).
    if {lab.slurm_conf, lab.gres_conf} & set(changed):
        stopped = D.stop(lab, [d for d in table if d.name.startswith("slurmd ")], say)
        stopped += D.stop(lab, [d for d in table if d.name == "slurmctld"], say)
        if stopped:
            say(f"configuration changed: restarting {', '.join(stopped)}")
    if lab.slurmdbd_conf in changed:
        stopped = D.stop(lab, [d for d in table if d.name == "slurmdbd"], say)
        if stopped:
            say("slurmdbd.conf changed: restarting slurmdbd")
    if not slurm_running or reshaped:
        # A cold start is a reboot: the simulated nodes come back healthy (and, reshaped, as
        # their new profile's hardware).
        reset_sim_nodes(lab)

    started = []
    for daemon in table:
        if D.start(lab, daemon, say):
            started.append(daemon.name)
        if daemon.name == "mariadbd":
            D.setup_database(lab, db_password(lab))
    if started:
        say("wait for every node to register")
    nodes = lab.nodes()
    D.wait_for(f"nodes {render.nodelist(nodes)}", lambda: all(D.node_responding(D.node_states(lab).get(n, ""))
                                                          for n in nodes), 30, log_hint=lab.log)
    if hooks:
        started += watchers.start_all(lab, say)
    else:
        stopped = watchers.stop_all(lab, say)
        say("hooks off: slurm.conf names no hook" + (f"; stopped {', '.join(stopped)}" if stopped else ""))
    started += monitoring.up(lab, say)
    elapsed = time.monotonic() - began
    say(f"lab up ({release.describe()}) in {elapsed:.1f} s "
        f"({'started ' + ', '.join(started) if started else 'everything already ran'})")
    return {"started": started, "seconds": elapsed, "installed": installed, "release": release.version,
            "rootfs_build_seconds": built}


def rss_kib(pid: int) -> Optional[int]:
    """A process's resident memory (``VmRSS`` of /proc/PID/status), KiB; None when it is gone."""
    try:
        with open(f"/proc/{int(pid)}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def resize(lab: LabPaths, count: int, echo: Callable[[str], None]) -> Optional[int]:
    """Record ``count`` nodes for the lab (``LabPaths.nodes``); a running lab with another count is
    stopped first, with the nodes it has (its slurm.conf, slurmd and watchers change). The count
    it had, when it changed."""
    if not 1 <= count <= P.MAX_NODES:
        raise LabError(f"--nodes {count}: the lab has 1 to {P.MAX_NODES} nodes")
    had = len(lab.nodes())
    if had != count and os.path.isdir(lab.root):
        _down(lab, echo)
    make_dir(lab.root)
    make_dir(lab.etc)
    write_if_changed(lab.nodes_file, f"{count}\n", 0o644)
    return had if had != count else None


def set_gb200(lab: LabPaths, count: int) -> bool:
    """Record how many of the last nodes are GB200 trays (0: none; slurm.conf, gres.conf and the
    hooks' config follow at the next render, restarting what they change); True when it changed."""
    nodes = len(lab.nodes())
    if not 0 <= count < nodes:
        raise LabError(f"--gb200 {count}: 0 to {nodes - 1} of the lab's {nodes} nodes (one at least stays H100)")
    before = lab.gb200_nodes()
    write_if_changed(lab.gb200_file, f"{count}\n", 0o644)
    return lab.gb200_nodes() != before


def set_mig(lab: LabPaths, count: int) -> bool:
    """Record how many of the H100 nodes are MIG nodes (0: none; as set_gb200); True when it changed."""
    h100 = [node for node in lab.nodes() if node not in lab.gb200_nodes()]
    if not 0 <= count < len(h100):
        raise LabError(f"--mig {count}: 0 to {len(h100) - 1} of the lab's {len(h100)} H100 nodes "
                       "(one at least stays whole)")
    before = lab.mig_nodes()
    write_if_changed(lab.mig_file, f"{count}\n", 0o644)
    return lab.mig_nodes() != before


def describe_up(lab: LabPaths) -> List[str]:
    lines = [f"lab directory: {lab.root}", f"slurm: {releases.current(lab).describe()}"]
    if lab.gb200_nodes():
        lines += [f"GB200 NVL72 trays (4 GPUs each, one NVLink domain): {render.nodelist(lab.gb200_nodes())}"]
    if lab.mig_nodes():
        lines += [f"MIG nodes (each MIG device a GRES, listed in gres.conf): {render.nodelist(lab.mig_nodes())}"]
    if stateless.is_stateless(lab):
        lines += ["nodes: stateless (a reboot empties the node's state and runtime directories)"]
    lines += ["logs:"]
    lines += [f"  {what:<18} {path}" for what, path in [*lab.log_files(), *monitoring.log_files(lab)]]
    lines += [f"Prometheus (the shipped alert rules loaded): {monitoring.prometheus_url()}"]
    lines += ["use it from a shell:", '  eval "$(slurm-gpu lab env' +
              ("" if lab.root == P.DEFAULT_LAB_DIR else f" --dir {shlex.quote(lab.root)}") + ')"',
              "  sinfo; sbatch --gres=gpu:1 --wrap 'sleep 5'; sacct",
              "  slurm-gpu lab scenarios      # every way a job can end, with faults injected"]
    return lines


# -- down --------------------------------------------------------------------------------------
def cancel_all_jobs(lab: LabPaths, say: Say) -> None:
    """A courtesy before the daemons stop: whatever Slurm answers, or fails to, the job
    processes are stopped after it. A slurmctld too busy to answer (seen at 256 nodes on 2
    cores) must not keep the lab up."""
    try:
        _cancel_all_jobs(lab, say)
    except LabError as exc:
        say(f"jobs not cancelled ({exc}); their processes are stopped below")


def _cancel_all_jobs(lab: LabPaths, say: Say) -> None:
    env = slurm_env(lab)
    result = run([command(lab, "squeue"), "-h", "-o", "%A"], env=env, check=False, timeout=10)
    ids = [line.strip() for line in result.stdout.splitlines() if line.strip().isdigit()]
    if not ids:
        return
    run([command(lab, "scancel"), *ids], env=env, check=False, timeout=20)
    say(f"cancelled {len(ids)} job(s)")

    def settled() -> bool:
        out = run([command(lab, "squeue"), "-h", "-t", "R,CG,CF,S", "-o", "%A"], env=env, check=False, timeout=10)
        return out.returncode != 0 or not out.stdout.strip()
    try:
        D.wait_for("job cancellation", settled, 15)
    except LabError:
        say("jobs still completing; their processes are stopped below")


def down(lab: LabPaths, echo: Callable[[str], None]) -> Dict[str, object]:
    require_root()
    with machine_lock(echo, "lab down"):
        return _down(lab, echo)


def _down(lab: LabPaths, echo: Callable[[str], None]) -> Dict[str, object]:
    began = time.monotonic()
    say = make_say(lab, echo)
    if not os.path.isdir(lab.root) and not D.leftovers(lab):
        say(f"no lab at {lab.root}: nothing to stop")
        return {"stopped": [], "seconds": 0.0}
    table = D.daemons(lab)
    stopped: List[str] = monitoring.down(lab, say)
    ctld = D.by_name(lab, "slurmctld")
    if ctld.pid(lab) is not None:
        cancel_all_jobs(lab, say)
    stopped += watchers.stop_all(lab, say)
    # Reverse start order; the three slurmd together.
    stopped += D.stop(lab, [d for d in table if d.name.startswith("slurmd ")], say)
    for name in ("slurmctld", "slurmdbd", "mariadbd", "munged"):
        stopped += D.stop(lab, [D.by_name(lab, name)], say)
    rest = D.leftovers(lab)
    if rest:
        say(f"stopping {len(rest)} leftover lab process(es): {', '.join(sorted(set(rest.values())))}")
        D.signal_and_wait(rest, 5, say)
    remaining = D.leftovers(lab)
    remove_cgroups(lab)
    if remaining:
        raise LabError("still running after lab down: " +
                       ", ".join(f"{name} (pid {pid})" for pid, name in sorted(remaining.items())))
    elapsed = time.monotonic() - began
    say(f"lab down in {elapsed:.1f} s: " + (f"stopped {', '.join(stopped)}" if stopped else "nothing was running")
        + f"; logs kept in {lab.log}")
    return {"stopped": stopped, "seconds": elapsed}


# -- status ------------------------------------------------------------------------------------
def status(lab: LabPaths) -> Tuple[List[Tuple[str, Optional[int]]], Dict[str, str], List[str]]:
    """(daemon, pid or None) rows, node states, node lines with reasons."""
    rows = [(d.name, d.pid(lab)) for d in D.daemons(lab)] + watchers.rows(lab) + monitoring.status_rows(lab)
    states: Dict[str, str] = {}
    detail: List[str] = []
    if dict(rows).get("slurmctld"):
        try:
            states = D.node_states(lab)
            result = run([command(lab, "sinfo"), "-N", "-o", "%N|%T|%G|%E"], env=slurm_env(lab), timeout=10)
            detail = list(dict.fromkeys(result.stdout.splitlines()))  # one line per node, not per partition
        except LabError as exc:
            detail = [f"sinfo: {exc}"]
    return rows, states, detail


def env_lines(lab: LabPaths) -> List[str]:
    """The lab's Slurm commands ($LAB/bin) come first in PATH: they run the lab's release."""
    return [f"export SLURM_CONF={shlex.quote(lab.slurm_conf)}",
            f"export SLURM_GPU_HOOKS_CONFIG={shlex.quote(lab.hooks_config)}",
            f"export {P.LAB_DIR_ENV}={shlex.quote(lab.root)}",
            f"export {releases.RELEASE_ENV}={shlex.quote(releases.current(lab).version)}",
            *monitoring.env_lines(lab), f"export PATH={shlex.quote(lab.bin)}:\"$PATH\""]
