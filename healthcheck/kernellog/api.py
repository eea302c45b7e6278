"""What the health check, the epilog and ``slurm-gpu xid`` call.

* ``read_new_events(kernel_log, state_dir, node, ...)``: the hooks, every run. Reads only what
  the log gained since the last committed read (a cursor in the state dir), folds repeats (also
  across runs) and returns this run's events and every event still inside ``[xid]
  flood_window_s``. It saves nothing: ``KernelLogRead.commit()`` saves the new cursor and flood
  state once the caller has acted on the events. Until then the same events come back on the
  next read, so a run that dies between reading and acting loses no Xid.
* ``events_between(kernel_log, since, until, ...)``: the epilog, for a job's time window. A one-shot
  read that neither uses nor moves the cursor.
* ``scan_events(...)``: the same as ``events_between`` with read statistics (``xid scan``).
"""
from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Dict, Iterable, List, Optional, Tuple

from ..config.settings import XidSettings
from . import readers
from ..xid.catalog import XidCatalog
from .cursor import StateStore
from ..xid.events import XidEvent
from .flood import CLOCK_SLACK_S, FloodTracker, group_key
from .parser import (NEEDLES, SAME_AS_BEFORE, Companion, LostIntro, LostTail, lost_gpu_event, message_start,
                     parse_line_split, prefix_is_kernel, record_stamp, whole_driver_line)
from ..xid.pci import GpuMap
from .scanner import PRIMED, LineScanner, ScanStats
from .readers import KernelLogError
from .timestamps import PrefixClock, boot_time

__all__ = ["KernelLogError", "KernelLogRead", "PendingState", "XidSettings", "events_between",
           "read_new_events", "scan_events"]


def _settings(config: Any) -> XidSettings:
    """``[xid]``, typed: the config's (built once per config), or the built-in defaults'."""
    return XidSettings.from_config(None) if config is None else config.typed(XidSettings)


@dataclass
class PendingState:
    """What a cursor read would save: the new cursor and flood state, not yet written."""
    store: StateStore
    kind: str
    identity: str
    cursor: Dict[str, Any]
    flood: Dict[str, Any]

    def commit(self) -> None:
        with self.store.lock():
            # Flood state first: dying between the two writes re-reads lines (counted twice), never loses them.
            self.store.save_flood(self.flood)
            self.store.save_cursor(self.kind, self.identity, self.cursor)


@dataclass
class KernelLogRead:
    source: str                          # kmsg | journal | a file path | "-"
    events: List[XidEvent]               # events with lines read by this call
    active: List[XidEvent]               # + earlier runs' events still within flood_window_s
    stats: ScanStats
    rescan: Optional[str] = None         # why the cursor was not used (a bounded rescan), if it was not
    # Why this read did not get to the end of the log, or what it did not keep; None: it did.
    capped: Optional[str] = None
    pending: Optional[PendingState] = field(default=None, repr=False)   # cursor reads only

    def commit(self) -> None:
        """Save the cursor and flood state this read reached: its events are not read again.
        Raises ``KernelLogError`` (one line) when the state dir cannot be written."""
        if self.pending is None:
            return
        try:
            self.pending.commit()
        except OSError as exc:
            raise KernelLogError(f"cannot save the kernel-log cursor in {self.pending.store.dir}: "
                                 f"{exc.strerror or exc}") from None
        self.pending = None


