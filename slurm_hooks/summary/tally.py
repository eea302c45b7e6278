"""One pass over accounting rows into bounded counters.

Memory grows with the number of nodes, GPUs behind hardware endings, causes, Xid codes and
hours in the window: never with the number of jobs (a month of a large cluster is a million
rows). ``Tally.add_chunk`` is the hot path of ``slurm-gpu summary``: it works a chunk of rows
column by column, looks at an AdminComment only when it holds an entry of ours, and expands
each distinct node list once.
"""
from __future__ import annotations

import gc
import heapq
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import add, getitem, is_not, itemgetter, mul, not_
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from .accounting import (END_FIRST, END_LAST, END_LENGTH, MAX_ELAPSED_S, MAX_JOB_GPUS, SACCT_FIELDS,
                         end_is_time, impossible_reason, job_name, seconds_of)
from .rows import (
    I_ACCOUNT,
    I_ADMIN,
    I_ELAPSED,
    I_END,
    I_JOBID,
    I_NODELIST,
    I_PARTITION,
    I_STATE,
    I_TRES,
    I_USER,
    NODE_CACHE_LIMIT,
    GpuCounts,
    chunks,
    expand_nodes,
)
from .verdict import (
    HARDWARE,
    SIMPLE_HEAD,
    SOURCE_ACCOUNTING,
    SOURCE_HOOKS,
    STORED_HEAD,
    TAGS,
    UNFINISHED,
    Verdict,
    classify,
    quick_cause,
    state_word,
)


_STATE, _END, _ELAPSED = itemgetter(I_STATE), itemgetter(I_END), itemgetter(I_ELAPSED)
_TRES, _NODELIST, _ADMIN = itemgetter(I_TRES), itemgetter(I_NODELIST), itemgetter(I_ADMIN)
_HOUR = slice(0, 13)             # "2026-11-30T14" of sacct's "2026-11-30T14:38:11"

TOP_LOSSES = 25
LOSS_NAME_CHARS = 1024           # a kept loss's job name, at most (a name may be a line long: 64 MB)


@dataclass
class Filters:
    """What to count. Empty means everything; times are sacct's local ISO form and select
    jobs by when they ended (``since <= End < until``)."""
    since: str = ""
    until: str = ""
    users: FrozenSet[str] = frozenset()
    accounts: FrozenSet[str] = frozenset()
    partitions: FrozenSet[str] = frozenset()
    nodes: FrozenSet[str] = frozenset()
    states: FrozenSet[str] = frozenset()
    causes: FrozenSet[str] = frozenset()
    job_ids: FrozenSet[str] = frozenset()      # JobIDRaw or JobID (123, 123_4)


@dataclass
class NodeTally:
    jobs: int = 0
    node_seconds: float = 0.0
    hardware: int = 0
    drains: int = 0
    drains_ours: int = 0
    causes: Dict[str, int] = field(default_factory=dict)
    xids: Dict[int, int] = field(default_factory=dict)


@dataclass
class XidTally:
    jobs: int = 0
    gpu_seconds: float = 0.0
    nodes: Dict[str, int] = field(default_factory=dict)


@dataclass
class JobView:
    """One counted row, handed to a per-job consumer (``--jobs``)."""
    fields: Sequence[str]
    verdict: Verdict
    gpus: int
    elapsed_s: int
    nodes: Tuple[str, ...]


def _add_cell(cells: Dict, cause: str, jobs: int, gpu_seconds: float, from_accounting: int) -> None:
    cell = cells.get(cause)
    if cell is None:
        cells[cause] = [jobs, gpu_seconds, from_accounting]
    else:
        cell[0] += jobs
        cell[1] += gpu_seconds
        cell[2] += from_accounting


def _add_counts(mine: Dict, theirs: Dict) -> None:
    for key, count in theirs.items():
        mine[key] = mine.get(key, 0) + count


# A header further in (two sacct runs' files put together) reads as a row: its State is this.
HEADER_STATE = SACCT_FIELDS[I_STATE]


class _StateKeys(dict):
    """sacct State -> the tally key of a job classified from accounting alone ("|S" + first
    word); None for the State of a job that has not ended, and for a header's (not a job)."""

    def __missing__(self, state: str) -> Optional[str]:
        if len(self) >= NODE_CACHE_LIMIT:
            self.clear()
        not_ended = state in UNFINISHED or state == HEADER_STATE
        key = self[state] = None if not_ended else "|" + SOURCE_KEY_ACCOUNTING + state_word(state)
        return key


