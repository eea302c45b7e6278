"""One pass over accounting rows into bounded counters.

Memory grows with the number of nodes, GPUs behind hardware endings, causes, Xid codes and
hours in the window: never with the number of jobs (a month of a large cluster is a million
rows). The loop in ``Tally.add`` is the hot path of ``slurm-gpu summary``: it touches each row's
fields once, looks at the AdminComment only when it holds an entry of ours, and expands a
node list through a cache.
"""
from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from .accounting import INDEX, job_name
from .classify import HARDWARE, SIMPLE_HEAD, SOURCE_ACCOUNTING, SOURCE_HOOKS, UNFINISHED, Verdict, classify, quick_cause

I_JOBID, I_USER, I_ACCOUNT, I_PARTITION = INDEX["JobID"], INDEX["User"], INDEX["Account"], INDEX["Partition"]
I_STATE, I_START, I_END, I_ELAPSED = INDEX["State"], INDEX["Start"], INDEX["End"], INDEX["ElapsedRaw"]
I_TRES, I_NODELIST, I_ADMIN, I_NAME = INDEX["AllocTRES"], INDEX["NodeList"], INDEX["AdminComment"], INDEX["JobName"]
I_EXIT = INDEX["ExitCode"]

_TYPED_GPU = re.compile(r"gres/gpu:[^=,]+=(\d+)")
_NODE_CACHE_LIMIT = 50_000
TOP_LOSSES = 25


def gpus_of(tres: str) -> int:
    """Allocated GPUs from AllocTRES (``gres/gpu=N``; typed ``gres/gpu:h100=N`` summed when the
    untyped count is absent)."""
    at = tres.find("gres/gpu=")
    if at < 0:
        if "gres/gpu:" not in tres:
            return 0
        return sum(int(n) for n in _TYPED_GPU.findall(tres))
    end = tres.find(",", at)
    value = tres[at + 9:end] if end >= 0 else tres[at + 9:]
    return int(value) if value.isdigit() else 0


def expand_nodes(nodelist: str) -> Tuple[str, ...]:
    if not nodelist or nodelist.startswith("None"):
        return ()
    if "[" not in nodelist and "," not in nodelist:
        return (nodelist,)
    import hostlist

    try:
        return tuple(hostlist.expand_hostlist(nodelist))
    except hostlist.BadHostlist:
        return (nodelist,)


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


