"""Floods and repeats: one event per code and GPU per window, with a count; escalation rules.

* **Folding.** Lines with the same kind, code, address, MIG instance (and, for Xid 154 and
  144-150, the same recovery action / error status) within ``flood_window_s`` of the first one
  are one event: ``count`` grows, ``last_seen`` moves, nothing is re-reported. A repeat after
  the window starts a new event. An SXid detail line ("Severity ...", "Data {...}") belongs to
  the SXid before it and is not counted.
* **Escalation** (``[xid] escalate``): ``count`` separate occurrences of one code on one GPU
  within ``window_s`` raise the action to the rule's (never lower it). Lines closer than
  ``burst_s`` (default 60) to the previous one are the same occurrence: one crashing job prints
  a dozen Xid 13 lines at once.
* Both survive between health-check runs in the state dir (``FloodTracker.state``), so a flood
  that spans runs stays one event, and occurrences add up across runs.

Times: a line's wall clock when its prefix gives one, else its uptime (within one scan only).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ..config.settings import EscalationRule
from ..safeio.jsontypes import field_problem, is_int, is_number, is_str, optional
from ..xid.catalog import override_key
from ..xid.events import KINDS, XidEvent, stronger

MAX_GROUPS = 10000          # new distinct events per read (and events kept between runs): bounds memory
# Syslog and the journal can write lines a little out of order; a reboot sends uptime far back.
CLOCK_SLACK_S = 60.0

GroupKey = Tuple[Any, ...]


def group_key(event: XidEvent) -> GroupKey:
    if event.kind == "sxid":
        return ("sxid", event.code, event.pci, event.device)
    if event.code == 154:
        refine: Any = event.recovery_action
    elif event.error_status is not None:
        refine = (event.nvlink_unit, event.error_status)
    else:
        refine = None
    return (event.kind, event.code, event.pci, event.gpu_instance, event.compute_instance, refine)


@dataclass
class Bursts:
    """Start times of the last few occurrences of one code on one GPU."""
    starts: List[float] = field(default_factory=list)
    last: Optional[float] = None
    wall: bool = True                # False: uptime seconds (only within one scan)


def _delta(moment: Optional[float], uptime: Optional[float], group: XidEvent) -> float:
    """Seconds from the group's first line to a line; 0 when the two cannot be compared."""
    if moment is not None and group.first_seen is not None:
        return moment - group.first_seen
    if uptime is not None and group.uptime is not None:
        return uptime - group.uptime
    return 0.0