class _EntryKeys(dict):
    """The class word of a simple entry of ours -> its tally key ("|H" + the class upper-cased,
    as ``classify`` reads it); None for a hardware class (the parser finds its node and GPU)."""

    def __missing__(self, word: str) -> Optional[str]:
        if len(self) >= NODE_CACHE_LIMIT:
            self.clear()
        cause = word.upper()
        key = self[word] = None if cause in HARDWARE else "|" + SOURCE_KEY_HOOKS + cause
        return key


SOURCE_KEY_HOOKS, SOURCE_KEY_ACCOUNTING = "H", "S"
class Tally:
    """Counters over accounting rows. Rows are taken a chunk at a time and worked on column by
    column, so that most of the per-row work happens inside C loops (``map``, ``Counter``,
    ``zip``): a month of a large cluster is an ordinary input."""

    def __init__(self, filters: Optional[Filters] = None,
                 on_job: Optional[Callable[[JobView], None]] = None):
        self.filters = filters or Filters()
        self.on_job = on_job
        self.jobs = 0
        self.unfinished = 0
        self.filtered_out = 0
        self.rejected = 0                # rows with values no job can have (accounting.MAX_*)
        self.set_aside: Dict[str, int] = {}   # ... per reason (accounting.SET_ASIDE)
        self.gpu_seconds = 0
        self.hardware_jobs = 0
        self.hardware_gpu_seconds = 0.0
        # "YYYY-MM-DDTHH|<H or S><cause>" -> jobs, and -> GPU-seconds (H: our entry decided)
        self._key_jobs: Counter = Counter()
        self._key_gpu_seconds: Dict[str, int] = {}
        # node list -> jobs, and -> elapsed seconds; expanded into ``nodes`` by _flush_nodelists
        self._list_jobs: Counter = Counter()
        self._list_seconds: Dict[str, int] = {}
        self.nodes: Dict[str, NodeTally] = {}
        self.gpus: Dict[Tuple[str, int], Dict[int, int]] = {}   # (node, gpu) -> xid -> endings (-1: none)
        self.xids: Dict[int, XidTally] = {}
        self.first_end = ""
        self.last_end = ""
        self.losses: List[Tuple[float, str, str, str, str, str]] = []   # heap of the largest hardware losses
        self.drain_events = 0
        self._fresh_caches()

    def _fresh_caches(self) -> None:
        self._node_cache: Dict[str, Tuple[str, ...]] = {}
        self._gpu_counts = GpuCounts()
        self._state_keys = _StateKeys()
        self._entry_keys = _EntryKeys()

    # A worker's tally travels to the parent pickled (``parallel.py``): the caches stay behind
    # (the node lists expanded alone were a fifth of the bytes).
    _CACHES = ("_node_cache", "_gpu_counts", "_state_keys", "_entry_keys")

    def __getstate__(self) -> Dict[str, Any]:
        state = {name: value for name, value in self.__dict__.items() if name not in self._CACHES}
        state["on_job"] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fresh_caches()

    # -- the hot path ----------------------------------------------------------------------
    def add(self, rows: Iterable[Sequence[str]]) -> None:
        self.add_chunks(chunks(rows))

    def add_chunks(self, row_lists: Iterable[List[Sequence[str]]]) -> None:
        """Each list of rows in turn (``accounting.row_blocks`` gives a block's rows at once)."""
        # A chunk of rows lives long enough for the cycle collector to promote it and then walk
        # it again and again; the pass makes no reference cycles, so the collector rests.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for chunk in row_lists:
                self.add_chunk(chunk)
        finally:
            if collecting:
                gc.enable()

    def _select(self, rows: List[Sequence[str]], keys: List[str]) -> Tuple[List[Sequence[str]], List[str]]:
        """The rows (and their keys) that pass the filters on sacct's own fields."""
        f = self.filters
        since, until = f.since, f.until or "~"
        keep = [since <= row[I_END] < until
                and (not f.users or row[I_USER] in f.users)
                and (not f.accounts or row[I_ACCOUNT] in f.accounts)
                and (not f.partitions or row[I_PARTITION] in f.partitions)
                and (not f.states or state_word(row[I_STATE]) in f.states)
                and (not f.job_ids or row[0] in f.job_ids or row[I_JOBID] in f.job_ids)
                and (not f.nodes or not f.nodes.isdisjoint(self._nodes(row[I_NODELIST])))
                for row in rows]
        kept = list(compress(rows, keep))
        self.filtered_out += len(rows) - len(kept)
        return kept, list(compress(keys, keep))

    def add_chunk(self, rows: List[Sequence[str]]) -> None:
        # Column by column, each step one C-level pass over the chunk (map, compress, Counter);
        # Python-level steps only for the rows that need more (filters, entries read in full).
        keys = list(map(self._state_keys.__getitem__, map(_STATE, rows)))
        if None in keys:                  # jobs that have not ended, headers: not endings
            ended = list(map(is_not, keys, repeat(None)))
            dropped = list(map(_STATE, compress(rows, map(not_, ended))))
            rows, keys = list(compress(rows, ended)), list(compress(keys, ended))
            self.unfinished += len(dropped) - dropped.count(HEADER_STATE)
        if rows:
            # An ended job's End is a time (one pass each in C; the rows are looked at one by one
            # only when one is not): "Unknown" or 0000-00-00T00:00:00 is no ending, and would
            # otherwise have become the report's window.
            ends = list(map(_END, rows))
            lengths = list(map(len, ends))
            if min(ends) < END_FIRST or max(ends) >= END_LAST or min(lengths) != END_LENGTH \
                    or max(lengths) != END_LENGTH:
                timed = list(map(end_is_time, ends))
                self._set_aside("end_not_a_time", len(timed) - sum(timed))
                rows, keys = list(compress(rows, timed)), list(compress(keys, timed))
        f = self.filters
        if f.since or f.until or f.users or f.accounts or f.partitions or f.states or f.job_ids or f.nodes:
            rows, keys = self._select(rows, keys)
        if not rows:
            return
        # Causes: a lone job-level entry of ours is read in place; other entries get the parser.
        verdicts: Dict[int, Verdict] = {}
        tag, stored_tag, head, stored_head = TAGS[0], TAGS[1], SIMPLE_HEAD, STORED_HEAD
        entry_key = self._entry_keys.__getitem__
        comments = list(map(_ADMIN, rows))
        for i in compress(range(len(rows)), comments):
            comment = comments[i]
            # One entry of ours, job-level, last in the comment (after a jobstats blob, say), no
            # Xid: its class is read in place; a second tag anywhere leaves the row to the parser.
            # (``in`` and str.partition parse no arguments; find, count and endswith do, and that
            # was a third of this loop's cost.)
            if stored_tag in comment:
                # sacctmgr's stored form, what the Epilog's entries look like in accounting
                before, found, after = comment.partition(stored_head)
                if found and after[-1:] == "}" and stored_tag not in after and stored_tag not in before \
                        and "`xid`" not in comment and tag not in comment:
                    word, closed, _ = after.partition("`")
                    key = entry_key(word) if closed else None
                    if key is not None:
                        keys[i] = key
                        continue
            elif tag not in comment:
                continue
            else:
                before, found, after = comment.partition(head)
                if found and after[-1:] == "}" and tag not in after and tag not in before and '"xid"' not in comment:
                    word, closed, _ = after.partition('"')
                    key = entry_key(word) if closed else None
                    if key is not None:
                        keys[i] = key
                        continue
            cause = quick_cause(comment)
            if cause is not None:
                keys[i] = "|H" + cause
                continue
            row = rows[i]
            verdict = classify(row[I_STATE], comment, self._nodes(row[I_NODELIST]))
            if verdict.source == SOURCE_HOOKS:
                keys[i] = "|H" + verdict.cause
                verdicts[i] = verdict
        if self.filters.causes:
            wanted = self.filters.causes
            keep = [key[2:] in wanted for key in keys]
            before = len(rows)
            rows, keys = list(compress(rows, keep)), list(compress(keys, keep))
            verdicts = {j: verdicts[i] for j, i in enumerate(compress(range(before), keep)) if i in verdicts}
            self.filtered_out += before - len(rows)
            if not rows:
                return
        ends, nodelists = list(map(_END, rows)), list(map(_NODELIST, rows))
        try:
            elapsed = list(map(int, map(_ELAPSED, rows)))
        except ValueError:
            elapsed = list(map(seconds_of, map(_ELAPSED, rows)))      # 1e9, NaN: NOT_A_NUMBER
        gpus = list(map(self._gpu_counts.__getitem__, map(_TRES, rows)))
        if min(elapsed) < 0 or max(elapsed) > MAX_ELAPSED_S or min(gpus) < 0 or max(gpus) > MAX_JOB_GPUS:
            # Rare: count what no job can be (2.2e26 GPU-hours, -8 GPUs, NaN seconds), per reason,
            # then tally the rest as usual.
            possible = []
            for row, end, busy, count in zip(rows, ends, elapsed, gpus):
                reason = impossible_reason(end, busy, count)
                if reason is None:
                    possible.append(row)
                else:
                    self._set_aside(reason, 1)
            if possible:
                self.add_chunk(possible)
            return
        gpu_seconds = list(map(mul, gpus, elapsed))
        keys = list(map(add, map(getitem, ends, repeat(_HOUR)), keys))
        self._key_jobs.update(keys)
        self._list_jobs.update(nodelists)
        per_key, per_key_get = self._key_gpu_seconds, self._key_gpu_seconds.get
        per_list, per_list_get = self._list_seconds, self._list_seconds.get
        for key, seconds, nodelist, busy in zip(keys, gpu_seconds, nodelists, elapsed):
            per_key[key] = per_key_get(key, 0) + seconds
            per_list[nodelist] = per_list_get(nodelist, 0) + busy
        self.jobs += len(rows)
        self.gpu_seconds += sum(gpu_seconds)
        first, last = min(ends), max(ends)
        if not self.first_end or first < self.first_end:
            self.first_end = first
        if last > self.last_end:
            self.last_end = last
        if len(per_list) >= NODE_CACHE_LIMIT:
            self._flush_nodelists()
        for i, verdict in verdicts.items():
            self._add_verdict(rows[i], verdict, gpu_seconds[i])
        if self.on_job is not None:
            for i, row in enumerate(rows):
                source_and_cause = keys[i].partition("|")[2]
                verdict = verdicts.get(i) or Verdict(
                    cause=source_and_cause[1:],
                    source=SOURCE_HOOKS if source_and_cause[0] == SOURCE_KEY_HOOKS else SOURCE_ACCOUNTING)
                self.on_job(JobView(row, verdict, gpus[i], elapsed[i], self._nodes(row[I_NODELIST])))

    def _set_aside(self, reason: str, rows: int) -> None:
        if rows:
            self.rejected += rows
            self.set_aside[reason] = self.set_aside.get(reason, 0) + rows

    def _cells(self) -> Iterable[Tuple[str, str, int, int, int]]:
        """(hour, cause, jobs, gpu_seconds, jobs classified from accounting alone) per tally key."""
        gpu_seconds = self._key_gpu_seconds
        for key, jobs in self._key_jobs.items():
            hour, _, rest = key.partition("|")
            yield hour, rest[1:], jobs, gpu_seconds.get(key, 0), jobs if rest[0] == SOURCE_KEY_ACCOUNTING else 0

    @property
    def by_hour(self) -> Dict[str, Dict[str, List[int]]]:
        """"YYYY-MM-DDTHH" -> cause -> [jobs, gpu_seconds, jobs classified from accounting alone]"""
        hours: Dict[str, Dict[str, List[int]]] = {}
        for hour, cause, jobs, gpu_seconds, from_accounting in self._cells():
            _add_cell(hours.setdefault(hour, {}), cause, jobs, gpu_seconds, from_accounting)
        return hours

    @property
    def by_cause(self) -> Dict[str, List[float]]:
        """cause -> [jobs, gpu_seconds, jobs classified from accounting alone]"""
        totals: Dict[str, List[float]] = {}
        for _, cause, jobs, gpu_seconds, from_accounting in self._cells():   # one per hour and cause
            _add_cell(totals, cause, jobs, gpu_seconds, from_accounting)
        return totals

    def _nodes(self, nodelist: str) -> Tuple[str, ...]:
        cache = self._node_cache
        nodes = cache.get(nodelist)
        if nodes is None:
            if len(cache) >= NODE_CACHE_LIMIT:
                cache.clear()
            nodes = cache[nodelist] = expand_nodes(nodelist)
        return nodes

    def _flush_nodelists(self) -> None:
        for nodelist, jobs in self._list_jobs.items():
            seconds = self._list_seconds.get(nodelist, 0)
            for node in expand_nodes(nodelist):
                tally = self.nodes.get(node)
                if tally is None:
                    tally = self.nodes[node] = NodeTally()
                tally.jobs += jobs
                tally.node_seconds += seconds
        self._list_jobs.clear()
        self._list_seconds.clear()

    def merge(self, other: "Tally") -> "Tally":
        """Add another tally of other rows (a worker's) into this one."""
        other.finish()
        self.finish()
        for name in ("jobs", "unfinished", "filtered_out", "rejected", "gpu_seconds", "hardware_jobs",
                     "hardware_gpu_seconds", "drain_events"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        _add_counts(self.set_aside, other.set_aside)
        self._key_jobs.update(other._key_jobs)
        for key, seconds in other._key_gpu_seconds.items():
            self._key_gpu_seconds[key] = self._key_gpu_seconds.get(key, 0) + seconds
        for node, theirs in other.nodes.items():
            mine = self.nodes.setdefault(node, NodeTally())
            mine.jobs += theirs.jobs
            mine.node_seconds += theirs.node_seconds
            mine.hardware += theirs.hardware
            mine.drains += theirs.drains
            mine.drains_ours += theirs.drains_ours
            _add_counts(mine.causes, theirs.causes)
            _add_counts(mine.xids, theirs.xids)
        for gpu, per_xid in other.gpus.items():
            _add_counts(self.gpus.setdefault(gpu, {}), per_xid)
        for code, theirs in other.xids.items():
            mine = self.xids.setdefault(code, XidTally())
            mine.jobs += theirs.jobs
            mine.gpu_seconds += theirs.gpu_seconds
            _add_counts(mine.nodes, theirs.nodes)
        if other.first_end and (not self.first_end or other.first_end < self.first_end):
            self.first_end = other.first_end
        self.last_end = max(self.last_end, other.last_end)
        for loss in other.losses:
            self._keep_loss(loss)
        return self

    def _keep_loss(self, loss: Tuple[float, str, str, str, str, str]) -> None:
        if len(self.losses) < TOP_LOSSES:
            heapq.heappush(self.losses, loss)
        elif loss > self.losses[0]:
            heapq.heapreplace(self.losses, loss)

    def finish(self) -> "Tally":
        """Fold what is still kept per node list into the per-node tallies (call before reading
        ``nodes``; more rows may be added afterwards)."""
        self._flush_nodelists()
        return self

    def _add_verdict(self, row: Sequence[str], verdict: Verdict, gpu_seconds: float) -> None:
        for code in verdict.xids:
            xid = self.xids.get(code)
            if xid is None:
                xid = self.xids[code] = XidTally()
            xid.jobs += 1
            xid.gpu_seconds += gpu_seconds
            for culprit in verdict.culprits:
                if culprit.xid in (None, code):
                    xid.nodes[culprit.node] = xid.nodes.get(culprit.node, 0) + 1
        if not verdict.hardware:
            return
        self.hardware_jobs += 1
        self.hardware_gpu_seconds += gpu_seconds
        seen = set()
        for culprit in verdict.culprits:
            tally = self.nodes.get(culprit.node)
            if tally is None:
                tally = self.nodes[culprit.node] = NodeTally()
            if culprit.node not in seen:
                seen.add(culprit.node)
                tally.hardware += 1
                tally.causes[verdict.cause] = tally.causes.get(verdict.cause, 0) + 1
            if culprit.xid is not None:
                tally.xids[culprit.xid] = tally.xids.get(culprit.xid, 0) + 1
            if culprit.gpu is not None:
                per_gpu = self.gpus.setdefault((culprit.node, culprit.gpu), {})
                key = culprit.xid if culprit.xid is not None else -1
                per_gpu[key] = per_gpu.get(key, 0) + 1
        culprit_text = ",".join(sorted(seen))
        name = job_name(row)
        if len(name) > LOSS_NAME_CHARS:
            name = name[:LOSS_NAME_CHARS] + "[cut]"
        loss = (gpu_seconds, row[I_JOBID], name, row[I_USER][:LOSS_NAME_CHARS], culprit_text, verdict.cause)
        self._keep_loss(loss)

    # -- node events (drains) --------------------------------------------------------------
    def add_drain(self, node: str, ours: bool) -> None:
        tally = self.nodes.get(node)
        if tally is None:
            tally = self.nodes[node] = NodeTally()
        tally.drains += 1
        if ours:
            tally.drains_ours += 1
        self.drain_events += 1
