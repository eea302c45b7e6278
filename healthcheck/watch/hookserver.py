"""The hook server: the node's hooks run in a child of a resident process that has every
module imported, instead of a fresh interpreter that imports them (``[watch] serve_hooks``).

``slurm-gpu-watch`` forks it first thing, before its NVML event thread starts (and before any
thread at all): a process that forks hook children must never have initialised NVML (a fork of
an NVML-initialised process is undefined on the real driver), nor hold another thread's locks
at the fork. ``nvml_touched`` is checked before every fork all the same, and a server that
finds NVML initialised in itself serves nothing (the hooks run in process).

Per connection (``healthcheck/hooklib/client.py`` is the other side): the peer must be root or
this server's own user (SO_PEERCRED), else the connection is closed unanswered (the client runs
the hook itself). A child is forked at once, in its own process group; it reads the request
(hook, argv, environment, cwd, umask, and the client's stdin, stdout and stderr over
SCM_RIGHTS), says "ready", waits for "go" and only then runs the hook's own ``main`` (the
console script's, ``HOOKS``) exactly as the hook's process would: the same config, lock, gate,
watchdog, fsyncs and probe children; it sends the exit status and exits with it. The server
keeps its own copy of each connection: the client gone before its child ended (slurmd killed
it) means the child's process group is killed.

Between requests (after a child ended, and when idle) the server keeps the counter histories its
children read parsed (``counters/history.py``: ``refresh``, which reads a file again only when its
lstat changed); each child names the ones it read on a pipe of its own. A child uses a parsed
copy only when the file holds the very bytes it was parsed from; any other file is read and
checked as in process.
"""
from __future__ import annotations

import os
import select
import signal
import stat
import sys
from typing import Dict, Iterable, Optional, Tuple

from ..hooklib import client as C
from . import say as watch_say

# The hooks the server runs: slurm.conf's commands, by their console scripts' entry points
# (setup.cfg; tests/test_hookserver.py holds the two together). Resolved by name: the node side
# (healthcheck) does not import slurm_hooks, and a tree without it serves the health check only.
HOOKS = {"prolog": "slurm_hooks.prolog:main", "epilog": "slurm_hooks.epilog:main",
         "healthcheck": "healthcheck.healthcheck:main"}
# What the hooks load, imported once here (the rest of each package's modules too: warm()); the
# NVML binding the node's config names (pynvml, or the simulator's look-alike) through
# ``sources`` (``LazyModule.spec``), imported and never initialised.
WARM = ("pynvml", "healthcheck.probes.nvml", "healthcheck.probes.ib_sysfs",
        "healthcheck.sources", "healthcheck.runner", "healthcheck.config", "tomllib", "json", "subprocess",
        "hostlist", "encodings.ascii")
COLD = ("slurm_hooks.lab", "slurm_hooks.cli", "healthcheck.watch.service", "healthcheck.sim")
_BINDINGS: list = []             # the NVML binding modules imported here
REQUEST_TIMEOUT_S = 5.0          # the child's wait for the request and for "go"
POLL_S = 0.5
MAX_TOLD = 4096                  # what a child may name on its pipe (the histories it read)


def say(message: str) -> None:
    watch_say(f"hook server: {message}")


def nvml_touched() -> bool:
    """True when NVML was initialised in this process: the binding's library loaded (pynvml's
    ``_nvmlLib``, set by ``nvmlInit`` and never unset; the simulator's look-alike keeps the same)."""
    bindings = [sys.modules.get("pynvml"), *_BINDINGS]
    return any(module is not None and getattr(module, "_nvmlLib", None) is not None for module in bindings)


def preload_binding(spec) -> None:
    """Import the node's NVML binding (``LazyModule.spec``), without initialising it."""
    from ..sources import load_spec

    try:
        _BINDINGS.append(load_spec(spec))
    except BaseException:  # noqa: BLE001 - the probe's child says what is wrong with it
        pass


def entry(hook: str):
    import importlib

    module, _, function = HOOKS[hook].partition(":")
    return getattr(importlib.import_module(module), function)


def warm() -> int:
    """Import what the hooks import (each hook's entry, the modules they load lazily, the rest
    of both packages but the lab and the CLI): a served hook imports nothing. Returns the count."""
    import importlib
    import pkgutil

    names = list(WARM) + [spec.partition(":")[0] for spec in HOOKS.values()]
    for package in ("healthcheck", "slurm_hooks"):
        try:
            root = importlib.import_module(package)
        except ImportError:
            continue
        names += [info.name for info in pkgutil.walk_packages(root.__path__, package + ".")
                  if not info.name.startswith(COLD) and not info.name.endswith("__main__")]
    loaded = 0
    for name in names:
        try:
            importlib.import_module(name)
            loaded += 1
        except BaseException:  # noqa: BLE001 - optional modules (click, a driver binding) may be absent
            continue
    return loaded


