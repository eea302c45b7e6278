"""Getting entries into the job's AdminComment, and never losing one.

Every entry first goes to a local queue (``<state_dir>/outbox/<job>.<node>.json``, atomic): a
reference to its record (job, node, run), whose entry (``store.entry_for``) is taken from the record
when it is delivered, so the record on disk is what accounting gets. It leaves the queue only once
accounting shows it. When accounting cannot be reached (slurmdbd down), it stays queued and any
later hook run on the node delivers it.

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
import math
import os
import random
import sys
import time
from ..plain import field, plain
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

from ..config.settings import RecordsSettings
from ..safeio import fsutil
from ..slurm.backend import SlurmError as AccountingError     # accounting could not be read or written
from . import admin_comment
from . import store
from .outbox_stats import count_failures, outbox_dir
from .outbox_stats import is_count as _is_count, is_queue_file as _is_queue_file
from .store import JOB_LEVEL, job_id_ok


class Accounting(Protocol):
    def get_admin_comments(self, job_ids: List[str]) -> Dict[str, Optional[str]]:
        """Each job's AdminComment ("" when empty; None when accounting has no such job yet), in one read."""

    def set_admin_comment(self, job_id: str, text: str) -> None: ...


@plain
class DeliverySettings:
    """How entries are delivered: ``[records]``'s write and queue keys (``from_config``), and the
    two waits that are not settings."""
    attempts: int                       # [records] write_attempts
    verify_delay_s: float               # [records] verify_delay_s
    jitter_s: float                     # [records] verify_jitter_s
    max_jobs_per_run: int               # [records] deliver_max_jobs
    expire_s: float                     # [records] outbox_expire_s
    backoff_max_s: float                # [records] outbox_backoff_max_s
    lock_wait_s: float = 30.0
    backoff_s: float = 30.0             # the first retry of an undelivered entry; doubling from there

    @classmethod
    def from_config(cls, config: Any) -> "DeliverySettings":
        records = config.typed(RecordsSettings)
        return cls(attempts=records.write_attempts, verify_delay_s=records.verify_delay_s,
                   jitter_s=records.verify_jitter_s, max_jobs_per_run=records.deliver_max_jobs,
                   expire_s=records.outbox_expire_s, backoff_max_s=records.outbox_backoff_max_s)


@plain
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
        read = accounting.get_admin_comments(list(todo))
        for job, entries in todo.items():
            current = read.get(job)
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
        read = accounting.get_admin_comments(written)
        for job in written:
            after = read.get(job)
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

RETRY_FILE = ".retry.json"
RESCAN_FILE = ".rescanned.json"
# How far back a rescan looks before its last one (a record being written while it ran).
RESCAN_SLACK_S = 120.0
# A hook starts a delivery for the rescan alone when the last one is older than this.
RESCAN_EVERY_S = 300.0


def _item_path(state_dir: str, job_id: str, node: str, restarts: Any) -> str:
    """``<job>.<node>.json``; a requeued job's later run ``<job>.<node>.r<restarts>.json`` (each run's kept)."""
    suffix = f".r{restarts}" if _is_count(restarts) and restarts > 0 else ""
    return os.path.join(outbox_dir(state_dir), f"{job_id_ok(job_id)}.{store.node_file(node)}{suffix}.json")


def item_problem(data: Dict[str, Any]) -> Optional[str]:
    """What makes a queue file unusable (it is then set aside, ``fsutil.set_aside``), or None.
    A ``job_id`` is checked here, before it can reach ``sacct -j`` or ``sacctmgr``. A reference
    names its record's ``node`` and ``restarts``; an item the releases before wrote holds a copy
    of the entry instead (its ``node`` and ``run``), read as a reference to the same record."""
    try:
        job_id_ok(str(data.get("job_id")))
    except ValueError as exc:
        return f"job_id: {exc}"
    if not isinstance(data.get("job_id"), str):
        return "job_id is not a string"
    entry = data.get("entry", {"class": ""})
    if not isinstance(entry, dict) or not isinstance(entry.get("class"), str):
        return "entry is not an object with a node and a class"
    node, restarts = _reference(data)
    if not isinstance(node, str) or (node != JOB_LEVEL and fsutil.name_problem(node)) or not _is_count(restarts):
        return "not a reference to a record (a node name and a restart count)"
    queued_at = data.get("queued_at")
    if isinstance(queued_at, bool) or not isinstance(queued_at, (int, float)) or not math.isfinite(queued_at):
        return "queued_at is not a number"
    return None


