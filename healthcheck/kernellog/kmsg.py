"""Reading the kernel log from /dev/kmsg (or a file of kmsg records): the records after the
cursor's sequence number in this boot, every record after a reboot."""
from __future__ import annotations

import errno
import os
import stat
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .cursor import boot_id
from .readers import Budget, Incremental, KernelLogError, os_error, over_budget
from .scanner import CHUNK, LineScanner
from .timestamps import PrefixClock, boot_time


def _kmsg_records(path: str) -> Iterator[bytes]:
    """Records from /dev/kmsg (one per read), or lines from a file holding kmsg records."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise os_error(path, exc) from None
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
                raise os_error(path, exc) from None
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
        if not batch.add(record, seq) or over_budget(budget, scanner):
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