# -- the socket --------------------------------------------------------------------------------------
def private_dir(path: str) -> str:
    """The socket's directory: created 0700 when missing (its parent must exist), else it must be
    a real directory of this user that nobody else can enter. ValueError (one line) otherwise."""
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)            # mkdir's mode went through the umask
    except FileExistsError:
        pass
    except OSError as exc:
        raise ValueError(f"cannot create {path}: {exc.strerror or exc}") from None
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{path} is not a directory (a link is never followed)")
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise ValueError(f"{path} must be this user's (uid {os.geteuid()}) and mode 0700, is uid {info.st_uid} "
                         f"mode {stat.S_IMODE(info.st_mode):04o}")
    return path


def listen(path: str):
    """A listening Unix socket at ``path`` (mode 0600 in a private directory); a stale socket
    there is replaced, anything else refused."""
    import socket

    path = os.path.abspath(path)
    private_dir(os.path.dirname(path))
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None:
        if not stat.S_ISSOCK(info.st_mode):
            raise ValueError(f"{path} exists and is not a socket; refusing to replace it")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


class HookServer:
    def __init__(self, sock, path: str, allowed: Optional[Iterable[int]] = None):
        self.sock, self.path = sock, path
        self.allowed = set(allowed) if allowed is not None else {0, os.geteuid()}
        self.children: Dict[int, object] = {}     # pid -> the server's copy of its connection
        self.told: Dict[int, int] = {}            # pid -> the read end of its pipe (the histories it read)
        self.histories: Dict[str, None] = {}      # the counter histories kept parsed (counters/history.py)
        self.stopping = False
        self.served = 0
        self.refused = 0

    def serve(self) -> int:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        while not self.stopping:
            try:
                events = poller.poll(POLL_S * 1000)
            except InterruptedError:
                events = []
            for fd, mask in events:
                if fd == self.sock.fileno():
                    self.accept(poller)
                else:
                    self.hung_up(fd, poller)
            if self.reap(poller) or not events:
                self.keep_parsed()
        return 0

    def keep_parsed(self) -> None:
        """The histories the children read, read again where their lstat changed and parsed again
        where their bytes did (off every request's path: after a child ended, or idle, every
        POLL_S). Never stops the server."""
        if not self.histories:
            return
        try:
            from ..counters import history

            history.refresh(list(self.histories))
        except Exception as exc:  # noqa: BLE001 - a child then reads the file as in process
            say(f"counter history not kept parsed: {type(exc).__name__}: {exc}")

    def heard(self, pid: int) -> None:
        """The histories child ``pid`` read (one path a line, at most MAX_TOLD bytes)."""
        fd = self.told.pop(pid, None)
        if fd is None:
            return
        try:
            data = os.read(fd, MAX_TOLD)
        except OSError:
            data = b""
        finally:
            os.close(fd)
        for line in data.split(b"\n"):
            if line.startswith(b"/") and b"\0" not in line:
                self.histories[os.fsdecode(line)] = None
        from ..counters.history import MAX_PARSED

        while len(self.histories) > MAX_PARSED:         # as many as the history keeps parsed
            self.histories.pop(next(iter(self.histories)))

    def accept(self, poller) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        try:
            uid = C.peer_uid(__import__("_socket"), conn)
        except OSError:
            uid = -1
        if uid not in self.allowed:
            self.refused += 1
            say(f"refused a request from uid {uid} (only {sorted(self.allowed)} are served)")
            conn.close()
            return
        if nvml_touched():
            self.refused += 1
            say("NVML is initialised in this process: serving nothing (the hooks run in process)")
            conn.close()
            return
        try:
            told, tell = os.pipe()
        except OSError:
            told = tell = -1
        try:
            pid = os.fork()
        except OSError as exc:
            say(f"cannot fork: {exc.strerror or exc}")
            conn.close()
            for fd in (told, tell):
                if fd >= 0:
                    os.close(fd)
            return
        if pid == 0:  # pragma: no cover - the child, which leaves through os._exit
            try:
                self.sock.close()
                for other in self.children.values():
                    other.close()
                for fd in (told, *self.told.values()):
                    if fd >= 0:
                        os.close(fd)
            finally:
                run_child(conn, tell)
        if tell >= 0:
            os.close(tell)
            self.told[pid] = told
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass                          # the child did it first
        self.children[pid] = conn
        self.served += 1
        poller.register(conn.fileno(), select.POLLRDHUP)

    def hung_up(self, fd: int, poller) -> None:
        """The client's end closed: a child still running is killed with its process group."""
        for pid, conn in list(self.children.items()):
            if conn.fileno() != fd:
                continue
            if not _ends_soon(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
                say(f"the client of hook child {pid} went away: killed its process group")
            poller.unregister(fd)
            return

    def reap(self, poller) -> int:
        """Children that ended: a killed one's client hears the signal; the connection closes.
        Returns how many ended."""
        ended = 0
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if not done:
                continue
            conn = self.children.pop(pid)
            ended += 1
            self.heard(pid)
            try:
                poller.unregister(conn.fileno())
            except (KeyError, ValueError):
                pass
            try:                          # the child said it already, unless it was killed
                if os.WIFSIGNALED(status):
                    conn.sendall(b"K" + os.WTERMSIG(status).to_bytes(4, "big"))
            except OSError:
                pass
            conn.close()
        return ended

    def close(self) -> None:
        """Stop listening; the socket file goes when it is still ours. Running children finish."""
        try:
            info = os.fstat(self.sock.fileno())
            mine = os.lstat(self.path)
            if stat.S_ISSOCK(mine.st_mode) and mine.st_uid == info.st_uid:
                os.unlink(self.path)
        except OSError:
            pass
        self.sock.close()


def _ends_soon(pid: int, grace_s: float = 0.1) -> bool:
    """True when the child has ended or ends within ``grace_s`` (a child that sent its status
    and is exiting as its client closes is not killed; it is reaped later)."""
    import time

    until = time.monotonic() + grace_s
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.005)


