"""Careful file writes for code that runs as root: no following links, restrictive modes, atomic."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

from .jsontypes import is_int

DIR_MODE = 0o750
FILE_MODE = 0o640
MAX_STATE_BYTES = 16 * 1024 * 1024
CORRUPT_SUFFIX = ".corrupt"      # where a state file that does not match its schema is kept


MAX_NAME_BYTES = 255


def name_problem(name: object) -> Optional[str]:
    """Why ``name`` cannot be one file or directory name under a directory we own, or None.

    The one safe-name rule for every name that becomes a path component (node names, simulated
    HCAs and their counter files, cursor readers): a single component, so never ``..``, never
    absolute, never hidden (our own lock and temp files start with a dot), no control
    characters (a name also ends up in logs), at most 255 bytes.
    """
    if not isinstance(name, str) or not name:
        return "is empty" if isinstance(name, str) else f"is {type(name).__name__}, not a string"
    if "/" in name:
        return "holds a '/'"
    if name.startswith("."):
        return "starts with '.'"
    if any(ord(char) < 0x20 or ord(char) == 0x7f for char in name):
        return "holds a control character"
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    return None


def path_component(name: str) -> str:
    """``name`` checked by ``name_problem``; ValueError (one line) when it is not safe."""
    problem = name_problem(name)
    if problem:
        shown = name if not isinstance(name, str) or len(name) <= 80 else name[:77] + "..."
        raise ValueError(f"{shown!r} is not usable as a file name: it {problem}")
    return name


def ensure_dir(path: str, mode: int = DIR_MODE) -> str:
    """Create ``path`` (and missing parents) with exactly ``mode``, whatever the umask; refuse a
    symbolic link or a non-directory in its place. Existing directories keep their mode (a
    parent may be /var/lib or /tmp); the state dir itself is checked by ``ensure_state_dir``."""
    path = os.path.abspath(path)
    missing = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            continue            # made by a concurrent run: checked like any existing one
        os.chmod(directory, mode)          # mkdir's mode went through the umask
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise OSError(errno.ELOOP, "is a symbolic link; refusing to use it", path)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "is not a directory", path)
    return path


_CHECKED_STATE_DIRS: Set[str] = set()


def ensure_state_dir(state_dir: str) -> str:
    """The state dir, created 0750 if missing; an existing one must be ours and is kept to at
    most 0750 (a directory others can write lets them swap a state file for a FIFO or a link).

    Another owner is refused (PermissionError): root's hooks must not write where another user
    decides what the files are."""
    path = os.path.abspath(state_dir)
    if path in _CHECKED_STATE_DIRS:
        return path
    ensure_dir(path)
    info = os.lstat(path)
    if info.st_uid != os.geteuid():
        raise PermissionError(errno.EPERM, f"state dir is owned by uid {info.st_uid}, not by uid "
                              f"{os.geteuid()} which runs this; refusing to use it", path)
    if stat.S_IMODE(info.st_mode) & ~DIR_MODE:
        os.chmod(path, stat.S_IMODE(info.st_mode) & DIR_MODE)
    _CHECKED_STATE_DIRS.add(path)
    return path


def _write_all(fd: int, payload: bytes) -> None:
    """Every byte or an OSError: a short write (a full disk) is continued, never ignored."""
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _open_new_temp(directory: str, name: str, mode: int) -> Tuple[int, str]:
    """A temporary file beside the target under a name nobody can predict, created by us
    (O_EXCL: a pre-placed file or link of that name is never written through)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = os.path.join(directory, f".{name[:200]}.{os.urandom(8).hex()}.tmp")
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", directory)


def atomic_write(path: str, data: Union[str, bytes], mode: int = FILE_MODE, durable: bool = True) -> None:
    """Write a whole file so readers see the old or the new content, never a mix.

    The new content is written in full and fsynced under a fresh temporary name, given
    exactly ``mode``, then renamed over ``path``; on any failure (ENOSPC included) the
    temporary file is removed, the error raised and the previous file left as it was.
    ``durable=False`` skips the two fsyncs (about 1.5 ms, far more on a busy disk) for an
    output the next run writes again anyway (the health check's last result and metrics):
    still atomic, but a crash right after may leave the previous content."""
    directory = os.path.dirname(os.path.abspath(path))
    ensure_dir(directory)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = _open_new_temp(directory, os.path.basename(path), mode)
    try:
        try:
            os.fchmod(fd, mode)            # the umask applied to O_CREAT's mode
            _write_all(fd, payload)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    """Make the rename itself durable (best effort: some filesystems refuse)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_state_file(path: str, flags: int, mode: int = FILE_MODE, *, ours: bool = True) -> int:
    """Open a file of ours in the state dir: never through a link, never a FIFO or device
    (opened non-blocking, then refused), never another user's file; a file we create or own
    gets exactly ``mode``. ``ours=False`` lets an admin's reader open root's files."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "is not a regular file; refusing to use it", path)
        if ours and info.st_uid != os.geteuid():
            raise PermissionError(errno.EPERM, f"is owned by uid {info.st_uid}; refusing to use it", path)
        if flags & (os.O_WRONLY | os.O_RDWR) and stat.S_IMODE(info.st_mode) != mode:
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_line(path: str, line: str, mode: int = FILE_MODE) -> None:
    """Append one line. A line an earlier append left torn (a full disk wrote part of it, a
    crash) is ended first, so that it never swallows this one: readers skip the torn line alone."""
    fd = open_state_file(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, mode)
    try:
        payload = (line.rstrip("\n") + "\n").encode("utf-8", "surrogateescape")
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            payload = b"\n" + payload
        _write_all(fd, payload)
    finally:
        os.close(fd)


