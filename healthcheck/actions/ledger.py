"""The remediation ledger: what was done to bring a node back, per fault signature, durable
across reboots (``<state_dir>/remediate/<node>.json``, written atomically and fsync'd, read and
changed under ``<state_dir>/remediate/.<node>.lock``).

Per signature (``signature``: cause + GPU UUID): the times reboots were asked, the GPU
resets tried (with the boot they were tried in), the drain, reboot and back-in-service times of
each episode (``slurm-gpu summary``'s time back in service), and whether remediation gave up
(inspection). ``asked`` is the one request in flight: what was asked, in which boot, when.
``totals``: what remediation did on the node, ever (``remedy_totals``: the health check's
counters and back-in-service histogram), kept when an admin's resume starts the counts again.

A missing, foreign or corrupt file is an empty ledger (a corrupt one is set aside once): the
worst that comes of it is one more reboot than ``max_reboots``, never a drain.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

from ..safeio.fsutil import atomic_write, locked, path_component, read_state_json
from ..safeio.jsontypes import field_problem, is_number, is_str
from .remedy_totals import VERSION, RemedyTotals, ledger_dir, ledger_path

# Episodes kept per signature, and signatures per node: the file stays small whatever happens.
MAX_EPISODES = 16
MAX_SIGNATURES = 64


def lock_path(state_dir: str, node: str) -> str:
    return os.path.join(ledger_dir(state_dir), f".{path_component(node)}.lock")


@dataclass
class Episode:
    """One drain of this signature, from the drain to back in service (or inspection)."""
    drained_at: float
    reboots: List[float] = field(default_factory=list)     # when each reboot was asked
    resets: List[float] = field(default_factory=list)      # when each GPU reset was tried
    resumed_at: Optional[float] = None                     # back in service
    outcome: str = ""                                      # "" open | resumed | inspect


@dataclass
class Entry:
    cause: str
    reboots: List[float] = field(default_factory=list)     # every reboot asked (the budget counts these)
    resets: Dict[str, int] = field(default_factory=dict)   # boot id -> GPU resets tried in it
    episodes: List[Episode] = field(default_factory=list)
    inspect_at: Optional[float] = None

    def open_episode(self) -> Optional[Episode]:
        return self.episodes[-1] if self.episodes and not self.episodes[-1].outcome else None


@dataclass
class Asked:
    kind: str           # reboot | reset
    signature: str
    boot_id: str
    at: float


@dataclass
class Ledger:
    entries: Dict[str, Entry] = field(default_factory=dict)
    asked: Optional[Asked] = None
    totals: RemedyTotals = field(default_factory=RemedyTotals)     # ever, for the metrics: forget() keeps them

    # -- reading -------------------------------------------------------------------------------
    def entry(self, signature: str, cause: str = "") -> Entry:
        found = self.entries.get(signature)
        if found is None:
            found = self.entries[signature] = Entry(cause=cause or signature)
            self._prune()
        return found

    def asked_in(self, boot_id: str) -> str:
        """What was asked and not yet done in this boot ("" if nothing): a reboot asked in an
        earlier boot happened."""
        return self.asked.kind if self.asked is not None and self.asked.boot_id == boot_id else ""

    # -- changing ------------------------------------------------------------------------------
    def note_drain(self, signature: str, cause: str, at: float, reopen_within_s: float = 0.0) -> None:
        """Our drain for this signature began. The same fault back within ``reopen_within_s`` of an
        episode that ended in service after a reboot (a lemon: Slurm resumed it, the fault came
        back) continues that episode: it did not stay in service."""
        entry = self.entry(signature, cause)
        if entry.open_episode() is not None:
            return
        last = entry.episodes[-1] if entry.episodes else None
        if last is not None and last.outcome == "resumed" and last.reboots and last.resumed_at is not None \
                and at - last.resumed_at < reopen_within_s:
            last.outcome, last.resumed_at = "", None
            return
        entry.episodes.append(Episode(drained_at=at))
        del entry.episodes[:-MAX_EPISODES]

    def note_reboot(self, signature: str, cause: str, boot_id: str, at: float) -> None:
        entry = self.entry(signature, cause)
        entry.reboots.append(at)
        del entry.reboots[:-MAX_EPISODES * 4]
        self.totals.reboots += 1
        episode = entry.open_episode()
        if episode is not None:
            episode.reboots.append(at)
        self.asked = Asked("reboot", signature, boot_id, at)

    def note_reset(self, signature: str, cause: str, boot_id: str, at: float) -> None:
        entry = self.entry(signature, cause)
        entry.resets = {boot_id: entry.resets.get(boot_id, 0) + 1}
        self.totals.resets += 1
        episode = entry.open_episode()
        if episode is not None:
            episode.resets.append(at)
        self.asked = Asked("reset", signature, boot_id, at)

    def note_resumed(self, at: float) -> None:
        """The node is back in service: every open episode ends well."""
        for entry in self.entries.values():
            episode = entry.open_episode()
            if episode is not None:
                episode.resumed_at, episode.outcome = at, "resumed"
                self.totals.observe_back_in_service(at - episode.drained_at)
        self.asked = None

    def note_inspect(self, signature: str, cause: str, at: float) -> None:
        entry = self.entry(signature, cause)
        entry.inspect_at = at
        self.totals.inspections += 1
        episode = entry.open_episode()
        if episode is not None:
            episode.outcome = "inspect"
        self.asked = None

    def forget(self, signature: Optional[str] = None) -> None:
        """An admin looked (``slurm-gpu resume``): the count starts again."""
        if signature is None:
            self.entries.clear()
        else:
            self.entries.pop(signature, None)
        self.asked = None

    def _prune(self) -> None:
        while len(self.entries) > MAX_SIGNATURES:
            oldest = min(self.entries, key=lambda s: max(self.entries[s].reboots or [0.0]))
            del self.entries[oldest]

    # -- the file ------------------------------------------------------------------------------
    def to_json(self) -> Dict[str, Any]:
        from dataclasses import asdict

        return {"version": VERSION, "entries": {k: asdict(v) for k, v in self.entries.items()},
                "asked": asdict(self.asked) if self.asked else None, "totals": self.totals.to_json()}

    @classmethod
    def from_json(cls, data: Optional[Dict[str, Any]]) -> "Ledger":
        if not data or data.get("version") != VERSION:
            return cls()
        try:
            entries = {}
            for key, raw in dict(data.get("entries", {})).items():
                episodes = [Episode(drained_at=float(e["drained_at"]), reboots=[float(t) for t in e.get("reboots", [])],
                                    resets=[float(t) for t in e.get("resets", [])],
                                    resumed_at=None if e.get("resumed_at") is None else float(e["resumed_at"]),
                                    outcome=str(e.get("outcome", ""))) for e in raw.get("episodes", [])]
                entries[str(key)] = Entry(cause=str(raw.get("cause", key)),
                                          reboots=[float(t) for t in raw.get("reboots", [])],
                                          resets={str(b): int(n) for b, n in dict(raw.get("resets", {})).items()},
                                          episodes=episodes,
                                          inspect_at=None if raw.get("inspect_at") is None else float(raw["inspect_at"]))
            asked = data.get("asked")
            return cls(entries=entries, asked=Asked(str(asked["kind"]), str(asked["signature"]), str(asked["boot_id"]),
                                                    float(asked["at"])) if isinstance(asked, dict) else None,
                       totals=RemedyTotals.from_json(data.get("totals")))
        except (TypeError, ValueError, KeyError, AttributeError):
            return cls()


def _problem(data: Dict[str, Any]) -> Optional[str]:
    problem = field_problem(data, {"version": is_number})
    if problem:
        return problem
    if not isinstance(data.get("entries", {}), dict):
        return "entries is not an object"
    asked = data.get("asked")
    if asked is not None and (not isinstance(asked, dict) or field_problem(
            asked, {"kind": is_str, "signature": is_str, "boot_id": is_str, "at": is_number})):
        return "asked is not a request"
    return None


def load(state_dir: str, node: str) -> Ledger:
    return Ledger.from_json(read_state_json(ledger_path(state_dir, node), _problem, newest=VERSION))


def save(state_dir: str, node: str, ledger: Ledger) -> None:
    atomic_write(ledger_path(state_dir, node), json.dumps(ledger.to_json(), sort_keys=True) + "\n")


@contextlib.contextmanager
def held(state_dir: str, node: str) -> Iterator[Ledger]:
    """The node's ledger, read under its lock; the holder saves it (``save``) when it must, before
    it acts on what it counted (the remediation: a reboot is written down before it is asked)."""
    with locked(lock_path(state_dir, node)):
        yield load(state_dir, node)


@contextlib.contextmanager
def changing(state_dir: str, node: str) -> Iterator[Ledger]:
    """The node's ledger, read under its lock and saved (atomically, fsync'd) when the block
    ends without an exception."""
    with locked(lock_path(state_dir, node)):
        ledger = load(state_dir, node)
        yield ledger
        save(state_dir, node, ledger)


def signature(cause: str, gpu_uuid: Optional[str]) -> str:
    """A fault's identity across reboots: its cause (check, subject, Xid) with the GPU named by
    UUID (an index moves when a GPU drops out; the UUID follows the part)."""
    return f"{cause} {gpu_uuid}" if gpu_uuid else cause


def signature_of(record) -> str:
    """The fault signature of a drain record: its cause and the GPU's UUID from its evidence."""
    subject = record.cause.split(" ")[1] if " " in record.cause else ""
    uuid = None
    for finding in record.evidence or ():
        if isinstance(finding, dict) and finding.get("uuid") and f"gpu{finding.get('gpu')}" == subject:
            uuid = str(finding["uuid"])
            break
    return signature(record.cause, uuid)
