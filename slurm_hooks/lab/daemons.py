"""The lab's daemons: start each one (with a readiness wait), find it again by its pid
file, and stop it by PID -- never by name.

A pid is only believed when the process is alive, runs the expected binary and carries the
lab directory in its command line or environment, so a recycled pid or someone else's
slurmd is never signalled.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

from . import LabError
from . import paths as P
from .boots import slurmd_prefix
from .install import binary, command
from .paths import LabPaths
from .commands import clean_env, run, slurm_env

Say = Callable[[str], None]


# -- /proc -------------------------------------------------------------------------------------
def _read(path: str, limit: int = 1 << 20) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError:
        return b""


def proc_state(pid: int) -> Optional[str]:
    """The one-letter state of ``pid`` (R, S, Z, ...), None when there is no such process."""
    raw = _read(f"/proc/{pid}/stat").decode("ascii", "replace")
    if not raw:
        return None
    return raw.rsplit(")", 1)[-1].split()[0] if ")" in raw else None


def alive(pid: int) -> bool:
    state = proc_state(pid)
    return state is not None and state not in ("Z", "X")


def proc_exe_name(pid: int) -> str:
    try:
        target = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""
    name = os.path.basename(target.replace(" (deleted)", ""))
    # Debian installs slurmd/slurmctld/slurmstepd as alternatives of slurmd-wlm etc.
    return name[:-4] if name.endswith("-wlm") else name


def proc_cmdline(pid: int) -> List[str]:
    return [part.decode("utf-8", "replace") for part in _read(f"/proc/{pid}/cmdline").split(b"\0") if part]


def proc_environ(pid: int) -> Dict[str, str]:
    env: Dict[str, str] = {}
    for item in _read(f"/proc/{pid}/environ").split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def belongs_to_lab(pid: int, lab: LabPaths) -> bool:
    marker = lab.root + "/"
    if any(marker in part or part == lab.root for part in proc_cmdline(pid)):
        return True
    # A slurmstepd renames itself ("slurmstepd: [1082.batch]") and keeps no SLURM_CONF: it is
    # known by the working directory it has from its slurmd (the lab's log directory). Seen at
    # 256 nodes on 24.11: 1,825 of them outlived a slurmctld that died, and `lab down` missed them.
    try:
        if (os.readlink(f"/proc/{pid}/cwd") + "/").startswith(marker):
            return True
    except OSError:
        pass
    return proc_environ(pid).get("SLURM_CONF") == lab.slurm_conf


def ancestors(pid: int) -> Set[int]:
    seen: Set[int] = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        raw = _read(f"/proc/{pid}/stat").decode("ascii", "replace")
        try:
            pid = int(raw.rsplit(")", 1)[-1].split()[1])
        except (IndexError, ValueError):
            break
    return seen


def all_pids() -> Iterable[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for(what: str, probe: Callable[[], bool], timeout: float, interval: float = 0.2,
             log_hint: str = "") -> float:
    """Poll ``probe`` until it is true; return the seconds it took, raise after ``timeout``."""
    start = time.monotonic()
    while True:
        try:
            if probe():
                return time.monotonic() - start
        except LabError:
            pass
        if time.monotonic() - start > timeout:
            hint = f" (see {log_hint})" if log_hint else ""
            raise LabError(f"{what} not ready after {timeout:g} s{hint}")
        time.sleep(interval)


# -- the daemons -------------------------------------------------------------------------------
@dataclass
class Daemon:
    name: str            # e.g. "slurmd gpu1"
    exe: str             # binary name as /proc/PID/exe shows it
    pidfile: str
    log: str
    start: Callable[[LabPaths], None]
    ready: Callable[[LabPaths], bool]
    ready_timeout: float = 30
    stop_timeout: float = 15

    def pid(self, lab: LabPaths) -> Optional[int]:
        """The daemon's pid when its pid file names a live lab process of the right binary."""
        text = _read(self.pidfile, 64).decode("ascii", "replace").strip()
        if not text.isdigit():
            return None
        pid = int(text)
        if alive(pid) and proc_exe_name(pid) == self.exe and belongs_to_lab(pid, lab):
            return pid
        return None