class _Collector:
    """Parsed line -> classified, GPU-mapped event -> folded by the flood tracker."""

    def __init__(self, catalog: XidCatalog, gpu_map: GpuMap, tracker: FloodTracker,
                 since: Optional[float] = None, until: Optional[float] = None,
                 default_time: Optional[float] = None, count_lines: bool = False, resumable: bool = False):
        self.catalog = catalog
        self.gpu_map = gpu_map
        self.tracker = tracker
        self.since = since
        self.until = until
        self.default_time = default_time
        self.count_lines = count_lines
        # A read that can resume stops at the first distinct event past the tracker's cap.
        self.resumable = resumable
        self.current: Optional[LineScanner] = None
        self.stats = ScanStats()
        self.clock = PrefixClock()
        self._repeat_body = b""
        self._repeat_template: Optional[XidEvent] = None
        self._repeat_key: Any = None
        self._repeat_prefix: Optional[bytes] = None
        self._repeat_stamp: Any = (None, None)
        self._lost_intro: Optional[LostIntro] = None
        self._whole_start = -1            # where the last whole driver line starts (the scanner's offsets)
        self._stamped: Tuple[int, Optional[bytes]] = (-1, None)     # the last line's start and record stamp

    def scanner(self, clock: PrefixClock) -> LineScanner:
        self.clock = clock
        self._repeat_prefix = None
        self._whole_start = -1
        self._stamped = (-1, None)
        self.current = LineScanner(self.on_line, self.stats, self.count_lines)
        return self.current

    def on_line(self, line: bytes) -> None:
        continued = self._continued(line)
        if not continued and self._repeat_body and line.endswith(self._repeat_body) and self._repeat(line):
            self._mark_whole()
            return
        parsed, body_start = parse_line_split(line, self.clock, continued)
        if not continued and ((parsed is not None and not isinstance(parsed, (LostIntro, LostTail)))
                              or (parsed is None and b"Serial" in line
                                  and whole_driver_line(line, max(message_start(line), 0)))):
            self._mark_whole()
        if parsed is None:
            return
        # The driver's three-line lost-GPU message: the address comes first, what happened last.
        intro, self._lost_intro = self._lost_intro, None
        if isinstance(parsed, LostIntro):
            self._lost_intro = parsed
            return
        if isinstance(parsed, LostTail):
            if intro is None:
                return
            parsed, body_start = lost_gpu_event(intro), -1
        if isinstance(parsed, Companion):
            self.gpu_map.learn(parsed.pci, parsed.uuid)
            return
        self.catalog.classify(parsed)
        self.gpu_map.annotate(parsed)
        self._repeat_body = line[body_start:] if body_start >= 0 else b""
        self._repeat_template = copy.copy(parsed)
        self._repeat_key = group_key(parsed)
        self._accept(parsed)

    def _mark_whole(self) -> None:
        if self.current is not None:
            self._whole_start = self.current.line_start

    def _continued(self, line: bytes) -> bool:
        """A later line of a multi-line record where the syslog interface repeats the record's
        prefix on each line (/proc/kmsg, `dmesg -S` in every time format, rsyslog's imklog keeping
        the kernel's stamp): the line before has the same stamp (or the line says its delta from
        the line before is zero) and was not itself a whole driver line of the same burst."""
        scanner = self.current
        if scanner is None:
            return False
        stamp = record_stamp(line)
        before_start, before = self._stamped
        self._stamped = (scanner.line_start, stamp)
        if stamp is None or scanner.previous_head is None:
            return False
        if scanner.previous_start == PRIMED and self._primed_whole(scanner):
            return False
        if stamp == SAME_AS_BEFORE:                          # dmesg's delta of zero from the line before
            return scanner.previous_start != self._whole_start
        if before_start != scanner.previous_start:          # the line before was no candidate
            before = record_stamp(scanner.previous_head)
        return before == stamp and scanner.previous_start != self._whole_start

    @staticmethod
    def _primed_whole(scanner: LineScanner) -> bool:
        """The line before a read's first byte (``LineScanner.prime``) vouches for the next one as
        a whole driver line only when it is one and starts its own record: the line before it
        carries another stamp (not known: it does not vouch)."""
        if scanner.primed is None:
            return False
        line, before = scanner.primed
        if not whole_driver_line(line, max(message_start(line), 0)):
            return False
        stamp = record_stamp(line)
        return stamp is None or (stamp != SAME_AS_BEFORE and bool(before) and record_stamp(before) != stamp)

    def _repeat(self, line: bytes) -> bool:
        """A flood repeats one kernel line with new timestamps: count it without parsing it again."""
        prefix = line[:len(line) - len(self._repeat_body)]
        if prefix != self._repeat_prefix:
            # A prefix holding kernel text of its own is another line that happens to end alike.
            if not prefix_is_kernel(prefix) or any(needle in prefix for needle in NEEDLES):
                return False
            self._repeat_prefix, self._repeat_stamp = prefix, self.clock.parse(prefix)
        moment, uptime = self._repeat_stamp
        moment = self._when(moment)
        if not self._in_window(moment):
            return True
        if self._repeat_template.continuation or not self.tracker.repeat(self._repeat_key, moment, uptime):
            event = copy.copy(self._repeat_template)
            event.time = event.first_seen = event.last_seen = moment
            event.uptime = event.last_uptime = uptime
            self._accept(event)
            return True
        self.stats.events += 1
        return True

    def _when(self, moment: Optional[float]) -> Optional[float]:
        # Incremental reads only: a line without a time is new since the last run, so "now" is close.
        return self.default_time if moment is None else moment

    def _in_window(self, moment: Optional[float]) -> bool:
        if self.since is None and self.until is None:
            return True
        if moment is None:
            return False
        too_early = self.since is not None and moment < self.since
        too_late = self.until is not None and moment > self.until
        return not (too_early or too_late)

    def _accept(self, event: XidEvent) -> None:
        if event.time is None and self.default_time is not None:
            event.time = event.first_seen = event.last_seen = self.default_time
        if not self._in_window(event.time):
            return
        if not self.tracker.add(event):
            if self.resumable and self.current is not None:
                self.current.stop(f"more than {self.tracker.max_groups} new distinct events in one read")
            return
        self.stats.events += 1

    def capped(self) -> Optional[str]:
        """What a read that went to its end did not keep (an incremental read stops instead)."""
        if self.tracker.dropped:
            return (f"{self.tracker.dropped} events past the first {self.tracker.max_groups} distinct ones "
                    "were not kept")
        return None


