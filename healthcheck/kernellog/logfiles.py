"""Reading the kernel log from a plain file (syslog's kern.log, messages; a rotated .gz too) or
a stream (stdin): one-shot reads, optionally from a time on (a bisection over the file), and
incremental reads that follow the file by a cursor across truncation and rotation."""
from __future__ import annotations

import glob
import os
import stat
from typing import Any, BinaryIO, Callable, Dict, Optional, Tuple

from .cursor import SPAN_MAX, file_marks, marks_match
from .readers import Budget, Incremental, KernelLogError, os_error, over_budget
from .scanner import CHUNK, LineScanner
from .parser import TELLABLE, kernel_line_form
from .timestamps import PrefixClock

GZIP_MAGIC = b"\x1f\x8b"
BISECT_SLACK_S = 300.0           # lines are not strictly in time order; start a little early


def _open_file(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise os_error(path, exc) from None
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
    while position < end and not scanner.stopped and not over_budget(budget, scanner):
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
        elif start > 0:
            scanner.prime(*_lines_before(fd, start))
        _feed_range(fd, start, size, scanner, budget)
        offset = min(start + scanner.consumed, size)
        if rescan is None and offset == start and cursor.get("span_bytes") == min(rescan_bytes, SPAN_MAX, offset):
            marks = {key: cursor[key] for key in ("tail_sha256", "head_sha256", "span_bytes", "span_crc32")
                     if key in cursor}             # nothing new: the hashes just checked are the same
        else:
            marks = file_marks(fd, offset, rescan_bytes)
        return Incremental(dict(marks, dev=info.st_dev, ino=info.st_ino, offset=offset,
                                mid_line=not scanner.at_line_start), rescan, scanner.stopped)
    finally:
        os.close(fd)


_BACK = 8192


def _lines_before(fd: int, offset: int) -> Tuple[bytes, bytes]:
    """The two lines that end just before ``offset``, the last one first; a line is empty when it
    is not there whole within ``_BACK`` bytes (its head, where the prefix is, unknown)."""
    back = min(offset, _BACK)
    data = os.pread(fd, back, offset - back)
    if not data.endswith(b"\n"):
        return b"", b""
    found = []
    end = len(data) - 1
    while len(found) < 2 and end >= 0:
        begin = data.rfind(b"\n", 0, end) + 1
        if begin == 0 and back < offset:
            break
        found.append(data[begin:end].rstrip(b"\r"))
        end = begin - 1
    found += [b""] * (2 - len(found))
    return found[0], found[1]


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
            elif offset > 0 and not cursor.get("mid_line"):
                rotated.prime(*_lines_before(fd, offset))
            _feed_range(fd, start, info.st_size, rotated, budget)
            if rotated.stopped:
                at = min(start + rotated.consumed, info.st_size)
                return Incremental(dict(file_marks(fd, at, rescan_bytes), dev=info.st_dev, ino=info.st_ino, offset=at,
                                        mid_line=not rotated.at_line_start),
                                   "the file was rotated or replaced", rotated.stopped)
            rotated.finish()
            return None
        finally:
            os.close(fd)
    return None


FORM_SAMPLE_BYTES = 64 * 1024


def untellable_file_form(path: str) -> Optional[str]:
    """The form of the kernel lines at the end of the log file ``path`` when it is one in which a
    record's later lines cannot be told from the kernel's own lines (``parser.kernel_line_form``:
    a user's text could count as a driver line), else None. Judged on the last 64 KiB: most of
    its kernel lines in such a form, and no indented line (a writer that indents a record's later
    lines tells them). None for a compressed or empty file; ``KernelLogError`` when unreadable."""
    fd = _open_file(path)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - FORM_SAMPLE_BYTES)
        sample = os.pread(fd, size - start, start) if not _is_gzip(fd) else b""
    finally:
        os.close(fd)
    lines = sample.split(b"\n")
    if start > 0:
        lines = lines[1:]                 # the first one began before the sample
    forms: Dict[str, int] = {}
    for line in lines:
        line = line.rstrip(b"\r")
        if line[:1] in (b" ", b"\t") and line.strip():
            return None
        form = kernel_line_form(line)
        if form is not None:
            forms[form] = forms.get(form, 0) + 1
    tellable = forms.pop(TELLABLE, 0)
    if not forms:
        return None
    form, count = max(forms.items(), key=lambda item: item[1])
    return form if count > tellable else None
