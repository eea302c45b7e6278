"""Reading the kernel log: what every reader shares (the error, the incremental result, the
read budget) and choosing the source. The readers themselves: ``kmsg`` (/dev/kmsg),
``journal`` (journalctl -k), ``logfiles`` (plain files, rotated .gz too, and stdin); a caller
imports only the one its source needs.

Every reader feeds bytes to a ``LineScanner`` and never holds more than a chunk. Incremental
readers take the previous cursor and return the next one; when a cursor does not fit any more
(rotation, truncation, a reboot) they read at most ``rescan_bytes`` from the end instead of the
whole log, and say why.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Dict, Optional

from .scanner import LineScanner

KMSG = "/dev/kmsg"
JOURNALCTL_PATHS = ("/usr/bin/journalctl", "/bin/journalctl")
FALLBACK_FILES = ("/var/log/kern.log", "/var/log/messages", "/var/log/syslog")


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


def over_budget(budget: Optional[Budget], scanner: LineScanner) -> bool:
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


def os_error(what: str, exc: OSError) -> KernelLogError:
    return KernelLogError(f"cannot read {what}: {exc.strerror or exc}")


def stdin_binary() -> BinaryIO:
    return sys.stdin.buffer