# Lock holders do a short read-modify-write; 10 s is far beyond that and well inside a hook's
# own deadline (slurmd kills a HealthCheckProgram after 60 s).
LOCK_WAIT_S = 10.0


class LockTimeout(OSError):
    """Another process held the lock past the deadline."""


@contextlib.contextmanager
def locked(path: str, timeout_s: Optional[float] = None) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if missing) for read-modify-write.

    The wait has a deadline: a lock held by a hung or hostile process makes this raise
    LockTimeout (an OSError) after ``timeout_s`` instead of blocking a hook forever."""
    timeout_s = LOCK_WAIT_S if timeout_s is None else timeout_s
    ensure_dir(os.path.dirname(os.path.abspath(path)))
    fd = open_state_file(path, os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + timeout_s
        pause = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LockTimeout(errno.ETIMEDOUT, f"lock held by another process for over {timeout_s:g} s",
                                      path) from None
                time.sleep(min(pause, remaining))
                pause = min(pause * 2, 0.2)
        yield
    finally:
        os.close(fd)


class NewerFormat(OSError):
    """A state file in a format newer than this code reads: written by a newer version of this
    tool, read by an older one after a rollback. It is left exactly as it is (never set aside,
    never rewritten): the newer version reads it again once it is back."""


def read_state_json(path: str, problem_of: Optional[Callable[[Dict[str, Any]], Optional[str]]] = None,
                    read_only: bool = False, newest: Optional[int] = None,
                    version_key: str = "version") -> Optional[Dict[str, Any]]:
    """A state file's JSON object, or None: the caller starts afresh, never fails the hook.

    ``newest``: the newest format this code reads; a file whose ``version_key`` is a larger
    integer (a file without one is format 1) raises ``NewerFormat`` before its schema is checked,
    so that the caller writes nothing over it; a ``read_only`` reader gets None for it.

    None when the file is absent or not ours (a link, another owner, world-writable, not a
    regular file): left alone. A file of ours that is too big, not JSON (NaN and Infinity
    included), not an object, or in which ``problem_of`` finds a problem (its schema) is set
    aside as ``<path>.corrupt`` for the admin, said once on stderr, and None is returned so
    that the caller rebuilds it. ``read_only``: a reader that never writes (slurm-gpu-watch)
    gets None for such a file and leaves it for its writer to set aside.
    """
    data: Any = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not _is_ours(info):
            return None
        if info.st_size > MAX_STATE_BYTES:
            problem: Optional[str] = f"larger than {MAX_STATE_BYTES} bytes"
        else:
            data, problem = _parse_json(_read_all(fd))
    except OSError:
        return None
    finally:
        os.close(fd)
    if problem is None and not isinstance(data, dict):
        problem = f"a JSON {type(data).__name__}, not an object"
    if problem is None and newest is not None:
        version = data.get(version_key, 1)
        if is_int(version) and version > newest:
            if read_only:
                return None
            raise NewerFormat(errno.EPROTO, f"format {version} of a newer slurm-gpu-hooks (this version reads up "
                                            f"to {newest}): left as it is", path)
    if problem is None and problem_of is not None:
        problem = problem_of(data)
    if problem is not None:
        if not read_only:
            set_aside(path, problem)
        return None
    return data


def set_aside(path: str, problem: str) -> str:
    """Move a corrupt state file to ``<path>.corrupt`` (replacing an older one) and say so once."""
    aside = path + CORRUPT_SUFFIX
    try:
        os.replace(path, aside)
        done = f"moved to {aside}"
    except OSError as exc:
        done = f"could not be moved aside ({exc.strerror or exc})"
    print(f"slurm-gpu-hooks: state file {path} is unusable ({_one_line(problem)}); {done}; starting afresh",
          file=sys.stderr)
    return aside


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a state file holds")


def _parse_json(raw: bytes) -> Tuple[Any, Optional[str]]:
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant), None
    except (ValueError, RecursionError) as exc:
        return None, f"not JSON: {exc}"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:200]


def _is_ours(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o002


# -- temporary directories of one run ------------------------------------------------------------

@contextlib.contextmanager
def run_temp_dir(prefix: str, parent: Optional[str] = None) -> Iterator[str]:
    """A private (0700) directory for one run, named ``<prefix><pid>-<random>`` and removed when
    the run ends. A run killed with SIGKILL cannot clean up, so every run first removes the
    directories of earlier runs whose process is gone (``clean_stale_temp_dirs``)."""
    import shutil
    import tempfile     # both only here and below: every hook imports this module (4-5 ms)

    parent = parent or tempfile.gettempdir()
    clean_stale_temp_dirs(prefix, parent)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def clean_stale_temp_dirs(prefix: str, parent: Optional[str] = None) -> List[str]:
    """Remove our ``<prefix><pid>-*`` directories whose process no longer runs; returns them."""
    import shutil
    import tempfile

    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        pid_text = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
        if not pid_text.isdigit() or _process_alive(int(pid_text)):
            continue
        path = os.path.join(parent, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True            # another user's process: alive, and not ours to judge
    return True