def release_user(lab: LabPaths, name: str) -> Tuple[int, int]:
    """(uid, gid) of a daemon's user as the release running the lab has it."""
    from .releases import current
    from .rootfs import user_ids

    release = current(lab)
    return user_ids(lab.rootfs(release.version) if release.rootfs else "", name)


def _ensure_owned_dir(lab: LabPaths, path: str, owner: str, mode: int) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)
    if os.path.islink(path) or not os.path.isdir(path):
        raise LabError(f"{path} is not a plain directory; refusing to use it")
    uid, gid = release_user(lab, owner)
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)


# munged ----------------------------------------------------------------------------------
def _start_munged(lab: LabPaths) -> None:
    _ensure_owned_dir(lab, lab.munge, "munge", 0o755)          # munged wants the socket dir 0755
    _ensure_owned_dir(lab, lab.munge_private, "munge", 0o700)  # key, seed, log
    uid, gid = release_user(lab, "munge")
    if os.path.exists(lab.munge_key):
        os.chown(lab.munge_key, uid, gid, follow_symlinks=False)  # another release's munge user
    else:
        fd = os.open(lab.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        try:
            os.write(fd, os.urandom(1024))
            os.fchown(fd, uid, gid)
        finally:
            os.close(fd)
    for path in (lab.munge_log, lab.munge_seed):
        if os.path.isfile(path) and not os.path.islink(path):
            os.chown(path, uid, gid, follow_symlinks=False)
    run([command(lab, "runuser"), "-u", "munge", "--", binary("munged"),
         f"--socket={lab.munge_socket}", f"--key-file={lab.munge_key}",
         f"--pid-file={lab.munge_pid}", f"--log-file={lab.munge_log}",
         f"--seed-file={lab.munge_seed}"], timeout=30)


def _munge_ready(lab: LabPaths) -> bool:
    cred = run([command(lab, "munge"), "-n", "-S", lab.munge_socket], check=False, timeout=10)
    if cred.returncode != 0:
        return False
    return run([command(lab, "unmunge"), "-S", lab.munge_socket], input=cred.stdout,
               check=False, timeout=10).returncode == 0


# MariaDB ---------------------------------------------------------------------------------
# What Slurm asks of its database server. MariaDB 11.8 (Debian 13 and sid) enables
# innodb_snapshot_isolation, and slurmdbd 26.05 says so at start ("not supported by Slurm and will
# cause slurmdbd to fatal when a write conflicts with a concurrent transaction. Set
# innodb_snapshot_isolation=OFF") and then does: seen in CI, a fatal "1020 Record has changed since
# last read in table 'lab_job_table'" in the middle of the lab tests, and no accounting after it.
# Debian 12's MariaDB 10.11.19 (the 22.05 lab) has the variable, off; "loose-" makes a server
# too old to know it warn, not refuse.
MARIADB_SLURM_SETTINGS = ("--loose-innodb-snapshot-isolation=OFF",)


def _start_mariadbd(lab: LabPaths) -> None:
    _ensure_owned_dir(lab, lab.mysql, "mysql", 0o750)
    if not os.path.isdir(os.path.join(lab.mysql_data, "mysql")):
        run([command(lab, "mariadb-install-db"), "--no-defaults", "--user=mysql",
             f"--datadir={lab.mysql_data}", "--auth-root-authentication-method=socket",
             "--skip-test-db"], timeout=180)
    if os.path.exists(lab.mysql_socket) and not os.path.islink(lab.mysql_socket):
        os.unlink(lab.mysql_socket)  # a stale socket from a killed server
    log = os.open(lab.mysql_log + ".stdout", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o640)
    try:
        subprocess.Popen(
            [command(lab, "mariadbd"), "--no-defaults", "--user=mysql", f"--datadir={lab.mysql_data}",
             f"--socket={lab.mysql_socket}", f"--port={P.MARIADB_PORT}", "--bind-address=127.0.0.1",
             f"--pid-file={lab.mysql_pid}", f"--log-error={lab.mysql_log}", "--skip-name-resolve",
             "--innodb-buffer-pool-size=128M", "--innodb-lock-wait-timeout=900",
             *MARIADB_SLURM_SETTINGS],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/", env=clean_env(),
            start_new_session=True, close_fds=True)
    finally:
        os.close(log)


def _mariadb_ready(lab: LabPaths) -> bool:
    return run([command(lab, "mariadb-admin"), "--no-defaults", f"--socket={lab.mysql_socket}", "-u", "root",
                "ping"], check=False, timeout=10).returncode == 0


def setup_database(lab: LabPaths, password: str) -> None:
    """Database and user for slurmdbd (idempotent; root gets in through unix_socket auth)."""
    statements = [f"CREATE DATABASE IF NOT EXISTS {P.DB_NAME}"]
    for host in ("localhost", "127.0.0.1"):
        user = f"'{P.DB_USER}'@'{host}'"
        statements += [f"CREATE USER IF NOT EXISTS {user} IDENTIFIED BY '{password}'",
                       f"ALTER USER {user} IDENTIFIED BY '{password}'",
                       f"GRANT ALL ON {P.DB_NAME}.* TO {user}"]
    run([command(lab, "mariadb"), "--no-defaults", f"--socket={lab.mysql_socket}", "-u", "root", "--batch"],
        input=";\n".join(statements) + ";\n", timeout=60)


# Slurm -----------------------------------------------------------------------------------
def _start_slurm(argv: List[str]) -> Callable[[LabPaths], None]:
    def start(lab: LabPaths) -> None:
        run(argv, env=slurm_env(lab), timeout=60, cwd=lab.log)
    return start


def _start_slurmd(node: str) -> Callable[[LabPaths], None]:
    """slurmd -N node, in the node's own boot when it rebooted (``boots.slurmd_prefix``: a
    time namespace, so Slurm sees that boot's BootTime)."""
    def start(lab: LabPaths) -> None:
        prefix = slurmd_prefix(lab, node, binary("unshare"))
        run(prefix + [command(lab, "slurmd"), "-N", node], env=slurm_env(lab), timeout=60, cwd=lab.log)
    return start


def _slurmdbd_ready(lab: LabPaths) -> bool:
    return port_open(P.SLURMDBD_PORT)


def _slurmctld_ready(lab: LabPaths) -> bool:
    result = run([command(lab, "scontrol"), "ping"], env=slurm_env(lab), check=False, timeout=10)
    return result.returncode == 0 and "is UP" in result.stdout


def node_states(lab: LabPaths) -> Dict[str, str]:
    """node -> sinfo's long state, e.g. "idle", "down*", "drained", "mixed"."""
    result = run([command(lab, "sinfo"), "-h", "-N", "-o", "%N|%T"], env=slurm_env(lab), timeout=10)
    states: Dict[str, str] = {}
    for line in result.stdout.splitlines():
        node, _, state = line.strip().partition("|")
        if node:
            states[node] = state.lower()
    return states


def node_responding(state: str) -> bool:
    return bool(state) and not state.endswith("*") and not state.startswith("unk") \
        and not state.startswith("future")


def _slurmd_ready(node: str) -> Callable[[LabPaths], bool]:
    def ready(lab: LabPaths) -> bool:
        return node_responding(node_states(lab).get(node, ""))
    return ready


def daemons(lab: LabPaths) -> List[Daemon]:
    """Every lab daemon, in start order (stop order is the reverse)."""
    table = [
        Daemon("munged", "munged", lab.munge_pid, lab.munge_log, _start_munged, _munge_ready, 15, 10),
        Daemon("mariadbd", "mariadbd", lab.mysql_pid, lab.mysql_log, _start_mariadbd, _mariadb_ready, 60, 30),
        Daemon("slurmdbd", "slurmdbd", lab.slurmdbd_pid, lab.slurmdbd_log,
               _start_slurm([command(lab, "slurmdbd")]), _slurmdbd_ready, 30, 15),
        Daemon("slurmctld", "slurmctld", lab.slurmctld_pid, lab.slurmctld_log,
               _start_slurm([command(lab, "slurmctld")]), _slurmctld_ready, 30, 15),
    ]
    for node in lab.nodes():
        table.append(Daemon(f"slurmd {node}", "slurmd", lab.slurmd_pid(node), lab.slurmd_log(node),
                            _start_slurmd(node), _slurmd_ready(node), 30, 10))
    return table


def by_name(lab: LabPaths, name: str) -> Daemon:
    for daemon in daemons(lab):
        if daemon.name == name:
            return daemon
    raise LabError(f"no lab daemon called {name!r}")


# -- start and stop ----------------------------------------------------------------------------
PORTS = {"mariadbd": P.MARIADB_PORT, "slurmdbd": P.SLURMDBD_PORT, "slurmctld": P.SLURMCTLD_PORT}


def start(lab: LabPaths, daemon: Daemon, say: Say) -> bool:
    """Start ``daemon`` unless it runs; wait until it answers. True when it was started."""
    if daemon.pid(lab) is not None:
        if daemon.ready(lab):
            return False
        wait_for(daemon.name, lambda: daemon.ready(lab), daemon.ready_timeout, log_hint=daemon.log)
        return False
    port = PORTS.get(daemon.name)
    if daemon.name.startswith("slurmd "):
        port = P.slurmd_port(daemon.name.split()[1])
    if port is not None and port_open(port):
        raise LabError(f"cannot start {daemon.name}: port {port} is taken by a process that is not "
                       f"the lab's (find it with: ss -ltnp 'sport = :{port}')")
    began = time.monotonic()
    daemon.start(lab)
    wait_for(daemon.name, lambda: daemon.pid(lab) is not None and daemon.ready(lab),
             daemon.ready_timeout, log_hint=daemon.log)
    say(f"started {daemon.name} (pid {daemon.pid(lab)}) in {time.monotonic() - began:.1f} s")
    return True


def signal_and_wait(pids: Dict[int, str], timeout: float, say: Say) -> List[str]:
    """SIGTERM each pid, wait, SIGKILL what is left; return the names that had to be killed."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    killed = []
    for pid, name in pids.items():
        if alive(pid):
            killed.append(name)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if killed:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(pid) for pid in pids):
            time.sleep(0.1)
        say(f"had to SIGKILL {', '.join(killed)}")
    return killed


def stop(lab: LabPaths, group: List[Daemon], say: Say) -> List[str]:
    """Stop the running daemons of ``group`` together (SIGTERM, then SIGKILL); names stopped."""
    pids = {}
    for daemon in group:
        pid = daemon.pid(lab)
        if pid is not None:
            pids[pid] = daemon.name
    if not pids:
        return []
    timeout = max(daemon.stop_timeout for daemon in group)
    signal_and_wait(pids, timeout, say)
    return list(pids.values())


def leftovers(lab: LabPaths) -> Dict[int, str]:
    """Lab processes still alive that no pid file names: job steps, jobs, stray daemons.

    The caller and its ancestors are never included (a shell that did
    ``eval "$(slurm-gpu lab env)"`` carries SLURM_CONF too).
    """
    mine = ancestors(os.getpid())
    found: Dict[int, str] = {}
    wanted = {"slurmstepd", "slurmd", "slurmctld", "slurmdbd", "munged", "mariadbd"}
    for pid in all_pids():
        if pid in mine or not alive(pid):
            continue
        exe = proc_exe_name(pid)
        if exe in wanted:
            if belongs_to_lab(pid, lab):
                found[pid] = exe
            continue
        env = proc_environ(pid)
        if env.get("SLURM_CONF") == lab.slurm_conf and "SLURM_JOB_ID" in env:
            found[pid] = f"job {env['SLURM_JOB_ID']} process {exe or pid}"
    return found