def _reference(data: Dict[str, Any]) -> Tuple[Any, Any]:
    """The record an item refers to: (node, restarts), from the copy of its entry where an older release queued one."""
    entry = data.get("entry")
    if isinstance(entry, dict):
        return entry.get("node"), entry.get("run") or 0
    return data.get("node"), data.get("restarts")


def has_pending(state_dir: str) -> bool:
    """Anything queued at all (names only: cheap enough for a hook's critical path)."""
    try:
        return any(_is_queue_file(name) for name in os.listdir(outbox_dir(state_dir)))
    except OSError:
        return False


def pending(state_dir: str, set_aside: Optional[List[str]] = None) -> Dict[str, List[Dict[str, Any]]]:
    """Queued items by job id, oldest job first. A malformed queue file is set aside as
    ``<file>.corrupt`` with one line on stderr (``item_problem``; its name appended to
    ``set_aside``) and never stops the others."""
    directory = outbox_dir(state_dir)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return {}
    items: Dict[str, List[Dict[str, Any]]] = {}
    for name in names:
        if not _is_queue_file(name):
            continue
        path = os.path.join(directory, name)
        data = fsutil.read_state_json(path, item_problem)
        if data is None:
            if set_aside is not None and not os.path.lexists(path) and os.path.lexists(path + fsutil.CORRUPT_SUFFIX):
                set_aside.append(name)
            continue
        data["path"] = path
        data["node"], data["restarts"] = _reference(data)
        items.setdefault(data["job_id"], []).append(data)
    return dict(sorted(items.items(), key=lambda kv: (min(i["queued_at"] for i in kv[1]), kv[0])))


@plain
class DeliveryReport:
    delivered: List[str]
    waiting: List[str]
    error: str = ""
    writes: int = 0
    deferred: int = 0                                          # backing off: not tried this run
    expired: List[str] = field(default_factory=list)          # older than expire_s: given up, said
    set_aside: List[str] = field(default_factory=list)        # malformed queue files moved to .corrupt


def _retry_path(state_dir: str) -> str:
    return os.path.join(outbox_dir(state_dir), RETRY_FILE)


def _retry_problem(data: Dict[str, Any]) -> Optional[str]:
    ok = all(isinstance(v, dict) and all(isinstance(v.get(k), (int, float)) and not isinstance(v.get(k), bool)
                                         for k in ("queued_at", "tries", "next_at")) for v in data.values())
    return None if ok else "an entry is not {queued_at, tries, next_at}"


def _backoff(tries: int, settings: DeliverySettings) -> float:
    """Seconds before the next try of an entry that failed ``tries`` times: doubling, capped."""
    return min(settings.backoff_max_s, settings.backoff_s * 2.0 ** min(max(0, tries - 1), 30))


def deliver(state_dir: str, accounting: Accounting, settings: DeliverySettings) -> DeliveryReport:
    """Queue what records want but the queue lacks (``requeue_missing``), then deliver: every
    delivery's one sequence (the epilog's, the detached one, the remediation's before a reboot)."""
    requeue_missing(state_dir, settings.expire_s)
    return deliver_pending(state_dir, accounting, settings)


def deliver_pending(state_dir: str, accounting: Accounting, settings: DeliverySettings,
                    sleep: Callable[[float], None] = time.sleep, now: Optional[float] = None) -> DeliveryReport:
    """Deliver what the queue holds (under a host-wide lock, ``write_jobs``), oldest first, at most
    ``max_jobs_per_run`` jobs. A job whose entries could not be delivered (not in accounting, did
    not stick) backs off (``_backoff``), so entries that cannot be delivered never starve the
    ones behind them; an entry queued longer than ``expire_s`` ago is dropped and reported (its
    record stays in the state dir). An ``AccountingError`` leaves everything queued, with no
    back-off: accounting being down is not the entry's fault."""
    report = DeliveryReport([], [])
    lock = _try_lock(os.path.join(outbox_dir(state_dir), ".lock"), settings.lock_wait_s, sleep)
    if lock is None:
        report.error = f"another delivery held the queue for {settings.lock_wait_s:g} s"
        report.waiting = list(pending(state_dir))
        return report
    try:
        now = time.time() if now is None else now
        retry = fsutil.read_state_json(_retry_path(state_dir), _retry_problem) or {}
        live: set = set()
        tried: set = set()
        # Rounds until nothing due is left untried: entries queued while this delivery held the
        # lock (their own delivery gave up waiting for it) go out in this run too.
        while len(tried) < settings.max_jobs_per_run and not report.error:
            due: Dict[str, List[Dict[str, Any]]] = {}
            report.deferred = 0
            for job_id, items in pending(state_dir, report.set_aside).items():
                if now - min(i["queued_at"] for i in items) > settings.expire_s:
                    for item in items:
                        _remove_if_unchanged(item)
                    report.expired.append(job_id)
                    continue
                live.update(os.path.basename(i["path"]) for i in items)
                if job_id in tried:
                    continue
                if all(_due(retry, item, now) for item in items):
                    due[job_id] = items
                else:
                    report.deferred += 1
            if not due:
                break
            batch = dict(list(due.items())[:settings.max_jobs_per_run - len(tried)])
            tried.update(batch)
            _deliver_batch(state_dir, accounting, batch, settings, sleep, retry, now, report)
        _save_retry(state_dir, {name: value for name, value in retry.items() if name in live})
        # Each job not delivered (accounting unreachable, not in accounting, did not stick) or given up.
        if report.waiting or report.expired:
            count_failures(state_dir, len(report.waiting) + len(report.expired))
    finally:
        os.close(lock)
    return report


