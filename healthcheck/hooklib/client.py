"""A hook as a client of the node's hook server (``slurm-gpu-watch`` with ``[watch] serve_hooks``):
what ``slurm-gpu-prolog``, ``slurm-gpu-epilog`` and ``slurm-gpu-healthcheck`` try first.

The server (``healthcheck/watch/hookserver.py``) has every module imported already; it forks a
child per request that runs the same hook body as the in-process path (the same ``main``), with
the environment, arguments, working directory and umask slurmd gave this process and with this
process's own stdin, stdout and stderr (passed over the socket), so what the hook prints goes
where slurmd reads it. This process waits for the exit status and exits with it.

Fail open: no socket, a refused or slow connection, a server that is not root (or this
process's own user), a server that will not take the request: ``served`` returns None and the
hook runs in this process at once. Nothing depends on the server.

At most once: the server's child runs the body only after this process said "go" (``G``) in
answer to its "ready" (``R``), and this process runs the body itself only when it never said
"go". Once it said "go" it never runs the body again: a server child that dies before its exit
status (``X``) is one line and exit 0 (the tool broken, never the node: fail open), as a hook
that crashes in process. slurmd killing this process closes the connection; the server kills
the child's process group (its NVML and IB probe children die with it too, PR_SET_PDEATHSIG).

Imports ``_socket`` (the C module: no ``socket``, ``enum``, ``selectors``) and nothing else the
interpreter does not already hold: this runs before every job on every node. ``hook_main`` is
each of the three hooks' ``main``: this first, the in-process run's imports only after it.
"""
import os
import sys

SOCKET_ENV = "SLURM_GPU_HOOKS_SOCKET"            # empty: never ask a server
DEFAULT_SOCKET = "/run/slurm-gpu-hooks/hooks.sock"   # [watch] hook_socket's default
MAGIC = b"SGH-HOOK1"
READY_TIMEOUT_S = 0.5        # connect, the server's accept, its fork and "ready"
MAX_RUN_S = 330.0            # past every hook's own watchdog (at most 300 s, healthcheck/config/keys.py)
MAX_REQUEST = 1 << 20
STDIO = (0, 1, 2)

SERVING = []                 # non-empty in a server's child: the hook runs there, it asks no server


def socket_path(env=None) -> str:
    """The server's socket: ``$SLURM_GPU_HOOKS_SOCKET`` when set (empty: none), else the default."""
    return (os.environ if env is None else env).get(SOCKET_ENV, DEFAULT_SOCKET)


def served(hook: str, argv=None):
    """The hook run by the node's hook server: its exit status; None when it was not run there
    (the caller runs it in process)."""
    if SERVING:
        return None
    path = socket_path()
    if not path:
        return None
    try:
        import _socket

        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except (ImportError, OSError):
        return None
    try:
        return _ask(_socket, sock, path, hook, list(sys.argv[1:] if argv is None else argv))
    finally:
        sock.close()


def hook_main(hook: str, argv, body, *, start, deadline, on_watchdog, on_error, example: str = "",
              admin_help: bool = False) -> int:
    """The whole ``main`` of a hook slurmd runs (prolog, epilog, health check): run by the node's
    hook server when there is one that takes it, else here through the hook skeleton
    (``skeleton.serve``: the arguments are its own; ``admin_help``: --help is the admin's text,
    ``skeleton.ADMIN_HELP``, named by a flag because the skeleton is not imported yet).

    The order is the point, each import no earlier than it is needed: the server asked first
    (this module: ``_socket`` only; a served hook imports nothing more), then the NVML probe's
    stand-by child forked (it imports the binding while this process loads its code:
    probes/standby.py), then the collector off (one short process: nogc.py), and only then
    the skeleton and, through the hook's own ``start`` and ``body``, the rest."""
    # No interpreter start, no imports when served; not there or not taken: this process runs it.
    code = served(hook, argv)
    if code is not None:
        return code
    from ..probes.standby import standby

    with standby():
        from .nogc import short_process

        with short_process():
            from .skeleton import ADMIN_HELP, serve

            return serve(hook, argv, body, doc=ADMIN_HELP if admin_help else "", example=example, start=start,
                         deadline=deadline, on_watchdog=on_watchdog, on_error=on_error)


