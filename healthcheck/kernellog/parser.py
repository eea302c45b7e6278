"""One kernel-log line (bytes) -> an event, a PCI->UUID companion, or None.

Line forms (the kernel text; any syslog/journal/dmesg prefix may come before it)::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00): 95, pid=2371, Uncontained: FBHUB. RST: Yes, D-RST: No
    NVRM: Xid (PCI:0000:3b:00): 62, pid='<unknown>', name=<unknown>, 0000(0000) ...
    NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=..., name=..., Graphics SM Warp ...
    NVRM: Xid (0000:03:00): 14, Channel 00000001                    (old drivers: no "PCI:")
    NVRM: Xid (PCI:0000:04:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (...)
    NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 ...)
    NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.              (no Xid number)
    NVRM: The NVIDIA GPU 0000:29:00.0                                 (the driver's three-line
    NVRM: (PCI ID: 10de:2330) installed in this system has            lost-GPU message: three
    NVRM: fallen off the bus and is not responding to commands.       lines, or one /dev/kmsg
                                                                      record with \x0a escapes)
    NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-...                    (companion: PCI -> UUID)
    nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up

Nothing here raises on any input: undecodable bytes are kept as ``\\xNN`` escapes, and a line
that does not match a form exactly yields None (a truncated line is never guessed at).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

from ..xid.events import FALLEN_OFF_BUS_CODE, XidEvent
from .timestamps import PrefixClock

# The scanner looks for these with bytes.find before any regex runs; every line form above
# contains one of them ("Xid (" covers both "NVRM: Xid (" and "SXid (").
NEEDLES = (b"Xid (", b"NVRM: GPU ", b"NVRM: The NVIDIA GPU ", b"NVRM: fallen off the bus and is not")

MAX_MESSAGE = 2000          # characters kept of a message (a flood line can be huge)

_ADDR = rb"(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
_XID = re.compile(rb"NVRM: Xid \((?:PCI:)?" + _ADDR
                  + rb"(?P<mig>(?: GPU-C?I:\d{1,4}){0,2})\): (?P<code>\d{1,9}),(?P<rest>.*)", re.S)
_SXID = re.compile(rb"(?:(?P<device>nvidia-nvswitch\d{1,4}): )?SXid \((?:PCI:)?" + _ADDR
                   + rb"\): (?P<code>\d{1,9}),(?P<rest>.*)", re.S)
_FALLEN = re.compile(rb"NVRM: GPU (?:at )?(?:PCI:)?" + _ADDR + rb":? (?:GPU )?has fallen off the bus")
# The three-line message as one record ("\x0a" is how /dev/kmsg writes its newlines), its
# first line alone (the address) and its last line alone (what happened, no address).
_NL = rb"(?:\\x0a|\n)"
_LOST_RECORD = re.compile(rb"NVRM: The NVIDIA GPU " + _ADDR + _NL + rb"NVRM: \(PCI ID: [0-9a-fA-F:]{0,16}\) "
                          rb"installed in this system has" + _NL + rb"NVRM: fallen off the bus and is not responding")
_LOST_INTRO = re.compile(rb"NVRM: The NVIDIA GPU " + _ADDR + rb"\s*$")
_LOST_TAIL = re.compile(rb"NVRM: fallen off the bus and is not responding to commands")
_UUID = rb"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_COMPANION = re.compile(rb"NVRM: GPU at (?:PCI:)?" + _ADDR + rb": (?P<uuid>" + _UUID + rb")")
_MIG = re.compile(rb"GPU-(C?)I:(\d{1,4})")
_PID_NAME = re.compile(rb"\s*pid=(?P<pid>'?<unknown>'?|\d{1,10}),\s*(?:name=(?P<name>'?<unknown>'?|[^,]{0,64}),\s*)?")
# A process name is the task's comm: at most TASK_COMM_LEN - 1 = 15 bytes, and it may hold
# ", " itself ("name=a, b, GPU has fallen off the bus."): the name is the longest run of
# ", "-separated pieces that fits, unless what follows its first piece opens a driver message.
_COMM_MAX = 15
_MESSAGE_OPENING = re.compile(rb"Ch [0-9a-fA-F]{8}\b|Graphics |GPU has fallen|MMU Fault|Contained|Uncontained")
# The value must be followed by its name: "to 0x1" cut from "to 0x12 (...)" is not trusted.
_RECOVERY = re.compile(rb"recovery action changed from 0x[0-9a-fA-F]{1,8}(?: \([^)]*\))? to 0x([0-9a-fA-F]{1,8}) \(")
_NVLINK5 = re.compile(rb"\s*(?P<unit>[A-Z][A-Z0-9_]{1,40})\b[^(]{0,120}"
                      rb"\((?P<intrinfo>0x[0-9a-fA-F]{1,8})\s+(?P<status>0x[0-9a-fA-F]{1,8})[\s)]")
_SEVERITY = re.compile(rb"\s*(?P<severity>Fatal|Non-fatal|Nonfatal|Non-Fatal),\s*")
_SXID_DETAIL = re.compile(rb"\s*(?:Severity \d+ Engine instance|Data \{)")
# Where the kernel's own message starts. The driver's lines start the message; anything else
# that merely holds their text is not believed: a file exec'd with a NULL argv ("process 'x'
# launched '<name>' ..."), a segfault report naming a crafted comm and file, a syslog line from
# another program ("alice[77]: hi kernel: NVRM: ..."). So the match is anchored right after the
# one prefix each source format writes, and that prefix must name the kernel.
_WALL = (rb"(?:[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?:\.\d{1,9})?"                  # syslog, journalctl short
         rb"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?"  # RFC 3339, short-iso
         rb"|\d{9,11}\.\d{1,9}"                                                         # journalctl short-unix
         rb"|\[ *\d{1,10}\.\d{1,9}\])")                                                # journalctl short-monotonic
_BRACKET = (rb"\[(?: *\d{1,10}\.\d{1,9}(?: *< *\d{1,10}\.\d{1,9}>)?"                     # dmesg uptime (-d: delta)
            rb"|< *\d{1,10}\.\d{1,9}>"                                                   # dmesg --time-format delta
            rb"| *\+\d{1,10}\.\d{1,9}"                                                    # dmesg -H / --reltime
            rb"|[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d"                                          # ... and its minute line
            rb"|(?:[A-Z][a-z]{2} )?[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4}"            # dmesg -T
            rb"(?: *< *\d{1,10}\.\d{1,9}>)?)\]")                                           # ... -d
# dmesg --time-format iso: a comma before the fraction (rsyslog and journalctl write a dot); the
# message follows it, never a host and tag.
_DMESG_ISO = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{1,9}(?:Z|[+-]\d\d:?\d\d)"
# RFC 5424 as rsyslog writes it: "<PRI>1 TIMESTAMP HOST APP-NAME PROCID MSGID SD MSG"; the kernel's
# APP-NAME is "kernel" and its facility (PRI >> 3) 0.
# rsyslog's imklog keeps the kernel's own stamp at the start of MSG by default (ParseKernelTimestamp
# off): "<4>1 TS host kernel - - - [  218.412166] NVRM: ...".
_RFC5424 = re.compile(rb"<(\d{1,3})>1 (?:-|" + _WALL + rb") [^\s]{1,255} kernel [^\s]{1,128} [^\s]{1,32} - "
                      rb"(?P<stamp>\[ *\d{1,10}\.\d{1,9}\] ?)?")
# The syslog interface (/proc/kmsg, syslog(2), `dmesg -r`): "<PRI>" then the kernel's prefix.
_SYSLOG_PRI = re.compile(rb"<(\d{1,3})>(?=\[)")
_KERNEL_PREFIX = re.compile(
    rb"(?:" + _DMESG_ISO + rb"[ \t]+"                                         # dmesg --time-format iso
    rb"|(?:" + _WALL + rb"[ \t]+)?(?:[^\s]{1,255}[ \t]+)?kernel:[ \t]*"      # [time] [host] kernel:
    rb"|" + _WALL + rb"[ \t]+)?"                                             # time only (dmesg --time-format)
    rb"(?:kern *:[a-z]{1,8} *: *(?:" + _DMESG_ISO + rb"[ \t]+)?)?"            # dmesg -x: the kernel facility only
    rb"(?:" + _BRACKET + rb"[ \t]*)?")
# A raw /dev/kmsg record: "PRIORITY,SEQ,USEC,FLAGS;message". The priority holds the facility
# (priority >> 3); the kernel's is 0 and userspace writing to /dev/kmsg cannot claim it.
_KMSG_HEAD = re.compile(rb"(\d{1,4}),\d{1,20},\d{1,20},[^;]{0,32};")
# The kernel's own stamp of a record where the syslog interface (/proc/kmsg, syslog(2): `dmesg -S`
# and rsyslog's imklog) repeats it on every line of a multi-line record: "<4>[ 12.345678] ",
# "... kernel: [ 12.345678] ", "<4>1 TS host kernel - - - [ 12.345678] ", and what `dmesg -S`
# prints in each time format: "[ 12.345678] ", "kern  :info  : [ 12.345678] " (-x),
# "[ 12.345678 <    0.000000>] " (-d), "2026-12-06T07:06:23,412166+00:00 " (iso), and the
# formats that print only a delta from the line before, "[  +0.000000] " (-H, reltime),
# "[<    0.000000>] " (delta) and "[Sun Dec  6 07:06:23 2026 <    0.000000>] " (-T -d): a record's
# later lines show a delta of zero.
_STAMP_AFTER_TAG = re.compile(rb"kernel:[ \t]*(\[ *\d{1,10}\.\d{1,9}\])")
_DMESG_STAMP = re.compile(
    rb"(?:<\d{1,3}>|kern *:[a-z]{1,8} *: *)?"
    rb"(?:\[(?: *(?P<uptime>\d{1,10}\.\d{1,9})(?: *< *\d{1,10}\.\d{1,9}>)?"
    rb"| *\+(?P<relative>\d{1,10}\.\d{1,9})"
    rb"|(?:(?:[A-Z][a-z]{2} )?[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4} *)?< *(?P<delta>\d{1,10}\.\d{1,9})>"
    rb")\]|(?P<iso>" + _DMESG_ISO + rb")[ \t])")
# What ``record_stamp`` says of a line whose stamp is a delta of zero from the line before.
SAME_AS_BEFORE = b"+0"
# A driver line that may share its stamp with the next one (the driver prints these in one burst).
_BOARD_SERIAL = re.compile(rb"NVRM: GPU Board Serial Number: [\w-]{1,64}\s*$")
_NVLINK5_CODES = range(144, 151)
_UNKNOWN = (b"<unknown>", b"'<unknown>'")


@dataclass
class LostIntro:
    """``NVRM: The NVIDIA GPU dddd:bb:dd.f``, the first line of the driver's three-line lost-GPU
    message; the caller pairs it with the ``LostTail`` that follows (no other candidate line
    between them), since only the last line says what happened."""
    pci: str
    message: str
    time: Optional[float] = None
    uptime: Optional[float] = None


@dataclass
class LostTail:
    """``NVRM: fallen off the bus and is not responding to commands.``, its last line."""


def lost_gpu_event(intro: LostIntro) -> XidEvent:
    """The fallen-off-the-bus event a ``LostIntro`` followed by a ``LostTail`` makes."""
    return XidEvent(kind="fallen_off_bus", code=FALLEN_OFF_BUS_CODE, pci=intro.pci,
                    message=f"{intro.message} has fallen off the bus and is not responding to commands.",
                    time=intro.time, uptime=intro.uptime)


@dataclass
class Companion:
    """``NVRM: GPU at PCI:...: GPU-uuid``: which UUID sits at which address."""
    pci: str
    uuid: str


def text(raw: bytes, limit: int = MAX_MESSAGE) -> str:
    """Bytes from the log as text; undecodable bytes become ``\\xNN``, never an error."""
    return raw[:limit * 4].decode("utf-8", "backslashreplace").strip()[:limit]


def _pci(raw: bytes) -> str:
    domain, bus, device = raw.split(b":")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"


def message_start(line: bytes) -> int:
    """Where the kernel message starts on ``line`` (after its source format's prefix), or -1
    when the prefix says another writer than the kernel (a /dev/kmsg record of another facility,
    a syslog priority of another facility), or when the line is the continuation of a multi-line
    record: indented (how journalctl and dmesg print a record's later lines), no prefix at all."""
    head = line[:1]
    if head in (b" ", b"\t"):
        return -1
    if head == b"<":
        framed = _RFC5424.match(line) or _SYSLOG_PRI.match(line)
        if not framed or int(framed.group(1)) >> 3 != 0:
            return -1
        if framed.re is _RFC5424:
            return framed.end()         # after the kernel's own stamp when MSG keeps it
        return _KERNEL_PREFIX.match(line, framed.end()).end()
    kmsg = _KMSG_HEAD.match(line)
    if kmsg:
        return kmsg.end() if int(kmsg.group(1)) >> 3 == 0 else -1
    return _KERNEL_PREFIX.match(line).end()


def prefix_is_kernel(prefix: bytes) -> bool:
    """True when ``prefix`` is exactly a source format's prefix naming the kernel, so that the
    text after it is the start of a kernel message."""
    return message_start(prefix) == len(prefix)


def continuation_start(line: bytes) -> int:
    """Where the text of an indented continuation line starts (the later lines of a multi-line
    record, as journalctl and dmesg print them), or -1 when ``line`` is not one."""
    stripped = line.lstrip(b" \t")
    return len(line) - len(stripped) if stripped and len(stripped) < len(line) else -1


def record_stamp(line: bytes) -> Optional[bytes]:
    """The kernel's stamp of the record in ``line``'s prefix where the syslog interface repeats it
    on every line of a multi-line record (``<4>[ 12.345678]``, ``... kernel: [ 12.345678]``),
    or None. Cheap: it runs on every line of a flood."""
    if line[:1] == b"<":
        rfc5424 = _RFC5424.match(line)
        if rfc5424:
            stamp = rfc5424.group("stamp")
            return stamp.strip(b" []") if stamp else None
    dmesg = _DMESG_STAMP.match(line)
    if dmesg:
        delta = dmesg.group("delta") or dmesg.group("relative")
        if delta is not None:
            return SAME_AS_BEFORE if not delta.strip(b"0.") else None
        return dmesg.group("uptime") or dmesg.group("iso")
    tag = line.find(b"kernel:", 0, 320)
    found = _STAMP_AFTER_TAG.match(line, tag) if tag >= 0 else None
    return found.group(1).strip(b" []") if found else None


# The forms in which a record's later lines cannot be told from lines of their own (docs/kernel-log.md):
# the kernel's stamp is missing, or no finer than a second.
UNTELLABLE_NO_STAMP = "lines without a time stamp (dmesg -t)"
UNTELLABLE_SECONDS = "stamps of whole seconds (dmesg -S -T)"
UNTELLABLE_SYSLOG = "syslog lines with neither the kernel's [uptime] stamp nor an indent"
_CTIME_ONLY = re.compile(rb"(?:kern *:[a-z]{1,8} *: *)?\[(?:[A-Z][a-z]{2} )?[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4}\]")
_MINUTE_LINE = re.compile(rb"(?:kern *:[a-z]{1,8} *: *)?\[[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d\]")


TELLABLE = ""


def kernel_line_form(line: bytes) -> Optional[str]:
    """For a kernel line of its own (not indented): ``TELLABLE`` when its form tells a record's
    later lines (a user's text, a file name holding newlines) from lines of their own, else the
    name of its form (``UNTELLABLE_*``). None for a line this cannot say of: indented, empty,
    another writer's."""
    if not line.strip() or line[:1] in (b" ", b"\t"):
        return None
    if _KMSG_HEAD.match(line):
        return TELLABLE if message_start(line) >= 0 else None
    start = message_start(line)
    if start < 0:
        return None
    if start == 0:
        return UNTELLABLE_NO_STAMP
    if line[:1] == b"<":
        rfc5424 = _RFC5424.match(line)
        return UNTELLABLE_SYSLOG if rfc5424 and not rfc5424.group("stamp") else TELLABLE
    if record_stamp(line) is not None or _DMESG_STAMP.match(line) or _MINUTE_LINE.match(line):
        return TELLABLE
    if _CTIME_ONLY.match(line):
        return UNTELLABLE_SECONDS
    return UNTELLABLE_SYSLOG if b"kernel:" in line[:start] else None


def whole_driver_line(line: bytes, start: int) -> bool:
    """A driver line the next line of the same burst may share its stamp with: an event, a
    companion, or the board serial number the driver prints between them."""
    return _BOARD_SERIAL.match(line, start) is not None or _parse(line, start, None) is not None


def parse_line(line: bytes, clock: Optional[PrefixClock] = None
               ) -> Union[XidEvent, Companion, LostIntro, LostTail, None]:
    """The event on one log line, a companion line, or None. Cheap for lines that cannot match."""
    parsed, _ = parse_line_split(line, clock)
    return parsed


def parse_line_split(line: bytes, clock: Optional[PrefixClock] = None, continued: bool = False):
    """``parse_line`` plus where the kernel text starts (-1 for None): what precedes it is the
    prefix (time, host, tag), what follows is the same for every line of a flood.

    A continuation of a multi-line record (an indented line, or ``continued``: the caller saw
    the record's stamp on the line before) never starts an event: it can only be the last line
    of the driver's three-line lost-GPU message (a ``LostTail``), which completes one begun by
    the record's first line. A user's text (a file name holding newlines, in a segfault report
    or an exec warning) reaches the log only as such continuation lines."""
    start = message_start(line)
    if start < 0 or continued:
        start = continuation_start(line) if start < 0 else start
        if start >= 0 and _LOST_TAIL.match(line, start):
            return LostTail(), start
        return None, -1
    parsed = _parse(line, start, clock)
    if parsed is None:
        return None, -1
    return parsed, start


def _parse(line: bytes, start: int, clock: Optional[PrefixClock]
           ) -> Union[XidEvent, Companion, LostIntro, LostTail, None]:
    if line.startswith(b"NVRM: Xid (", start):
        return _xid(line, start, clock)
    if line.startswith((b"NVRM: The NVIDIA GPU ", b"NVRM: fallen off the bus and is not"), start):
        return _lost(line, start, clock)
    if not line.startswith(b"NVRM: GPU ", start):
        return _sxid(line, start, clock) if b"SXid (" in line[start:start + 48] else None
    prefix = line[:start]
    companion = _COMPANION.match(line, start)
    if companion:
        uuid = companion.group("uuid").decode("ascii")
        return Companion(_pci(companion.group("pci")), "GPU-" + uuid[4:].lower())
    fallen = _FALLEN.match(line, start)
    if fallen:
        wall, uptime = clock.parse(prefix) if clock else (None, None)
        return XidEvent(kind="fallen_off_bus", code=FALLEN_OFF_BUS_CODE, pci=_pci(fallen.group("pci")),
                        message=text(line[start + len(b"NVRM: "):]),
                        time=wall, uptime=uptime)
    return None


def _lost(line: bytes, start: int, clock: Optional[PrefixClock]) -> Union[XidEvent, LostIntro, LostTail, None]:
    if not line.startswith(b"NVRM: The NVIDIA GPU ", start):
        return LostTail() if _LOST_TAIL.match(line, start) else None
    prefix = line[:start]
    wall, uptime = clock.parse(prefix) if clock else (None, None)
    record = _LOST_RECORD.match(line, start)
    if record:
        pci = _pci(record.group("pci"))
        return lost_gpu_event(LostIntro(pci, f"The NVIDIA GPU {pci}", wall, uptime))
    alone = _LOST_INTRO.match(line, start)
    if alone:
        pci = _pci(alone.group("pci"))
        return LostIntro(pci, f"The NVIDIA GPU {pci}", wall, uptime)
    return None


def _xid(line: bytes, start: int, clock: Optional[PrefixClock]) -> Optional[XidEvent]:
    match = _XID.match(line, start)
    if not match:
        return None
    prefix = line[:start]
    code = int(match.group("code"))
    rest = match.group("rest")
    pid, process, body = _pid_name(rest)
    event = XidEvent(kind="xid", code=code, pci=_pci(match.group("pci")), message=text(body),
                     pid=pid, process=process)
    for compute, number in _MIG.findall(match.group("mig")):
        if compute:
            event.compute_instance = int(number)
        else:
            event.gpu_instance = int(number)
    if code == 154:
        recovery = _RECOVERY.search(body)
        if recovery:
            event.recovery_action = int(recovery.group(1), 16)
    elif code in _NVLINK5_CODES:
        nvlink = _NVLINK5.match(body)
        if nvlink:
            event.nvlink_unit = nvlink.group("unit").decode("ascii")
            event.intrinfo = int(nvlink.group("intrinfo"), 16)
            event.error_status = int(nvlink.group("status"), 16)
    if clock:
        event.time, event.uptime = clock.parse(prefix)
        event.first_seen = event.last_seen = event.time
        event.last_uptime = event.uptime
    return event


def _pid_name(rest: bytes):
    found = _PID_NAME.match(rest)
    if not found:
        return None, None, rest
    pid_raw, name_raw = found.group("pid"), found.group("name")
    end = found.end()
    if name_raw is not None and name_raw.strip() not in _UNKNOWN:
        name_raw, end = _longest_comm(rest, found.start("name"), name_raw, end)
    pid = int(pid_raw) if pid_raw.isdigit() else None
    process = None if name_raw is None or name_raw.strip() in _UNKNOWN else text(name_raw, 64) or None
    return pid, process, rest[end:]


def _longest_comm(rest: bytes, name_start: int, name: bytes, end: int):
    """(name, where the message starts): extend the name over ", " while it still fits a comm."""
    if _MESSAGE_OPENING.match(rest, end):
        return name, end
    while True:
        comma = rest.find(b", ", name_start + len(name) + 2)
        if comma < 0 or comma - name_start > _COMM_MAX:
            return name, end
        name = rest[name_start:comma]
        end = comma + 2


def _sxid(line: bytes, start: int, clock: Optional[PrefixClock]) -> Optional[XidEvent]:
    match = _SXID.match(line, start)
    if not match:
        return None
    prefix = line[:start]
    rest = match.group("rest")
    event = XidEvent(kind="sxid", code=int(match.group("code")), pci=_pci(match.group("pci")), message="",
                     device=match.group("device").decode("ascii") if match.group("device") else None)
    severity = _SEVERITY.match(rest)
    if severity:
        label = severity.group("severity").lower()
        event.severity = "Fatal" if label == b"fatal" else "Non-fatal"
        rest = rest[severity.end():]
    elif _SXID_DETAIL.match(rest):
        event.continuation = True
    event.message = text(rest)
    if clock:
        event.time, event.uptime = clock.parse(prefix)
        event.first_seen = event.last_seen = event.time
        event.last_uptime = event.uptime
    return event