class FloodTracker:
    def __init__(self, window_s: float, rules: Optional[Mapping[str, EscalationRule]] = None,
                 max_groups: int = MAX_GROUPS):
        self.window_s = window_s
        self.rules = dict(rules or {})
        self.max_groups = max_groups
        self.open: Dict[GroupKey, XidEvent] = {}
        self.closed: List[XidEvent] = []
        self.bursts: Dict[str, Bursts] = {}
        self.dropped = 0             # events not kept because max_groups was reached
        self.added = 0               # distinct events this read added (seeded ones not counted)
        self._order: Dict[int, int] = {}
        self._sequence = 0

    # -- folding -------------------------------------------------------------------------------
    def add(self, event: XidEvent) -> bool:
        """Fold ``event`` in; False when it is a new distinct event past ``max_groups`` for this
        read (not kept: ``dropped`` counts it; an incremental read stops there and resumes)."""
        key = group_key(event)
        group = self.open.get(key)
        if event.continuation:
            if group is not None:
                return True
        elif group is not None and self.repeat(key, event.time, event.uptime):
            if group.severity is None and event.severity is not None:
                group.severity, group.action, group.action_source = event.severity, event.action, event.action_source
            return True
        if self.added >= self.max_groups:
            self.dropped += 1
            return False
        self.added += 1
        if group is not None:
            self.closed.append(group)
        self.open[key] = event
        self._order[id(event)] = self._sequence
        self._sequence += 1
        if not event.continuation:
            self._escalate(event, event.time, event.uptime)
        return True

    def repeat(self, key: GroupKey, moment: Optional[float], uptime: Optional[float]) -> bool:
        """Count one more line of the open event ``key`` (True), unless it falls outside the
        event's window (False: the caller adds it as a new event)."""
        group = self.open.get(key)
        if group is None or not -CLOCK_SLACK_S <= _delta(moment, uptime, group) <= self.window_s:
            return False
        group.count += 1
        group.count_new += 1
        if moment is not None:
            group.last_seen = moment if group.last_seen is None else max(group.last_seen, moment)
        if uptime is not None:
            group.last_uptime = uptime
        self._escalate(group, moment, uptime)
        return True

    def events(self) -> List[XidEvent]:
        """Every event, in the order their first lines appeared."""
        everything = self.closed + list(self.open.values())
        return sorted(everything, key=lambda event: self._order.get(id(event), -1))

    # -- escalation -----------------------------------------------------------------------------
    def _escalate(self, group: XidEvent, wall_time: Optional[float], uptime: Optional[float]) -> None:
        rule = self.rules.get(override_key(group.kind, group.code))
        if rule is None:
            return
        moment, wall = (wall_time, True) if wall_time is not None else (uptime, False)
        if moment is None:
            return
        name = f"{group.kind}|{group.code}|{group.pci}"
        bursts = self.bursts.get(name)
        if bursts is None or bursts.wall != wall:
            bursts = self.bursts[name] = Bursts(wall=wall)
        if bursts.last is not None and 0 <= moment - bursts.last <= rule.burst_s:
            bursts.last = moment
        else:
            bursts.starts = (bursts.starts + [moment])[-rule.count:]
            bursts.last = moment
        if len(bursts.starts) >= rule.count and bursts.starts[-1] - bursts.starts[0] <= rule.window_s:
            if stronger(group.action, rule.action) != group.action:
                group.action = rule.action
                group.action_source = (f"escalated by [xid] escalate: {len(bursts.starts)} occurrences "
                                       f"within {rule.window_s:g} s (was: {group.action_source})")

    # -- state between runs --------------------------------------------------------------------
    def seed(self, state: Mapping[str, Any], now: float) -> None:
        """Continue from a previous run's state: open events within the window, burst times."""
        for data in state.get("events", [])[: self.max_groups]:
            try:
                event = XidEvent.from_json(data)
            except TypeError:
                continue
            if event.last_seen is None or now - event.last_seen > self.window_s:
                continue
            event.count_new = 0
            self.open[group_key(event)] = event
            self._order[id(event)] = self._sequence
            self._sequence += 1
        horizon = max([rule.window_s for rule in self.rules.values()], default=0.0)
        for name, data in state.get("bursts", {}).items():
            try:
                bursts = Bursts([float(x) for x in data["starts"]][-10000:], float(data["last"]), True)
            except (KeyError, TypeError, ValueError):
                continue
            if bursts.last is not None and now - bursts.last <= horizon:
                self.bursts[name] = bursts

    def state(self, now: float) -> Dict[str, Any]:
        """What the next run needs: events still inside the window, wall-clock burst times."""
        keep = [event for event in self.open.values()
                if event.last_seen is not None and now - event.last_seen <= self.window_s]
        keep = sorted(keep, key=lambda event: event.last_seen or 0.0)[-self.max_groups:]
        return {
            "events": [_state_json(event) for event in keep],
            "bursts": {name: {"starts": bursts.starts, "last": bursts.last}
                       for name, bursts in self.bursts.items() if bursts.wall and bursts.last is not None},
        }

    def active(self, now: float) -> List[XidEvent]:
        """Events whose last line is within the window (this run's and earlier runs')."""
        return [event for event in self.events()
                if event.last_seen is not None and now - event.last_seen <= self.window_s]


def _state_json(event: XidEvent) -> Dict[str, Any]:
    data = event.to_json()
    data.pop("time_iso", None)
    return data


# -- the saved state's schema ---------------------------------------------------------------------
_BY_ANNOTATION: Dict[str, Callable[[Any], bool]] = {
    "str": is_str, "int": is_int, "bool": lambda value: isinstance(value, bool),
    "Optional[str]": optional(is_str), "Optional[int]": optional(is_int), "Optional[float]": optional(is_number),
}
# A field of a type not listed here is not checked (it cannot break folding).
_EVENT_TESTS = {item.name: _BY_ANNOTATION.get(str(item.type), lambda value: True) for item in fields(XidEvent)}
_EVENT_TESTS["kind"] = lambda value: value in KINDS
_REQUIRED_EVENT_KEYS = ("kind", "code", "pci", "message")


def state_problem(state: Mapping[str, Any]) -> Optional[str]:
    """What is wrong with a saved flood state (``FloodTracker.state``); None when it is sound."""
    events = state.get("events", [])
    if not isinstance(events, list):
        return "'events' is not a list"
    for number, event in enumerate(events):
        if not isinstance(event, dict):
            return f"events[{number}] is not an object"
        wrong = field_problem(event, {key: _EVENT_TESTS[key] for key in _REQUIRED_EVENT_KEYS}) or \
            field_problem(event, {k: t for k, t in _EVENT_TESTS.items() if k in event}, required=False)
        if wrong:
            return f"events[{number}]: {wrong}"
    bursts = state.get("bursts", {})
    if not isinstance(bursts, dict):
        return "'bursts' is not an object"
    for name, entry in bursts.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("starts"), list) or \
                not all(is_number(start) for start in entry["starts"]) or not is_number(entry.get("last")):
            return f"bursts[{name!r}] is not {{starts: [numbers], last: number}}"
    uuids = state.get("uuids", {})
    if not isinstance(uuids, dict) or not all(is_str(value) for value in uuids.values()):
        return "'uuids' is not an object of strings"
    return None