def _say(hook: str, message: str) -> None:
    try:
        sys.stderr.write(f"slurm-gpu-{hook}: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _ask(_socket, sock, path: str, hook: str, args):
    sock.settimeout(READY_TIMEOUT_S)
    try:
        sock.connect(path)
    except OSError:
        return None                      # no server (the usual case without one): in process
    try:
        uid = peer_uid(_socket, sock)
    except OSError:
        return None
    if uid not in (0, os.geteuid()):
        _say(hook, f"hook socket {path} is served by uid {uid}, not root: not used; running in process")
        return None
    request = encode(hook, args)
    if request is None:
        return None
    fds = b"".join(_open_or_null(fd).to_bytes(4, sys.byteorder) for fd in STDIO)
    try:
        sent = sock.sendmsg([request], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        sock.sendall(request[sent:])
        ready = sock.recv(1)
    except OSError:
        ready = b""
    if ready != b"R":
        # Never said "go": the server's child does not run the body (a late "ready" reads EOF).
        if ready:
            _say(hook, f"hook server at {path} refused the request; running in process")
        else:
            _say(hook, f"hook server at {path} did not take the request in {READY_TIMEOUT_S:g} s; "
                 "running in process")
        return None
    try:
        sock.sendall(b"G")
    except OSError:
        # Maybe delivered, maybe not: the body may run there; never here too.
        return _lost(hook, path, "the go could not be sent")
    sock.settimeout(MAX_RUN_S)
    reply = b""
    try:
        while len(reply) < 5:
            chunk = sock.recv(5 - len(reply))
            if not chunk:
                break
            reply += chunk
    except OSError as exc:
        return _lost(hook, path, f"{type(exc).__name__}")
    if len(reply) == 5 and reply[:1] == b"X":
        return int.from_bytes(reply[1:], "big", signed=True)
    if len(reply) == 5 and reply[:1] == b"K":
        return _lost(hook, path, f"the hook's process was killed by signal {int.from_bytes(reply[1:], 'big')}")
    return _lost(hook, path, "the connection closed before the hook's exit status")


def _open_or_null(fd: int) -> int:
    """``fd``, or /dev/null in its place when it is closed (slurmd may start a hook without stdin)."""
    try:
        os.fstat(fd)
        return fd
    except OSError:
        return os.open(os.devnull, os.O_RDWR)


def _lost(hook: str, path: str, why: str) -> int:
    """The body was handed over and may have run: it is never run a second time here. The tool
    broken is never the node broken: exit 0, as a hook that crashes in process."""
    _say(hook, f"internal error, doing nothing more (fail open): hook server at {path}: {why}")
    return 0


def peer_uid(_socket, sock) -> int:
    cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)    # struct ucred: pid, uid, gid
    return int.from_bytes(cred[4:8], sys.byteorder)


def encode(hook: str, args):
    """One request: a 4-byte length, then NUL-separated fields (none can hold a NUL: they come
    from execve): magic, hook, cwd, umask, the argument count, the arguments, the environment."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    mask = os.umask(0o022)
    os.umask(mask)
    fields = [MAGIC, hook.encode(), os.fsencode(cwd), b"%d" % mask, b"%d" % len(args)]
    fields += [os.fsencode(arg) for arg in args]
    fields += [key + b"=" + value for key, value in os.environb.items()]
    if any(b"\0" in field for field in fields):
        return None
    body = b"\0".join(fields)
    if len(body) > MAX_REQUEST:
        return None
    return len(body).to_bytes(4, "big") + body


def decode(body: bytes):
    """(hook, cwd, umask, args, env) of a request body; ValueError when it is not one."""
    fields = body.split(b"\0")
    if len(fields) < 5 or fields[0] != MAGIC:
        raise ValueError("not a hook request")
    hook, cwd, mask, count = fields[1].decode("ascii"), os.fsdecode(fields[2]), int(fields[3]), int(fields[4])
    if count < 0 or len(fields) < 5 + count or not 0 <= mask <= 0o777:
        raise ValueError("a malformed hook request")
    args = [os.fsdecode(arg) for arg in fields[5:5 + count]]
    env = {}
    for item in fields[5 + count:]:
        key, sep, value = item.partition(b"=")
        if not sep or not key:
            raise ValueError("a malformed environment entry")
        env[key] = value
    return hook, cwd, mask, args, env
