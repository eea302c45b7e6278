"""NVIDIA's Xid catalog and what this project does about each code.

Three data files in ``healthcheck/data/`` (copies of NVIDIA's tables, and our mapping):

* ``xid-catalog.tsv``          xid, mnemonic, description, immediate and investigatory action
* ``xid-144-150-decode.tsv``   NVLink5 Xids 144-150 by interrupt info and error status
* ``xid-action-map.tsv``       NVIDIA's buckets -> ignore | job | reset_gpu | reboot | contact_support

The action for one event, first rule that applies:

1. ``[xid] actions`` in config for the code (``"13"``, or ``"sxid:20034"`` for an SXid);
2. Xid 154: the recovery action its text carries (``... to 0x2 (Node Reboot Required)``);
3. Xid 144-150 with ``(intrinfo status ...)`` on the line: the decode table's row(s) for it;
4. the catalog's immediate action through the mapping; SXids by severity (Fatal / Non-fatal);
5. a code the catalog does not list: contact_support (never ignored).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from ..safeio import datafiles
from .events import XID_ACTIONS, XidEvent, stronger

UNKNOWN_BUCKET = "UNKNOWN"
UNSPECIFIED_BUCKET = "UNSPECIFIED"


@dataclass(frozen=True)
class CatalogEntry:
    code: int
    mnemonic: str
    description: str
    immediate_action: str
    investigatory_action: str


@dataclass(frozen=True)
class DecodeRow:
    """One row of the NVLink5 decode table; a pattern is 32 bits, most significant first,
    ``-`` for "any"; v1 is for drivers before R575, v2 for R575 and later."""
    code: int
    unit: str
    v1: Tuple[int, int]              # (mask, value)
    v2: Tuple[int, int]
    error_status: int
    immediate_action: str
    investigatory_action: str
    severity: str

    def matches(self, intrinfo: int, error_status: int) -> bool:
        if error_status != self.error_status:
            return False
        return any(intrinfo & mask == value for mask, value in (self.v1, self.v2))


@dataclass(frozen=True)
class BucketMapping:
    action: str
    why: str


def _data_lines(name: str) -> Iterator[List[str]]:
    text = datafiles.read_text(name)
    header_seen = False
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if not header_seen:
            header_seen = True
            continue
        yield line.split("\t")


def _pattern(bits: str) -> Tuple[int, int]:
    mask = value = 0
    for char in bits.strip():
        mask, value = mask << 1, value << 1
        if char in "01":
            mask |= 1
            value |= char == "1"
    return mask, value


@lru_cache(maxsize=1)
def catalog_entries() -> Dict[int, CatalogEntry]:
    entries: Dict[int, CatalogEntry] = {}
    for cells in _data_lines("xid-catalog.tsv"):
        cells += [""] * (5 - len(cells))
        entries[int(cells[0])] = CatalogEntry(int(cells[0]), cells[1].strip(), cells[2].strip(),
                                              cells[3].strip(), cells[4].strip())
    return entries


@lru_cache(maxsize=1)
def decode_rows() -> Dict[int, Tuple[DecodeRow, ...]]:
    rows: Dict[int, List[DecodeRow]] = {}
    for cells in _data_lines("xid-144-150-decode.tsv"):
        cells += [""] * (8 - len(cells))
        row = DecodeRow(int(cells[0]), cells[1], _pattern(cells[2]), _pattern(cells[3]), int(cells[4], 16),
                        cells[5].strip(), cells[6].strip(), cells[7].strip())
        rows.setdefault(row.code, []).append(row)
    return {code: tuple(found) for code, found in rows.items()}


@lru_cache(maxsize=1)
def action_map() -> Dict[str, Dict[str, BucketMapping]]:
    tables: Dict[str, Dict[str, BucketMapping]] = {}
    for cells in _data_lines("xid-action-map.tsv"):
        cells += [""] * (4 - len(cells))
        table, bucket, action, why = (cell.strip() for cell in cells[:4])
        if action not in XID_ACTIONS:
            raise ValueError(f"xid-action-map.tsv: {table} {bucket}: {action!r} is not one of {XID_ACTIONS}")
        tables.setdefault(table, {})[bucket] = BucketMapping(action, why)
    return tables


def override_key(kind: str, code: int) -> str:
    return f"sxid:{code}" if kind == "sxid" else str(code)


class XidCatalog:
    """Looks up codes and decides each event's action (see the module docstring for the order)."""

    def __init__(self, overrides: Optional[Mapping[str, str]] = None):
        self.entries = catalog_entries()
        self.decode = decode_rows()
        self.map = action_map()
        self.overrides = dict(overrides or {})

    def entry(self, code: int) -> Optional[CatalogEntry]:
        return self.entries.get(code)

    def _bucket(self, table: str, bucket: str) -> BucketMapping:
        found = self.map.get(table, {}).get(bucket)
        if found is None:
            return self.map["unknown"][UNKNOWN_BUCKET]
        return found

    def catalog_action(self, code: int) -> Tuple[str, str]:
        """(action, why) from the catalog alone: what ``xid explain`` shows as the default."""
        entry = self.entries.get(code)
        if entry is None:
            mapped = self._bucket("unknown", UNKNOWN_BUCKET)
            return mapped.action, f"not in NVIDIA's catalog: {mapped.why}"
        bucket = entry.immediate_action or UNSPECIFIED_BUCKET
        mapped = self._bucket("immediate", bucket)
        return mapped.action, f"catalog {bucket}: {mapped.why}"

    def decode_action(self, code: int, intrinfo: int, error_status: int) -> Optional[Tuple[str, str]]:
        """The decode table's action for an NVLink5 Xid, or None when no row matches.

        Some units number their statuses (0x3, 0x5), others set one bit per error: a status
        no row lists exactly is read bit by bit. Rows that disagree give the stronger action."""
        rows = self.decode.get(code, ())
        found = [(row, error_status) for row in rows if row.matches(intrinfo, error_status)]
        if not found and error_status & (error_status - 1):
            bits = [1 << bit for bit in range(32) if error_status >> bit & 1]
            found = [(row, bit) for bit in bits for row in rows if row.matches(intrinfo, bit)]
        if not found:
            return None
        action = None
        for row, _ in found:
            mapped = self._bucket("decode", row.immediate_action)
            action = mapped.action if action is None else stronger(action, mapped.action)
        rows_text = "; ".join(sorted({f"{row.unit} status 0x{status:08x} {row.immediate_action}"
                                      for row, status in found}))
        return action, f"decode table: {rows_text}"

    def classify(self, event: XidEvent) -> XidEvent:
        """Set the event's mnemonic, NVIDIA action, our action and why (in place; returned)."""
        if event.kind == "sxid":
            event.mnemonic = None
            event.nvidia_action = None
            mapped = self._bucket("sxid", event.severity or UNSPECIFIED_BUCKET)
            severity = event.severity or "severity unknown"
            event.action, event.action_source = mapped.action, f"SXid {severity}: {mapped.why}"
        else:
            entry = self.entries.get(event.code)
            event.mnemonic = entry.mnemonic if entry else None
            event.nvidia_action = entry.immediate_action if entry else None
            event.action, event.action_source = self._xid_action(event)
        override = self.overrides.get(override_key(event.kind, event.code))
        if override is not None:
            event.action, event.action_source = override, "config [xid] actions"
        return event

    def _xid_action(self, event: XidEvent) -> Tuple[str, str]:
        if event.code == 154 and event.recovery_action is not None:
            mapped = self.map.get("recovery", {}).get(str(event.recovery_action))
            if mapped is not None:
                return mapped.action, f"Xid 154 recovery action {event.recovery_action}: {mapped.why}"
            unknown = self._bucket("unknown", UNKNOWN_BUCKET)
            return unknown.action, f"Xid 154 recovery action {event.recovery_action} is not known: {unknown.why}"
        if event.intrinfo is not None and event.error_status is not None:
            decoded = self.decode_action(event.code, event.intrinfo, event.error_status)
            if decoded is not None:
                return decoded
        return self.catalog_action(event.code)

    def recovery_actions(self) -> Dict[str, BucketMapping]:
        return dict(self.map.get("recovery", {}))

    def sxid_actions(self) -> Dict[str, BucketMapping]:
        return dict(self.map.get("sxid", {}))
