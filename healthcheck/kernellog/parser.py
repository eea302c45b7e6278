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

from .events import FALLEN_OFF_BUS_CODE, XidEvent
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
# "host tag[pid]: " in a syslog prefix. Only the kernel writes Xids; anybody can write to
# syslog with logger(1), so a line whose tag is not "kernel" is not believed.
_SYSLOG_TAG = re.compile(rb"(?:^|\s)([^\s:\[\]]{1,64})(?:\[\d{1,10}\])?:\s")
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


def _prefix_is_kernel(prefix: bytes) -> bool:
    tags = _SYSLOG_TAG.findall(prefix)
    return not tags or tags[-1] == b"kernel"


def prefix_is_kernel(prefix: bytes) -> bool:
    """False when a syslog prefix names a writer other than the kernel (logger(1) forgeries)."""
    return _prefix_is_kernel(prefix)


def parse_line(line: bytes, clock: Optional[PrefixClock] = None
               ) -> Union[XidEvent, Companion, LostIntro, LostTail, None]:
    """The event on one log line, a companion line, or None. Cheap for lines that cannot match."""
    parsed, _ = parse_line_split(line, clock)
    return parsed


def parse_line_split(line: bytes, clock: Optional[PrefixClock] = None):
    """``parse_line`` plus where the kernel text starts (-1 for None): what precedes it is the
    prefix (time, host, tag), what follows is the same for every line of a flood."""
    parsed = _parse(line, clock)
    if parsed is None:
        return None, -1
    return parsed, _body_start(line)


def _body_start(line: bytes) -> int:
    start = line.find(b"NVRM: ")
    if start >= 0:
        return start
    start = line.find(b"SXid (")
    match = _SXID.search(line, max(0, start - 24))
    return match.start() if match else start


def _parse(line: bytes, clock: Optional[PrefixClock]
           ) -> Union[XidEvent, Companion, LostIntro, LostTail, None]:
    if b"Xid (" in line:
        start = line.find(b"NVRM: Xid (")
        if start >= 0:
            return _xid(line, start, clock)
        start = line.find(b"SXid (")
        if start >= 0:
            return _sxid(line, start, clock)
        return None
    start = line.find(b"NVRM: GPU ")
    if start < 0:
        return _lost(line, clock)
    prefix = line[:start]
    if not _prefix_is_kernel(prefix):
        return None
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


def _lost(line: bytes, clock: Optional[PrefixClock]) -> Union[XidEvent, LostIntro, LostTail, None]:
    start = line.find(b"NVRM: The NVIDIA GPU ")
    if start < 0:
        start = line.find(b"NVRM: fallen off the bus and is not")
        if start < 0 or not _prefix_is_kernel(line[:start]) or not _LOST_TAIL.match(line, start):
            return None
        return LostTail()
    prefix = line[:start]
    if not _prefix_is_kernel(prefix):
        return None
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
    if not _prefix_is_kernel(prefix):
        return None
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
    match = _SXID.search(line, max(0, start - 24))
    if not match or match.start("code") < start:
        return None
    prefix = line[:match.start()]
    if not _prefix_is_kernel(prefix):
        return None
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
