"""When a log line was written, from whatever prefix its writer put before the kernel text.

Forms understood (each may be followed by ``host kernel:`` and a ``[uptime]``)::

    [12345.678901] ...                         dmesg, /dev/kmsg rendered by dmesg (uptime only)
    [Sun Feb 23 16:24:18 2025] ...             dmesg -T (local time; with -d a delta before "]")
    2025-02-23T16:24:18,123456+00:00 ...       dmesg --time-format iso
    Feb 23 16:24:18 host kernel: ...           syslog, journalctl -k (local time, no year)
    2025-02-23T16:24:18.123456+01:00 host ...  rsyslog RFC 3339, journalctl -o short-iso
    1740324258.123456 host kernel: ...         journalctl -o short-unix
    <4>1 2025-02-23T16:24:18.123456Z host kernel - - - ...   RFC 5424 (rsyslog)
    <4>[12345.678901] ...                      the syslog interface (/proc/kmsg, dmesg -r)
    6,1234,5678901234,-;...                    a raw /dev/kmsg record (uptime in microseconds)

Syslog lines carry no year: the year is the reference time's (the file's mtime), or the one
before when that would put the line more than a day in the future.
"""
from __future__ import annotations

import calendar
import re
import time
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Optional, Tuple

_MONTHS = {name: number for number, name in enumerate(
    (b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec"), 1)}

_UPTIME = re.compile(rb"\[\s*(\d{1,10}\.\d{1,9})\]")
_DMESG_T = re.compile(rb"\[(?:[A-Z][a-z]{2} )?([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})(?: *< *\d{1,10}\.\d{1,9}>)?\]")
_SYSLOG = re.compile(rb"([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d)(\.\d{1,9})?\s")
_ISO = re.compile(rb"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)([.,]\d{1,9})?(Z|[+-]\d\d:?\d\d)?\s")
_UNIX = re.compile(rb"(\d{9,11}\.\d{1,9})\s")
_SYSLOG_PRI = re.compile(rb"<\d{1,3}>(?:1 )?")
_KMSG = re.compile(rb"(\d{1,4}),(\d{1,20}),(\d{1,20}),[^;]{0,32};")

Stamp = Tuple[Optional[float], Optional[float]]      # (wall clock epoch s, uptime s)


class PrefixClock:
    """Parses line prefixes into (wall clock, uptime)."""

    def __init__(self, reference: Optional[float] = None, boot_time: Optional[float] = None):
        self.reference = reference if reference is not None else time.time()
        # Known only for /dev/kmsg of the running kernel: turns its uptime into wall clock.
        self.boot_time = boot_time

    def parse(self, prefix: bytes) -> Stamp:
        prefix = prefix.lstrip()
        if not prefix:
            return None, None
        if prefix[:1] == b"<":
            framed = _SYSLOG_PRI.match(prefix)      # "<4>[ 12.3] ", "<4>1 2025-02-23T16:24:18Z host kernel - - - "
            prefix = prefix[framed.end():] if framed else prefix
        head = prefix[:1]
        if head.isdigit():
            kmsg = _KMSG.match(prefix)
            if kmsg:
                uptime = int(kmsg.group(3)) / 1e6
                wall = self.boot_time + uptime if self.boot_time is not None else None
                return wall, uptime
        wall = self._parse_wall(prefix)
        uptime_match = _UPTIME.search(prefix, 0, 200)
        uptime = float(uptime_match.group(1)) if uptime_match else None
        if wall is None and uptime is not None and self.boot_time is not None:
            wall = self.boot_time + uptime
        return wall, uptime

    def _parse_wall(self, prefix: bytes) -> Optional[float]:
        try:
            head = prefix[:1]
            if head == b"[":
                match = _DMESG_T.match(prefix)
                return _local(int(match.group(6)), _MONTHS.get(match.group(1)), match.group(2),
                              match.group(3), match.group(4), match.group(5), None) if match else None
            if head.isdigit():
                match = _ISO.match(prefix)
                if match:
                    return _iso(match)
                match = _UNIX.match(prefix)
                return float(match.group(1)) if match else None
            match = _SYSLOG.match(prefix)
            if match:
                return self._syslog(match)
        except (ValueError, OverflowError):
            return None
        return None

    def _syslog(self, match: "re.Match[bytes]") -> Optional[float]:
        month = _MONTHS.get(match.group(1))
        if month is None:
            return None
        year = time.localtime(self.reference).tm_year
        for candidate in (year, year - 1):
            try:
                stamp = _local(candidate, month, match.group(2), match.group(3), match.group(4),
                               match.group(5), match.group(6))
            except ValueError:          # Feb 29 in a year without one
                continue
            if stamp is not None and stamp <= self.reference + 86400:
                return stamp
        return None


# Floods repeat the same second thousands of times; mktime is the costly part.
@lru_cache(maxsize=1024)
def _local(year: int, month: Optional[int], day: bytes, hour: bytes, minute: bytes, second: bytes,
           fraction: Optional[bytes]) -> Optional[float]:
    if month is None:
        return None
    parts = (year, month, int(day), int(hour), int(minute), int(second), 0, 0, -1)
    stamp = time.mktime(parts)
    return stamp + (float(fraction) if fraction else 0.0)


def _iso(match: "re.Match[bytes]") -> float:
    year, month, day, hour, minute, second = (int(match.group(index)) for index in range(1, 7))
    fraction = float(match.group(7).replace(b",", b".")) if match.group(7) else 0.0     # dmesg iso: a comma
    zone = match.group(8)
    if zone is None:
        return time.mktime((year, month, day, hour, minute, second, 0, 0, -1)) + fraction
    if zone == b"Z":
        offset = 0
    else:
        digits = zone[1:].replace(b":", b"")
        offset = (int(digits[:2]) * 60 + int(digits[2:])) * (1 if zone[:1] == b"+" else -1)
    moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone(timedelta(minutes=offset)))
    return calendar.timegm(moment.utctimetuple()) + fraction


def boot_time() -> Optional[float]:
    """The running kernel's boot time (``btime`` in /proc/stat), to turn kmsg uptime into wall clock."""
    try:
        with open("/proc/stat", "rb") as handle:
            for line in handle:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None
