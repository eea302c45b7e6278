"""Reading the kernel log through ``journalctl -k`` (no shell, under a deadline): what the
journal gained after a cursor, or a time window."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ..safeio import programs
from .readers import Budget, Incremental, KernelLogError, journalctl_path, over_budget
from .scanner import LineScanner
from .timestamps import PrefixClock

JOURNAL_BYTES_PER_LINE = 128     # turns rescan_bytes into journalctl -n for a bounded rescan


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
        if self.scanner.stopped or over_budget(self.budget, self.scanner):
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