def _source_kind(source: str) -> str:
    return source if source in ("kmsg", "journal", "-") else "file"


def read_new_events(kernel_log: str, state_dir: str, node: str, *, config: Any = None,
                    gpus: Iterable[Any] = (), now: Optional[float] = None,
                    booted: Optional[float] = None) -> KernelLogRead:
    """The hooks' read: only lines new since the last commit for this reader and source.

    Saves nothing; ``KernelLogRead.commit()`` does, once the caller has acted on the events.
    ``kernel_log`` is ``NodeSources.kernel_log`` ("auto" | "kmsg" | "journal" | a file path);
    ``gpus`` are NVML facts (anything with index, uuid, pci_bus_id) to name the GPU of each event.
    ``booted`` is when the running kernel booted (default: /proc/stat's btime): events whose
    last line is older are marked ``before_boot`` (evidence, never a drain on their own).
    Raises ``KernelLogError`` (one line) when the log cannot be read.
    """
    settings = _settings(config)
    now = time.time() if now is None else now
    booted = boot_time() if booted is None else booted
    source = readers.resolve(kernel_log)
    kind = _source_kind(source)
    if kind == "-":
        raise KernelLogError("stdin cannot be read incrementally")
    identity = readers.KMSG if kind == "kmsg" else "journal" if kind == "journal" else os.path.abspath(source)
    store = StateStore(state_dir, node)
    try:
        return _read_new_events(store, kind, identity, settings, gpus, now, booted)
    except OSError as exc:
        # The source readers raise KernelLogError themselves; this is the state dir.
        raise KernelLogError(f"cannot use the state dir {store.dir}: {exc.strerror or exc}") from None


