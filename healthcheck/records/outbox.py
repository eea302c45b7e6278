"""Getting entries into the job's AdminComment, and never losing one.

Every entry first goes to a local queue (``<state_dir>/outbox/<job>.<node>.json``, atomic); it
leaves the queue only once accounting shows it. When accounting cannot be reached (slurmdbd down),
the entry stays queued and any later hook run on the node delivers it.

Writing is read-merge-write-verify: read the field, ``admin_comment.merge`` ours in (other tools'
text and other nodes' entries kept), write it with one call, wait ``verify_delay_s`` (plus a
random part, so writers that collided do not collide again), read it back. Several nodes of one
job write the same field from different hosts: when a concurrent writer replaced the field after
our read, our entry is missing on the re-read and we merge again. A writer re-reads only after
its own write has settled, so a write that removed another's entry is seen by that other writer,
which then writes again with both.
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol

from .. import fsutil
from . import admin_comment
from .store import JOB_LEVEL, job_id_ok

OUTBOX_DIR = "outbox"


class AccountingError(Exception):
    """Accounting could not be read or written (one line)."""


class Accounting(Protocol):
    def get_admin_comment(self, job_id: str) -> Optional[str]:
        """The job's AdminComment ("" when empty); None when accounting has no such job (yet)."""

    def set_admin_comment(self, job_id: str, text: str) -> None: ...


@dataclass
class DeliverySettings:
    attempts: int = 5
    verify_delay_s: float = 1.0
    jitter_s: float = 1.0
    max_jobs_per_run: int = 50
    lock_wait_s: float = 30.0

    @classmethod
    def from_section(cls, section: Dict[str, Any]) -> "DeliverySettings":
        return cls(attempts=int(section.get("write_attempts", cls.attempts)),
                   verify_delay_s=float(section.get("verify_delay_s", cls.verify_delay_s)),
                   jitter_s=float(section.get("verify_jitter_s", cls.jitter_s)),
                   max_jobs_per_run=int(section.get("deliver_max_jobs", cls.max_jobs_per_run)))


@dataclass
class WriteResult:
    delivered: bool
    writes: int
    reason: str = ""


def write_entries(accounting: Accounting, job_id: str, entries: List[Dict[str, Any]],
                  settings: DeliverySettings, sleep: Callable[[float], None] = time.sleep,
                  rng: Optional[random.Random] = None) -> WriteResult:
    """Read-merge-write-verify ``entries`` into ``job_id``'s AdminComment (``write_jobs``)."""
    return write_jobs(accounting, {job_id: entries}, settings, sleep, rng)[job_id]


def write_jobs(accounting: Accounting, jobs: Dict[str, List[Dict[str, Any]]], settings: DeliverySettings,
               sleep: Callable[[float], None] = time.sleep,
               rng: Optional[random.Random] = None) -> Dict[str, WriteResult]:
    """Read-merge-write-verify for several jobs, with one settle wait per round for all of them
    (a queue of many jobs costs one wait, not one per job). Raises ``AccountingError`` when
    accounting does not answer; a job not in accounting yet, or whose entries did not stick
    after every attempt, is delivered=False."""
    rng = rng or random.Random()
    results: Dict[str, WriteResult] = {}
    writes = {job: 0 for job in jobs}
    todo = dict(jobs)
    for _ in range(max(1, settings.attempts)):
        written = []
        for job, entries in todo.items():
            current = accounting.get_admin_comment(job)
            if current is None:
                results[job] = WriteResult(False, writes[job], "the job is not in accounting yet")
            elif all(admin_comment.contains(current, entry) for entry in entries):
                results[job] = WriteResult(True, writes[job])
            else:
                accounting.set_admin_comment(job, admin_comment.merge(current, entries))
                writes[job] += 1
                written.append(job)
        if not written:
            return results
        sleep(settings.verify_delay_s + rng.uniform(0, settings.jitter_s))
        todo = {}
        for job in written:
            after = accounting.get_admin_comment(job)
            if after is not None and all(admin_comment.contains(after, entry) for entry in jobs[job]):
                results[job] = WriteResult(True, writes[job])
            else:
                todo[job] = jobs[job]
        if not todo:
            return results
    for job in todo:
        results[job] = WriteResult(False, writes[job], f"entries did not stick after {writes[job]} writes")
    return results


