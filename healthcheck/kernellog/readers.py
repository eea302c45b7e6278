"""Reading the kernel log: /dev/kmsg, journalctl -k, plain files (rotated .gz too), stdin.

Every reader feeds bytes to a ``LineScanner`` and never holds more than a chunk. Incremental
readers take the previous cursor and return the next one; when a cursor does not fit any more
(rotation, truncation, a reboot) they read at most ``rescan_bytes`` from the end instead of the
whole log, and say why.
"""
from __future__ import annotations

import errno
import glob
import os
import shutil
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple

from ..safeio import programs
from .cursor import boot_id, file_marks, marks_match
from .scanner import CHUNK, LineScanner
from .timestamps import PrefixClock, boot_time

KMSG = "/dev/kmsg"
JOURNALCTL_PATHS = ("/usr/bin/journalctl", "/bin/journalctl")
FALLBACK_FILES = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog")
GZIP_MAGIC = b"\x1f\x8b"
JOURNAL_BYTES_PER_LINE = 128     # turns rescan_bytes into journalctl -n for a bounded rescan
BISECT_SLACK_S = 300.0           # lines are not strictly in time order; start a little early


class KernelLogError(Exception):
    """The kernel log could not be read; the message is one line an admin understands."""


@dataclass
class Incremental:
    cursor: Dict[str, Any]
    rescan: Optional[str] = None          # why the old cursor was not used, when it was not
    stopped: Optional[str] = None         # why the read stopped before the end (it resumes there)


@dataclass
class Budget:
    """What one incremental read may take; None: no bound. Checked between chunks, and only once
    the read has moved its cursor, so every read makes progress."""
    max_bytes: Optional[int] = None
    max_seconds: Optional[float] = None
    started: float = field(default_factory=time.monotonic)

    def exhausted(self, bytes_read: int) -> Optional[str]:
        if self.max_bytes is not None and bytes_read >= self.max_bytes:
            return f"the read budget of {self.max_bytes} bytes ([xid] read_budget_bytes) was spent"
        if self.max_seconds is not None and time.monotonic() - self.started >= self.max_seconds:
            return f"the read budget of {self.max_seconds:g} s ([xid] read_budget_s) was spent"
        return None


def _over_budget(budget: Optional[Budget], scanner: LineScanner) -> bool:
    """Stop ``scanner`` when the budget is spent and it has consumed something."""
    if budget is None or scanner.consumed <= 0:
        return False
    why = budget.exhausted(scanner.stats.bytes_read)
    if why:
        scanner.stop(why)
    return why is not None


# -- choosing the source ---------------------------------------------------------------------------

def journalctl_path() -> Optional[str]:
    for path in JOURNALCTL_PATHS:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("journalctl")


def resolve(kernel_log: str) -> str:
    """"auto" -> "kmsg" when /dev/kmsg can be read, else "journal", else the first syslog file."""
    if kernel_log != "auto":
        return kernel_log
    try:
        os.close(os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK))
        return "kmsg"
    except OSError:
        pass
    if journalctl_path():
        return "journal"
    for path in FALLBACK_FILES:
        if os.path.isfile(path):
            return path
    raise KernelLogError("no kernel log found: /dev/kmsg is unreadable, journalctl is missing and "
                         f"none of {', '.join(FALLBACK_FILES)} exists ([paths] kernel_log)")


def _os_error(what: str, exc: OSError) -> KernelLogError:
    return KernelLogError(f"cannot read {what}: {exc.strerror or exc}")


# -- plain files -----------------------------------------------------------------------------------