# -- a child: one hook run ---------------------------------------------------------------------------
def run_child(conn, tell: int = -1) -> None:  # pragma: no cover - runs in a forked child (tests see its effects)
    code = 1
    try:
        os.setpgid(0, 0)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        conn.settimeout(REQUEST_TIMEOUT_S)
        request = read_request(conn)
        if request is None:
            os._exit(0)
        (hook, cwd, mask, args, env), fds = request
        if hook not in HOOKS or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            conn.sendall(b"N")            # not taken: the client runs the hook itself
            os._exit(0)
        main = entry(hook)
        conn.sendall(b"R")
        if conn.recv(1) != b"G":
            os._exit(0)                   # the client gave up: it runs the hook itself
        conn.settimeout(None)
        for target, fd in zip(C.STDIO, fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environb.update(env)
        try:
            os.chdir(cwd)
        except OSError:
            os.chdir("/")
        os.umask(mask)
        sys.argv = [f"slurm-gpu-{hook}", *args]
        C.SERVING.append(True)            # no client in here, and no stand-by NVML child:
        from ..probes import standby      # pynvml is imported; the probe forks its own child

        standby.PRELOADED.append(True)
        try:
            code = main(args)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        code = int(code or 0)
        _tell(tell)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        conn.sendall(b"X" + code.to_bytes(4, "big", signed=True))
    except BaseException:  # noqa: BLE001 - the client hears of it (no status) and fails open
        os._exit(70)
    os._exit(code & 0xFF)


def _tell(fd: int) -> None:
    """Name the counter histories this run read to the server, on this child's pipe."""
    if fd < 0:
        return
    try:
        from ..counters.history import READ

        data = b"".join(os.fsencode(path) + b"\n" for path in READ)
        if data and len(data) <= MAX_TOLD:
            os.write(fd, data)
    except (OSError, ValueError):
        pass
    finally:
        os.close(fd)


def read_request(conn) -> Optional[Tuple[tuple, list]]:
    """The request and the descriptors passed with it; None when the client closed first."""
    import socket

    fds: list = []
    data = b""
    first = True
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        if first:
            chunk, ancillary, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(4 * len(C.STDIO)))
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    usable = len(payload) - len(payload) % 4
                    fds += [int.from_bytes(payload[at:at + 4], sys.byteorder) for at in range(0, usable, 4)]
            first = False
        else:
            chunk = conn.recv(65536)
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None
        data += chunk
        if len(data) >= 4 and int.from_bytes(data[:4], "big") > C.MAX_REQUEST:
            raise ValueError("request too large")
    return C.decode(data[4:4 + int.from_bytes(data[:4], "big")]), fds


# -- starting it -------------------------------------------------------------------------------------
def start(path: str, binding=None) -> Optional[int]:
    """Fork the hook server (call before any thread or NVML): its pid, or None after one line.
    It dies with the process that started it (PR_SET_PDEATHSIG); its children, each in its own
    process group, finish their runs."""
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        pid = os.fork()
    except OSError as exc:
        say(f"cannot fork: {exc.strerror or exc}; the hooks run in process")
        return None
    if pid:
        return pid
    code = 0  # pragma: no cover - the server process
    try:
        from ..probes import child

        child._die_with_parent(parent)
        os.setpgid(0, 0)
        code = main_loop(path, binding=binding)
    except BaseException as exc:  # noqa: BLE001
        say(f"stopped: {type(exc).__name__}: {exc}")
        code = 1
    finally:
        os._exit(code)


def main_loop(path: str, allowed: Optional[Iterable[int]] = None, binding=None) -> int:
    """Import everything (``binding``: the node's NVML binding, ``LazyModule.spec``), listen at
    ``path``, serve until SIGTERM."""
    import gc

    gc.disable()
    count = warm()
    if binding is not None:
        preload_binding(binding)
    gc.freeze()                          # the imported modules: never walked again, nor copied by the children
    gc.enable()                          # the server runs for months; each child turns it off (nogc)
    if nvml_touched():
        say("NVML is initialised in this process: not serving (the hooks run in process)")
        return 1
    try:
        sock = listen(path)
    except (OSError, ValueError) as exc:
        say(f"cannot listen at {path}: {getattr(exc, 'strerror', None) or exc}; the hooks run in process")
        return 1
    server = HookServer(sock, path, allowed)

    def stop(_signum, _frame) -> None:
        server.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    say(f"serving the hooks at {path} ({count} modules loaded)")
    try:
        return server.serve()
    finally:
        server.close()