def _deliver_batch(state_dir: str, accounting: Accounting, batch: Dict[str, List[Dict[str, Any]]],
                   settings: DeliverySettings, sleep: Callable[[float], None], retry: Dict[str, Any], now: float,
                   report: DeliveryReport) -> None:
    """One round of ``deliver_pending``: settle, write ``batch``, remove what was delivered, back off the rest."""
    for job_id, items in list(batch.items()):
        batch[job_id] = [item for item in items if _find_record(state_dir, item, report)]
        if not batch[job_id]:
            del batch[job_id]
    if not batch:
        return          # an empty job list would ask sacct for every job
    try:
        _settle_batch(state_dir, accounting, batch, settings, sleep)
        results = write_jobs(accounting, {job: [i["entry"] for i in items] for job, items in batch.items()},
                             settings, sleep)
    except AccountingError as exc:
        report.error = str(exc)
        report.waiting.extend(batch)
        return
    for job_id, result in results.items():
        items = batch[job_id]
        report.writes += result.writes
        if result.delivered:
            for item in items:
                _remove_if_unchanged(item)
                retry.pop(os.path.basename(item["path"]), None)
            report.delivered.append(job_id)
            continue
        for item in items:
            name = os.path.basename(item["path"])
            before = retry.get(name)
            tries = int(before["tries"]) + 1 if before and before["queued_at"] == item["queued_at"] else 1
            retry[name] = {"queued_at": item["queued_at"], "tries": tries, "next_at": now + _backoff(tries, settings)}
        report.waiting.append(job_id)


def _find_record(state_dir: str, item: Dict[str, Any], report: DeliveryReport) -> bool:
    """Find the record ``item`` refers to (its run's: the latest, else one ``store.earlier_runs`` kept)
    and the entry it delivers now (``store.entry_for``; without a record, the copy an older release
    queued). An item with neither is set aside: its record was removed (``[retention]``)."""
    runs = [store.read_record(state_dir, item["job_id"], item["node"])] + store.earlier_runs(state_dir, item["job_id"])
    record = item["record"] = next((r for r in runs if r is not None and r.get("node") == item["node"]
                                    and (r.get("restarts") or 0) == item["restarts"]), None)
    item["latest"] = record is not None and record is runs[0]
    if record is not None:
        item["entry"] = store.entry_for(record)
    elif "entry" not in item:
        fsutil.set_aside(item["path"], f"its record in jobs/{item['job_id']}/ is gone")
        report.set_aside.append(os.path.basename(item["path"]))
        return False
    return True


def _settle_batch(state_dir: str, accounting: Accounting, batch: Dict[str, List[Dict[str, Any]]],
                  settings: DeliverySettings, sleep: Callable[[float], None]) -> None:
    """Settle the batch's latest records that ask for it (``settle.wants_settling``) by accounting's
    final State, one sacct for the batch, re-read up to ``attempts`` times ``verify_delay_s`` apart
    while accounting still shows a job running (slurmdbd a moment behind). A record accounting
    cannot settle then goes out as the epilog wrote it, still ``slurm_settled: false``."""
    from . import settle

    final_states = getattr(accounting, "final_states", None)
    if final_states is None:
        return
    waiting = {job: [i for i in items if i["latest"] and settle.wants_settling(i["record"])]
               for job, items in batch.items()}
    waiting = {job: items for job, items in waiting.items() if items}
    for attempt in range(max(1, settings.attempts)):
        if not waiting:
            return
        if attempt:
            sleep(settings.verify_delay_s)
        rows = final_states(list(waiting))
        for job in list(waiting):
            waiting[job] = [item for item in waiting[job] if not _settle_item(state_dir, item, rows.get(job))]
            if not waiting[job]:
                del waiting[job]