# -- the queue ---------------------------------------------------------------------------------

def outbox_dir(state_dir: str) -> str:
    return os.path.join(state_dir, OUTBOX_DIR)


def _entry_path(state_dir: str, job_id: str, node: str) -> str:
    name = "_job" if node == JOB_LEVEL else fsutil.path_component(node)
    return os.path.join(outbox_dir(state_dir), f"{job_id_ok(job_id)}.{name}.json")


def enqueue(state_dir: str, job_id: str, entry: Dict[str, Any], now: Optional[float] = None) -> str:
    """Queue ``entry`` (with its ``node``) for ``job_id``; a newer entry for the same node replaces it."""
    path = _entry_path(state_dir, job_id, str(entry["node"]))
    fsutil.ensure_dir(os.path.dirname(path))
    item = {"job_id": str(job_id), "entry": entry, "queued_at": time.time() if now is None else now}
    fsutil.atomic_write(path, json.dumps(item) + "\n")        # entry keys keep their order
    return path


def pending(state_dir: str) -> Dict[str, List[Dict[str, Any]]]:
    """Queued items by job id, oldest job first."""
    directory = outbox_dir(state_dir)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return {}
    items: Dict[str, List[Dict[str, Any]]] = {}
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(directory, name)
        data = fsutil.read_state_json(path)
        if data is None or not isinstance(data.get("entry"), dict) or "job_id" not in data:
            continue
        data["path"] = path
        items.setdefault(str(data["job_id"]), []).append(data)
    return dict(sorted(items.items(), key=lambda kv: min(i.get("queued_at", 0) for i in kv[1])))


@dataclass
class DeliveryReport:
    delivered: List[str]
    waiting: List[str]
    error: str = ""
    writes: int = 0


def deliver_pending(state_dir: str, accounting: Accounting, settings: DeliverySettings,
                    sleep: Callable[[float], None] = time.sleep) -> DeliveryReport:
    """Deliver what the queue holds (under a host-wide lock, ``write_jobs``). An
    ``AccountingError`` leaves everything queued for the next hook run."""
    report = DeliveryReport([], [])
    lock = _try_lock(os.path.join(outbox_dir(state_dir), ".lock"), settings.lock_wait_s, sleep)
    if lock is None:
        report.error = f"another delivery held the queue for {settings.lock_wait_s:g} s"
        report.waiting = list(pending(state_dir))
        return report
    try:
        batch = dict(list(pending(state_dir).items())[:settings.max_jobs_per_run])
        try:
            results = write_jobs(accounting, {job: [i["entry"] for i in items] for job, items in batch.items()},
                                 settings, sleep)
        except AccountingError as exc:
            report.error = str(exc)
            report.waiting = list(batch)
            return report
        for job_id, items in batch.items():
            result = results[job_id]
            report.writes += result.writes
            if result.delivered:
                for item in items:
                    _remove_if_unchanged(item)
                report.delivered.append(job_id)
            else:
                report.waiting.append(job_id)
    finally:
        os.close(lock)
    return report


def _try_lock(path: str, wait_s: float, sleep: Callable[[float], None]) -> Optional[int]:
    """The queue's lock (an fd), waiting at most ``wait_s``: a hook never waits without bound."""
    import fcntl

    fsutil.ensure_dir(os.path.dirname(path))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, fsutil.FILE_MODE)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.1)


def _remove_if_unchanged(item: Dict[str, Any]) -> None:
    """Remove a delivered queue file, unless a newer entry replaced it meanwhile."""
    current = fsutil.read_state_json(item["path"])
    if current is not None and current.get("entry") == item["entry"]:
        try:
            os.unlink(item["path"])
        except FileNotFoundError:
            pass