def _open_file(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _os_error(path, exc) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise KernelLogError(f"cannot read {path}: not a regular file")
    return fd


def _is_gzip(fd: int) -> bool:
    return os.pread(fd, 2, 0) == GZIP_MAGIC


def _feed_range(fd: int, start: int, end: int, scanner: LineScanner, budget: Optional[Budget] = None) -> None:
    """Feed bytes ``start``..``end`` of ``fd``. Full chunks are read into one reused buffer: a
    fresh 2 MiB ``bytes`` per read costs more than searching it (page faults on every new
    allocation), measured in docs/performance.md."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    position = start
    while position < end and not scanner.stopped and not _over_budget(budget, scanner):
        want = min(CHUNK, end - position)
        got = os.preadv(fd, [view[:want]], position) if _PREADV else _pread_into(fd, view, want, position)
        if not got:
            break
        scanner.feed(buffer if got == CHUNK else bytes(view[:got]))
        position += got


_PREADV = hasattr(os, "preadv")


def _pread_into(fd: int, view: memoryview, want: int, position: int) -> int:
    chunk = os.pread(fd, want, position)
    view[:len(chunk)] = chunk
    return len(chunk)


def _feed_stream(stream: BinaryIO, scanner: LineScanner) -> None:
    readinto = getattr(stream, "readinto", None)
    if readinto is None:
        while True:
            chunk = stream.read(CHUNK)
            if not chunk:
                break
            scanner.feed(chunk)
        return
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while True:
        got = readinto(buffer)
        if not got:
            break
        scanner.feed(buffer if got == CHUNK else bytes(view[:got]))


def file_clock(fd: int) -> PrefixClock:
    """Syslog lines have no year: the file's mtime is the reference for the year."""
    return PrefixClock(reference=os.fstat(fd).st_mtime)


def read_file_all(path: str, make_scanner: Callable[[PrefixClock], LineScanner],
                  since: Optional[float] = None) -> None:
    """A one-shot read of a file (gzip or plain); with ``since``, start near that time."""
    fd = _open_file(path)
    try:
        clock = file_clock(fd)
        scanner = make_scanner(clock)
        if _is_gzip(fd):
            problem = _feed_gzip(fd, scanner)
            if problem:
                # A truncated or corrupt .gz: what was read before the damage still counts.
                scanner.stats.problems.append(f"{path}: damaged gzip data ({problem})")
        else:
            size = os.fstat(fd).st_size
            start = bisect_offset(fd, size, since - BISECT_SLACK_S, clock) if since is not None else 0
            if start > 0:
                scanner.start_mid_line()
                start -= 1           # read the byte before: a start on a line boundary keeps that line
            _feed_range(fd, start, size, scanner)
        scanner.finish()
    finally:
        os.close(fd)


GZIP_READ = 64 * 1024


def _feed_gzip(fd: int, scanner: LineScanner) -> Optional[str]:
    """Decompress a gzip file (several members too) into the scanner piece by piece, so that
    everything before a damaged or missing part is fed; returns what was wrong, or None."""
    import zlib

    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    position = 0
    while True:
        raw = os.pread(fd, GZIP_READ, position)
        if not raw:
            break
        position += len(raw)
        while raw:
            try:
                # Small output steps: an error (a bad CRC at the end) loses at most one step.
                scanner.feed(decoder.decompress(raw, GZIP_READ))
            except zlib.error as exc:
                return str(exc)
            raw = decoder.unconsumed_tail
            if decoder.eof:
                raw = decoder.unused_data + raw
                if raw.lstrip(b"\0") == b"":
                    raw = b""               # padding after the last member
                else:
                    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        scanner.feed(decoder.flush())
    except zlib.error as exc:
        return str(exc)
    return None if decoder.eof else "the file ends before the end of its compressed data"


def read_stream_all(stream: BinaryIO, make_scanner: Callable[[PrefixClock], LineScanner]) -> None:
    scanner = make_scanner(PrefixClock())
    _feed_stream(stream, scanner)
    scanner.finish()


def bisect_offset(fd: int, size: int, target: float, clock: PrefixClock) -> int:
    """An offset at or before the first line written at ``target``; 0 when lines carry no time."""
    low, high = 0, size
    while high - low > CHUNK:
        middle = (low + high) // 2
        moment = _first_time_after(fd, middle, clock)
        if moment is None:
            return low
        if moment < target:
            low = middle
        else:
            high = middle
    return low


def _first_time_after(fd: int, offset: int, clock: PrefixClock) -> Optional[float]:
    block = os.pread(fd, 16384, offset)
    lines = block.split(b"\n")[1:-1]     # the first is partial, the last may be
    for line in lines:
        wall, _ = clock.parse(line[:96])
        if wall is not None:
            return wall
    return None


def read_file_incremental(path: str, cursor: Optional[Dict[str, Any]], rescan_bytes: int,
                          make_scanner: Callable[[PrefixClock], LineScanner],
                          budget: Optional[Budget] = None) -> Incremental:
    """Read what was appended since ``cursor``; a bounded rescan when the cursor does not fit.
    A read stopped by ``budget`` or by its scanner returns the cursor where it stopped."""
    fd = _open_file(path)
    try:
        info = os.fstat(fd)
        if _is_gzip(fd):
            raise KernelLogError(f"{path} is compressed: a compressed file cannot be followed; "
                                 "point [paths] kernel_log at the live log")
        clock = file_clock(fd)
        size = info.st_size
        start: Optional[int] = None
        rescan: Optional[str] = None
        if not cursor:
            rescan = "no cursor yet"
        elif cursor.get("dev") == info.st_dev and cursor.get("ino") == info.st_ino:
            offset = int(cursor.get("offset", -1))
            if offset < 0 or offset > size:
                rescan = "the file was truncated"
            elif not marks_match(fd, offset, cursor):
                rescan = "the file was rewritten"
            else:
                start = offset
        else:
            rescan = "the file was rotated or replaced"
            resumed = _finish_rotated(path, cursor, rescan_bytes, make_scanner, budget)
            if resumed is not None:
                return resumed           # stopped inside the rotated file: the next run goes on there
        scanner = make_scanner(clock)
        if start is None:
            start = max(0, size - rescan_bytes)
            if start > 0:
                scanner.start_mid_line()
                start -= 1
        elif cursor.get("mid_line"):
            scanner.start_mid_line()
        _feed_range(fd, start, size, scanner, budget)
        offset = min(start + scanner.consumed, size)
        return Incremental(dict(file_marks(fd, offset), dev=info.st_dev, ino=info.st_ino, offset=offset,
                                mid_line=not scanner.at_line_start), rescan, scanner.stopped)
    finally:
        os.close(fd)


def _finish_rotated(path: str, cursor: Dict[str, Any], rescan_bytes: int,
                    make_scanner: Callable[[PrefixClock], LineScanner],
                    budget: Optional[Budget]) -> Optional[Incremental]:
    """The rest of the file the cursor points into, now renamed (kern.log.1, messages-20250223).
    Returns a cursor into that file when the read stopped before its end, else None."""
    for candidate in glob.glob(glob.escape(path) + ".1") + glob.glob(glob.escape(path) + "-[0-9]*"):
        if candidate.endswith(".gz"):
            continue
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != (cursor.get("dev"), cursor.get("ino")):
                continue
            offset = int(cursor.get("offset", 0))
            if offset > info.st_size or not marks_match(fd, offset, cursor):
                return None
            start = max(offset, info.st_size - rescan_bytes)
            rotated = make_scanner(file_clock(fd))
            if start > offset:
                rotated.start_mid_line()
                start -= 1
            _feed_range(fd, start, info.st_size, rotated, budget)
            if rotated.stopped:
                at = min(start + rotated.consumed, info.st_size)
                return Incremental(dict(file_marks(fd, at), dev=info.st_dev, ino=info.st_ino, offset=at,
                                        mid_line=not rotated.at_line_start),
                                   "the file was rotated or replaced", rotated.stopped)
            rotated.finish()
            return None
        finally:
            os.close(fd)
    return None


# -- /dev/kmsg -------------------------------------------------------------------------------------

def _kmsg_records(path: str) -> Iterator[bytes]:
    """Records from /dev/kmsg (one per read), or lines from a file holding kmsg records."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _os_error(path, exc) from None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        pending = b""
        while True:
            try:
                block = os.read(fd, CHUNK if regular else 16384)
            except BlockingIOError:
                break                      # no more records for now
            except BrokenPipeError:
                continue                   # records were overwritten before we read them
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    raise KernelLogError(f"{path}: a record did not fit the read buffer") from None
                raise _os_error(path, exc) from None
            if not block:
                break
            pending += block
            lines = pending.split(b"\n")
            pending = lines.pop()
            for line in lines:
                if line and not line.startswith(b" "):       # " KEY=value" lines are record metadata
                    yield line
        if pending and not pending.startswith(b" "):
            yield pending
    finally:
        os.close(fd)


def _kmsg_seq(record: bytes) -> Optional[int]:
    head = record[:64].split(b";", 1)[0].split(b",")
    try:
        return int(head[1])
    except (IndexError, ValueError):
        return None


def read_kmsg(path: str, cursor: Optional[Dict[str, Any]],
              make_scanner: Callable[[PrefixClock], LineScanner], budget: Optional[Budget] = None) -> Incremental:
    """Records after the cursor's sequence number in this boot; every record after a reboot
    (the ring buffer itself is the bound)."""
    current_boot = boot_id()
    after = -1
    rescan = None
    if not cursor:
        rescan = "no cursor yet"
    elif cursor.get("boot_id") != current_boot:
        rescan = "the node rebooted"
    else:
        after = int(cursor.get("seq", -1))
    scanner = make_scanner(PrefixClock(boot_time=boot_time()))
    batch = _KmsgBatch(scanner, after)
    for record in _kmsg_records(path):
        seq = _kmsg_seq(record)
        if seq is None or seq <= after:
            continue
        if not batch.add(record, seq) or _over_budget(budget, scanner):
            break
    batch.flush()
    scanner.finish()
    return Incremental({"boot_id": current_boot, "seq": batch.last}, rescan, scanner.stopped)


class _KmsgBatch:
    """Records fed to the scanner a chunk at a time; ``last`` is the sequence number of the last
    record the scanner consumed (when it stops on a record, the one before it)."""

    def __init__(self, scanner: LineScanner, after: int):
        self.scanner = scanner
        self.last = after
        self.bytes = bytearray()
        self.ends: List[Tuple[int, int]] = []       # (scanner offset after the record, seq)
        self.fed = 0

    def add(self, record: bytes, seq: int) -> bool:
        self.bytes += record + b"\n"
        self.ends.append((self.fed + len(self.bytes), seq))
        return self.flush() if len(self.bytes) >= CHUNK else True

    def flush(self) -> bool:
        """Feed what is batched; False once the scanner has stopped."""
        if self.bytes and not self.scanner.stopped:
            self.scanner.feed(bytes(self.bytes))
            self.fed += len(self.bytes)
            self.bytes.clear()
            for end, seq in self.ends:
                if end <= self.scanner.consumed:
                    self.last = max(self.last, seq)
            self.ends.clear()
        return not self.scanner.stopped


# -- journalctl ------------------------------------------------------------------------------------

def _journal_argv(extra: List[str]) -> List[str]:
    path = journalctl_path()
    if path is None:
        raise KernelLogError("journalctl not found ([paths] kernel_log = \"journal\")")
    return [path, "-k", "-o", "short-unix", "--no-pager"] + extra


def _run_streaming(argv: List[str], timeout: float, on_chunk: Callable[[bytes], None]) -> Tuple[int, bytes]:
    """Run argv (no shell), streaming stdout to on_chunk; kill it at the deadline."""
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": ""}
    try:
        return programs.stream(argv, timeout, on_chunk, env=env)
    except programs.CommandError as exc:
        raise KernelLogError(str(exc)) from None


class _CursorTail:
    """Keeps the end of journalctl's output, where ``-- cursor: ...`` (or ``-- No entries --``) is."""

    def __init__(self, scanner: LineScanner, budget: Optional[Budget] = None):
        self.scanner = scanner
        self.budget = budget
        self.tail = b""
        self.skipped = 0                 # bytes not examined after the scanner stopped

    def __call__(self, chunk: bytes) -> None:
        if self.scanner.stopped or _over_budget(self.budget, self.scanner):
            self.skipped += len(chunk)
        else:
            self.scanner.feed(chunk)
        self.tail = (self.tail + chunk)[-4096:]

    def stopped(self) -> Optional[str]:
        if not self.scanner.stopped:
            return None
        return f"{self.scanner.stopped}; the journal cannot resume mid-way: {self.skipped} bytes after it were not examined"

    def no_entries(self) -> bool:
        # journalctl 252 exits 1 with --show-cursor when there is nothing to show.
        return b"-- No entries --" in self.tail

    def cursor(self) -> Optional[str]:
        marker = self.tail.rfind(b"-- cursor: ")
        if marker < 0:
            return None
        return self.tail[marker + len(b"-- cursor: "):].split(b"\n", 1)[0].decode("ascii", "replace").strip() or None


def read_journal(cursor: Optional[Dict[str, Any]], rescan_bytes: int, timeout: float,
                 make_scanner: Callable[[PrefixClock], LineScanner], budget: Optional[Budget] = None) -> Incremental:
    """What journalctl -k gained after the cursor. journalctl gives one cursor, at the end, so a
    read stopped early (by the budget or the distinct-event cap) cannot resume mid-way: it says
    how many bytes after the stop were not examined."""
    rescan = None
    previous = (cursor or {}).get("cursor")
    bounded = ["-b", "-n", str(max(1000, rescan_bytes // JOURNAL_BYTES_PER_LINE))]
    if previous:
        tail = _CursorTail(make_scanner(PrefixClock()), budget)
        code, errors = _run_streaming(_journal_argv(["--show-cursor", f"--after-cursor={previous}"]),
                                      timeout, tail)
        if code == 0 or tail.no_entries():
            tail.scanner.finish()
            return Incremental({"cursor": tail.cursor() or previous}, None, tail.stopped())
        rescan = "journalctl refused the cursor"
    else:
        rescan = "no cursor yet"
    tail = _CursorTail(make_scanner(PrefixClock()), budget)
    code, errors = _run_streaming(_journal_argv(["--show-cursor"] + bounded), timeout, tail)
    if code != 0 and not tail.no_entries():
        raise KernelLogError(f"journalctl -k failed: {_first_line(errors) or f'exit status {code}'}")
    tail.scanner.finish()
    return Incremental({"cursor": tail.cursor() or previous}, rescan, tail.stopped())


def _first_line(errors: bytes) -> str:
    text = errors.decode("utf-8", "replace").strip()
    return text.splitlines()[0][:200] if text else ""


def read_journal_between(since: Optional[float], until: Optional[float], timeout: float,
                         make_scanner: Callable[[PrefixClock], LineScanner]) -> None:
    window = [f"--since=@{int(since)}"] if since is not None else ["-b"]
    if until is not None:
        window.append(f"--until=@{int(until) + 1}")
    tail = _CursorTail(make_scanner(PrefixClock()))
    code, errors = _run_streaming(_journal_argv(window), timeout, tail)
    if code != 0 and not tail.no_entries():
        raise KernelLogError(f"journalctl -k failed: {_first_line(errors) or f'exit status {code}'}")
    tail.scanner.finish()


def stdin_binary() -> BinaryIO:
    return sys.stdin.buffer