def _settle_item(state_dir: str, item: Dict[str, Any], row: Optional[Dict[str, str]]) -> bool:
    """Settle the record behind one queued item (``settle.settled``); True when it is settled."""
    from .settle import settled

    new = settled(item["record"], row)
    if new is None:
        return False
    store.write_record(state_dir, new)
    store.mark_queued(state_dir, new["job_id"], new["node"])       # its reference is still queued
    item["entry"] = store.entry_for(new)
    if new.get("settled_from"):
        print(f"slurm-gpu-hooks: job {item['job_id']}: {new['settled_from']} settled as {new['class']} by "
              f"accounting ({new['slurm_why']})", file=sys.stderr)
    return True


def _due(retry: Dict[str, Any], item: Dict[str, Any], now: float) -> bool:
    state = retry.get(os.path.basename(item["path"]))
    # A newer entry for the same file (another queued_at) is a new entry: due at once.
    return state is None or state["queued_at"] != item["queued_at"] or state["next_at"] <= now


def _save_retry(state_dir: str, retry: Dict[str, Any]) -> None:
    path = _retry_path(state_dir)
    try:
        if retry:
            fsutil.atomic_write(path, json.dumps(retry, sort_keys=True) + "\n", durable=False)
        elif os.path.lexists(path):
            os.unlink(path)
    except OSError as exc:      # a full disk: every entry is tried again next run, nothing lost
        print(f"slurm-gpu-hooks: outbox back-off state not saved: {exc}", file=sys.stderr)


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
    """Remove a delivered queue file, unless its record was queued again meanwhile (amended)."""
    current = fsutil.read_state_json(item["path"])
    if current is not None and current.get("queued_at") == item["queued_at"]:
        try:
            os.unlink(item["path"])
        except FileNotFoundError:
            pass


# -- the record on disk is the source of truth -----------------------------------------------------

def queue_record(state_dir: str, record: Dict[str, Any], now: Optional[float] = None) -> str:
    """Queue a reference to a record written with ``entry_wanted`` (a newer one for the same record
    replaces it) and mark it queued (``store.mark_queued``). An OSError (a full disk) leaves the
    record unmarked: ``requeue_missing`` queues it once space returns."""
    restarts = record.get("restarts") or 0
    path = _item_path(state_dir, record["job_id"], str(record["node"]), restarts)
    fsutil.ensure_dir(os.path.dirname(path))
    item = {"job_id": str(record["job_id"]), "node": str(record["node"]), "restarts": restarts,
            "queued_at": time.time() if now is None else now}
    fsutil.atomic_write(path, json.dumps(item) + "\n")
    try:
        store.mark_queued(state_dir, record["job_id"], record["node"])
    except OSError:
        pass        # queued all the same; without the marker a rescan finds the queue file and marks it
    return path


def _rescan_path(state_dir: str) -> str:
    return os.path.join(outbox_dir(state_dir), RESCAN_FILE)


def rescan_due(state_dir: str, now: Optional[float] = None) -> bool:
    """The last ``requeue_missing`` is older than ``RESCAN_EVERY_S`` (one stat)."""
    try:
        return os.lstat(_rescan_path(state_dir)).st_mtime < (time.time() if now is None else now) - RESCAN_EVERY_S
    except OSError:
        return True


def requeue_missing(state_dir: str, expire_s: float, now: Optional[float] = None) -> List[str]:
    """Queue the entries of records that want one but were never queued (``store.records_needing_queue``),
    looking back to the last complete rescan (``expire_s`` at most); the job ids queued. An OSError
    (the disk still full) stops the rescan, which then starts from the same point next time."""
    now = time.time() if now is None else now
    last = fsutil.read_state_json(_rescan_path(state_dir))
    since = now - expire_s
    if last is not None and isinstance(last.get("at"), (int, float)) and not isinstance(last.get("at"), bool):
        since = max(since, float(last["at"]) - RESCAN_SLACK_S)
    queued: List[str] = []
    try:
        for record in store.records_needing_queue(state_dir, since):
            if os.path.exists(_item_path(state_dir, record["job_id"], str(record["node"]), record.get("restarts"))):
                store.mark_queued(state_dir, record["job_id"], record["node"])
                continue
            queue_record(state_dir, record, now=float(record.get("amended_at") or record.get("ended_at") or now))
            queued.append(str(record["job_id"]))
        fsutil.ensure_dir(outbox_dir(state_dir))
        fsutil.atomic_write(_rescan_path(state_dir), json.dumps({"at": now}) + "\n", durable=False)
    except (OSError, ValueError) as exc:
        print(f"slurm-gpu-hooks: outbox rescan stopped, {len(queued)} entr{'y' if len(queued) == 1 else 'ies'} "
              f"queued again: {exc}", file=sys.stderr)
    return queued
