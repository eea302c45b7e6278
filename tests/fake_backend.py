"""FakeBackend: the SlurmBackend interface over state held in memory, for unit tests of
decisions and of the edges that apply them. It records every call, and it can be told to fail
like an unreachable slurmctld. It is no proof that a hook works with Slurm: tests/lab is.

Node state follows what Slurm 22.05 does (measured on the lab): a drain adds DRAIN and sets
the reason with the caller's name; a resume clears DRAIN, DOWN and FAIL and the reason.
"""
from __future__ import annotations

import copy
import time
from typing import Dict, Iterable, List, Optional, Tuple

from healthcheck.slurm.backend import JobInfo, NodeInfo, SlurmError, drain_argv, extra_argv, reboot_argv, resume_argv


class FakeBackend:
    def __init__(self, nodes: Iterable[NodeInfo] = (), jobs: Iterable[JobInfo] = (), user: str = "root"):
        self._nodes: Dict[str, NodeInfo] = {node.name: copy.deepcopy(node) for node in nodes}
        self._jobs: Dict[str, JobInfo] = {job.job_id: copy.deepcopy(job) for job in jobs}
        self.accounting_rows: List[Dict[str, str]] = []
        self.user = user
        self.calls: List[Tuple[str, ...]] = []        # ("node", "gpu1"), ("drain", "gpu1", reason), ...
        self.unreachable: Optional[str] = None         # set: every call raises SlurmError with it
        self.now: Optional[float] = None               # the clock drains are stamped with (None: real time)
        self._drained_before_reboot: Dict[str, bool] = {}

    # -- test helpers --------------------------------------------------------------------------
    def add_node(self, name: str, state: str = "IDLE", reason: str = "", reason_user: str = "") -> NodeInfo:
        self._nodes[name] = NodeInfo(name=name, state=state, reason=reason,
                                     reason_user=reason_user or (self.user if reason else ""))
        return self._nodes[name]

    def writes(self) -> List[Tuple[str, ...]]:
        """The calls that change Slurm (drain, resume, set_admin_comment), in order."""
        return [call for call in self.calls if call[0] in ("drain", "resume", "reboot", "set_extra", "set_admin_comment")]

    def scontrol_argvs(self) -> List[Tuple[str, ...]]:
        """The scontrol arguments the real backend would have run for this fake's writes."""
        out = []
        for call in self.calls:
            if call[0] == "drain":
                out.append(drain_argv(call[1], call[2]))
            elif call[0] == "resume":
                out.append(resume_argv(call[1]))
            elif call[0] == "reboot":
                out.append(reboot_argv(call[1], call[2]))
            elif call[0] == "set_extra":
                out.append(extra_argv(call[1], call[2]))
        return out

    # -- the interface ---------------------------------------------------------------------------
    def _call(self, *call: str) -> None:
        self.calls.append(call)
        if self.unreachable is not None:
            raise SlurmError(self.unreachable)

    def _known(self, name: str) -> NodeInfo:
        if name not in self._nodes:
            raise SlurmError(f"scontrol show node {name}: no such node")
        return self._nodes[name]

    def node(self, name: str) -> NodeInfo:
        self._call("node", name)
        return copy.deepcopy(self._known(name))

    def nodes(self) -> List[NodeInfo]:
        self._call("nodes")
        return [copy.deepcopy(node) for node in self._nodes.values()]

    def sinfo_nodes(self) -> List[NodeInfo]:
        self._call("sinfo_nodes")
        return [copy.deepcopy(node) for node in self._nodes.values()]

    def drain(self, name: str, reason: str) -> None:
        self._call("drain", name, reason)
        node = self._known(name)
        if not node.drained:
            node.state = "+".join(node.state.split("+") + ["DRAIN"])
        node.reason, node.reason_user = reason, self.user
        node.reason_epoch = self.now if self.now is not None else time.time()

    def resume(self, name: str) -> None:
        self._call("resume", name)
        node = self._known(name)
        kept = [flag for flag in node.state.split("+") if flag not in ("DRAIN", "DRAINED", "DRAINING", "FAIL")]
        if kept and kept[0] == "DOWN":
            kept[0] = "IDLE"
        node.state = "+".join(kept) or "IDLE"
        node.reason = node.reason_user = node.reason_time = ""
        node.reason_epoch = None

    def reboot(self, name: str, reason: str) -> None:
        """``scontrol reboot ASAP reason=...``: Slurm drains the node with the reason and flags the
        reboot (it happens once the node is idle; ``finish_reboot``)."""
        self._call("reboot", name, reason)
        node = self._known(name)
        flags = node.state.split("+")
        self._drained_before_reboot[name] = any(flag in ("DRAIN", "DRAINED", "DRAINING") for flag in flags)
        flags += [flag for flag in ("DRAIN", "REBOOT_REQUESTED") if flag not in flags]
        node.state = "+".join(flags)
        node.reason, node.reason_user = reason, self.user
        node.reason_epoch = self.now if self.now is not None else time.time()

    def set_extra(self, name: str, text: str) -> None:
        """``scontrol update nodename=N extra=TEXT``: Slurm keeps it across reboots (``finish_reboot``
        leaves it)."""
        self._call("set_extra", name, text)
        self._known(name).extra = text

    def finish_reboot(self, name: str, drain_survives: bool = True) -> None:
        """A test helper: the node came back from its reboot (no ``nextstate`` asked). As measured
        in the lab: on 24.11 and 26.05 (``drain_survives``) a node drained before the reboot
        registers IDLE+DRAIN, its reason followed by Slurm's " : reboot issued"; on 22.05, and for
        a node only the reboot drained, it is IDLE, in service."""
        node = self._known(name)
        # A new BootTime, after the reason the reboot set (Slurm's clock is in whole seconds).
        node.boot_epoch = max(self.now if self.now is not None else time.time(), (node.reason_epoch or 0.0) + 1.0)
        if drain_survives and self._drained_before_reboot.pop(name, False):
            node.state, node.reason = "IDLE+DRAIN", node.reason + " : reboot issued"
            return
        node.state, node.reason, node.reason_user, node.reason_epoch = "IDLE", "", "", None

    def job(self, job_id: str) -> Optional[JobInfo]:
        self._call("job", str(job_id))
        job = self._jobs.get(str(job_id))
        return copy.deepcopy(job) if job is not None else None

    def set_admin_comment(self, job_id: str, text: str) -> None:
        self._call("set_admin_comment", str(job_id), text)
        job = self._jobs.setdefault(str(job_id), JobInfo(str(job_id), {}))
        job.fields["AdminComment"] = text

    def accounting(self, job_ids: List[str], fields: List[str], every_incarnation: bool = False) -> List[Dict[str, str]]:
        self._call("accounting", ",".join(str(j) for j in job_ids))
        wanted = {str(j) for j in job_ids}
        return [{key: row.get(key, "") for key in fields} for row in self.accounting_rows
                if not wanted or row.get("JobID", "").split("_")[0].split(".")[0] in wanted
                or row.get("JobID") in wanted or row.get("JobIDRaw") in wanted]

    def expand_hostlist(self, expression: str) -> List[str]:
        import hostlist

        return hostlist.expand_hostlist(expression)


class AccountedBackend(FakeBackend):
    """A FakeBackend whose accounting rows (``accounting_rows``, by JobIDRaw) take the AdminComment
    sacctmgr writes, as slurmdbd shows it back (``as_stored_by_sacctmgr``)."""

    def set_admin_comment(self, job_id: str, text: str) -> None:
        from healthcheck.records import admin_comment

        super().set_admin_comment(job_id, text)
        for row in self.accounting_rows:
            if row["JobIDRaw"] == job_id:
                row["AdminComment"] = admin_comment.as_stored_by_sacctmgr(text)