class Tally:
    def __init__(self, filters: Optional[Filters] = None,
                 on_job: Optional[Callable[[JobView], None]] = None):
        self.filters = filters or Filters()
        self.on_job = on_job
        self.jobs = 0
        self.unfinished = 0
        self.filtered_out = 0
        self.gpu_seconds = 0.0
        self.hardware_jobs = 0
        self.hardware_gpu_seconds = 0.0
        self._per_key: Dict[str, List[int]] = {}                # "hour|<H or S>cause" -> [jobs, gpu_seconds]
        self._gpus_by_tres: Dict[str, int] = {}
        self.nodes: Dict[str, NodeTally] = {}
        self.gpus: Dict[Tuple[str, int], Dict[int, int]] = {}   # (node, gpu) -> xid -> endings (-1: none)
        self.xids: Dict[int, XidTally] = {}
        self.first_end = ""
        self.last_end = ""
        self.losses: List[Tuple[float, str, str, str, str, str]] = []   # heap of the largest hardware losses
        self.drain_events = 0
        self._node_cache: Dict[str, Tuple[str, ...]] = {}
        self._per_nodelist: Dict[str, List[int]] = {}            # node list -> [jobs, seconds]

    # -- the hot path ----------------------------------------------------------------------
    def add(self, rows: Iterable[Sequence[str]]) -> None:
        f = self.filters
        since, until = f.since, f.until
        users, accounts, partitions, node_filter = f.users, f.accounts, f.partitions, f.nodes
        states, causes, job_ids = f.states, f.causes, f.job_ids
        per_key, per_nodelist, gpus_by_tres = self._per_key, self._per_nodelist, self._gpus_by_tres
        on_job = self.on_job
        unfinished_states = UNFINISHED
        tag = "SGH1:"
        simple_head, head_len, hardware_classes = SIMPLE_HEAD, len(SIMPLE_HEAD), HARDWARE
        i_state, i_end, i_user, i_account, i_partition = I_STATE, I_END, I_USER, I_ACCOUNT, I_PARTITION
        i_nodelist, i_admin, i_elapsed, i_tres, i_jobid = I_NODELIST, I_ADMIN, I_ELAPSED, I_TRES, I_JOBID
        cache_limit = _NODE_CACHE_LIMIT
        jobs = unfinished = filtered = 0
        gpu_total = 0
        first_end, last_end = self.first_end or "~", self.last_end
        for row in rows:
            state = row[i_state]
            word = state.split(" ", 1)[0] if " " in state else state
            if word in unfinished_states:
                unfinished += 1
                continue
            end = row[i_end]
            if (since and end < since) or (until and end >= until) \
                    or (users and row[i_user] not in users) \
                    or (accounts and row[i_account] not in accounts) \
                    or (partitions and row[i_partition] not in partitions) \
                    or (states and word not in states) \
                    or (job_ids and row[0] not in job_ids and row[i_jobid] not in job_ids):
                filtered += 1
                continue
            nodelist = row[i_nodelist]
            nodes = None
            if node_filter:
                nodes = self._nodes(nodelist)
                if node_filter.isdisjoint(nodes):
                    filtered += 1
                    continue
            comment = row[i_admin]
            verdict = None
            if comment and tag in comment:
                # Inline for speed: the usual lone job-level entry written by our encoder.
                if comment.startswith(simple_head) and comment.endswith("}") and '"xid"' not in comment \
                        and comment.find(tag, 5) < 0:
                    cause = comment[head_len:comment.find('"', head_len)]
                    if cause in hardware_classes:
                        cause = None
                else:
                    cause = quick_cause(comment)
                hooks = "H"
                if cause is None:
                    verdict = classify(state, comment, nodes if nodes is not None else self._nodes(nodelist))
                    cause = verdict.cause
                    if verdict.source == SOURCE_ACCOUNTING:
                        verdict, hooks = None, "S"
            else:
                cause = word
                hooks = "S"
            if causes and cause not in causes:
                filtered += 1
                continue
            try:
                elapsed = int(row[i_elapsed])
            except ValueError:
                elapsed = 0
            tres = row[i_tres]
            gpus = gpus_by_tres.get(tres)
            if gpus is None:
                if len(gpus_by_tres) >= cache_limit:
                    gpus_by_tres.clear()
                gpus = gpus_by_tres[tres] = gpus_of(tres)
            gpu_seconds = gpus * elapsed
            jobs += 1
            gpu_total += gpu_seconds
            # One key per hour, source and cause ("2026-11-30T14|H|GPU_LOST"): by_hour unpacks it.
            key = end[:13] + "|" + hooks + cause
            cell = per_key.get(key)
            if cell is None:
                cell = per_key[key] = [0, 0]
            cell[0] += 1
            cell[1] += gpu_seconds
            if end < first_end:
                first_end = end
            if end > last_end:
                last_end = end
            # Node-hours per node list; lists are expanded once each, in finish().
            busy = per_nodelist.get(nodelist)
            if busy is None:
                if len(per_nodelist) >= cache_limit:
                    self._flush_nodelists()
                busy = per_nodelist[nodelist] = [0, 0]
            busy[0] += 1
            busy[1] += elapsed
            if verdict is not None:
                self._add_verdict(row, verdict, gpu_seconds)
            if on_job is not None:
                on_job(JobView(row, verdict or Verdict(cause=cause, source=SOURCE_HOOKS if hooks == "H" else SOURCE_ACCOUNTING),
                               gpus, elapsed, nodes if nodes is not None else self._nodes(nodelist)))
        self.jobs += jobs
        self.unfinished += unfinished
        self.filtered_out += filtered
        self.gpu_seconds += gpu_total
        self.first_end = "" if first_end == "~" else first_end
        self.last_end = last_end

    @property
    def by_hour(self) -> Dict[str, Dict[str, List[int]]]:
        """"YYYY-MM-DDTHH" -> cause -> [jobs, gpu_seconds, jobs classified from accounting alone]"""
        hours: Dict[str, Dict[str, List[int]]] = {}
        for key, (jobs, gpu_seconds) in self._per_key.items():
            hour, _, rest = key.partition("|")
            cell = hours.setdefault(hour, {}).setdefault(rest[1:], [0, 0, 0])
            cell[0] += jobs
            cell[1] += gpu_seconds
            if rest[0] == "S":
                cell[2] += jobs
        return hours

    @property
    def by_cause(self) -> Dict[str, List[float]]:
        """cause -> [jobs, gpu_seconds, jobs classified from accounting alone]"""
        totals: Dict[str, List[float]] = {}
        for row in self.by_hour.values():  # cheap: one entry per hour and cause
            for cause, (jobs, gpu_seconds, from_accounting) in row.items():
                slot = totals.setdefault(cause, [0, 0, 0])
                slot[0] += jobs
                slot[1] += gpu_seconds
                slot[2] += from_accounting
        return totals

    @property
    def from_accounting(self) -> int:
        return int(sum(slot[2] for slot in self.by_cause.values()))

    def _nodes(self, nodelist: str) -> Tuple[str, ...]:
        cache = self._node_cache
        nodes = cache.get(nodelist)
        if nodes is None:
            if len(cache) >= _NODE_CACHE_LIMIT:
                cache.clear()
            nodes = cache[nodelist] = expand_nodes(nodelist)
        return nodes

    def _flush_nodelists(self) -> None:
        for nodelist, (jobs, seconds) in self._per_nodelist.items():
            for node in expand_nodes(nodelist):
                tally = self.nodes.get(node)
                if tally is None:
                    tally = self.nodes[node] = NodeTally()
                tally.jobs += jobs
                tally.node_seconds += seconds
        self._per_nodelist.clear()

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
        loss = (gpu_seconds, row[I_JOBID], job_name(row), row[I_USER], culprit_text, verdict.cause)
        if len(self.losses) < TOP_LOSSES:
            heapq.heappush(self.losses, loss)
        elif loss > self.losses[0]:
            heapq.heapreplace(self.losses, loss)

    # -- node events (drains) --------------------------------------------------------------
    def add_drain(self, node: str, ours: bool) -> None:
        tally = self.nodes.get(node)
        if tally is None:
            tally = self.nodes[node] = NodeTally()
        tally.drains += 1
        if ours:
            tally.drains_ours += 1
        self.drain_events += 1