def _read_new_events(store: StateStore, kind: str, identity: str, settings: XidSettings,
                     gpus: Iterable[Any], now: float, booted: Optional[float]) -> KernelLogRead:
    with store.lock():
        state = store.load_flood()
        tracker = FloodTracker(settings.flood_window_s, settings.escalate)
        tracker.seed(state, now)
        learned = state.get("uuids") if isinstance(state.get("uuids"), dict) else {}
        gpu_map = GpuMap(gpus, uuids={str(k): str(v) for k, v in learned.items()})
        collector = _Collector(XidCatalog(settings.overrides), gpu_map, tracker, default_time=now, count_lines=True,
                               resumable=True)
        cursor = store.load_cursor(kind, identity)
        budget = readers.Budget(settings.read_budget_bytes, settings.read_budget_s)
        if kind == "kmsg":
            from . import kmsg

            result = kmsg.read_kmsg(readers.KMSG, cursor, collector.scanner, budget)
        elif kind == "journal":
            from . import journal

            result = journal.read_journal(cursor, settings.rescan_bytes, settings.source_timeout_s, collector.scanner,
                                          budget)
        else:
            from . import logfiles

            result = logfiles.read_file_incremental(identity, cursor, settings.rescan_bytes, collector.scanner, budget)
        flood_state = tracker.state(now)
        flood_state["uuids"] = dict(list(gpu_map.learned.items())[:4096])
    everything = tracker.events()
    for event in everything:
        gpu_map.annotate(event)
        event.before_boot = _before(event.last_seen, booted)
    return KernelLogRead(source=identity, events=[event for event in everything if event.count_new > 0],
                         active=tracker.active(now), stats=collector.stats, rescan=result.rescan,
                         capped=_stopped_text(result.stopped) or collector.capped(),
                         pending=PendingState(store, kind, identity, dict(result.cursor), flood_state))


def _stopped_text(stopped: Optional[str]) -> Optional[str]:
    if stopped is None:
        return None
    return f"the read stopped early: {stopped}; the next run reads on from there"


def _before(moment: Optional[float], booted: Optional[float]) -> bool:
    """Written before the running kernel booted (a line without a time cannot be placed: no)."""
    return moment is not None and booted is not None and moment < booted - CLOCK_SLACK_S


def scan_events(kernel_log: str, since: Optional[float] = None, until: Optional[float] = None, *,
                config: Any = None, gpus: Iterable[Any] = (), stream: Optional[BinaryIO] = None) -> KernelLogRead:
    """A one-shot read of a whole source (or from ``since`` on), without a cursor.

    ``kernel_log`` may also be "-" (``stream``, default stdin). Lines without a wall-clock time
    are left out when ``since`` or ``until`` is given: they cannot be placed in the window.
    """
    settings = _settings(config)
    source = kernel_log if kernel_log == "-" else readers.resolve(kernel_log)
    kind = _source_kind(source)
    tracker = FloodTracker(settings.flood_window_s, settings.escalate)
    collector = _Collector(XidCatalog(settings.overrides), GpuMap(gpus), tracker, since=since, until=until)
    if kind == "-":
        from . import logfiles

        logfiles.read_stream_all(stream if stream is not None else readers.stdin_binary(), collector.scanner)
    elif kind == "kmsg":
        from . import kmsg

        kmsg.read_kmsg(readers.KMSG, None, collector.scanner)
    elif kind == "journal":
        from . import journal

        journal.read_journal_between(since, until, settings.source_timeout_s, collector.scanner)
    else:
        from . import logfiles

        logfiles.read_file_all(source, collector.scanner, since=since)
    events = tracker.events()
    for event in events:
        collector.gpu_map.annotate(event)
    capped = collector.capped()
    if capped:
        collector.stats.problems.append(capped)
    return KernelLogRead(source=source, events=events, active=events, stats=collector.stats, capped=capped)


def events_between(kernel_log: str, since: Optional[float], until: Optional[float] = None, *,
                   config: Any = None, gpus: Iterable[Any] = ()) -> List[XidEvent]:
    """The epilog's read: events from ``since`` to ``until`` (epoch seconds), repeats folded."""
    return scan_events(kernel_log, since, until, config=config, gpus=gpus).events
