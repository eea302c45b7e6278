"""What ``slurm-gpu-watch`` decides on its own, which is only *when*: when to start the health
check, and when to look at the kernel log again. Whether the node drains is the health
check's decision, never the watcher's. Pure: no clock, no I/O (callers pass ``now``).

* ``wants_check(findings)``: the reader's findings for the lines new since the watcher's
  last look hold one whose action is a drain (the catalog's action, with ``[xid] actions``,
  ``[actions] "kernel.xid"``, escalation and the before-the-boot rule applied by the same
  code the health check uses).
* ``Trigger``: one triggered run at a time, runs at least ``min_interval_s`` apart; requests
  while a run goes on or inside the interval fold into one run when it is allowed. Under an
  Xid flood the watcher starts at most one health check per interval, however many lines.
* ``DutyCycle``: the watcher's own reads take at most ``max_cpu`` of one core: after a look
  that took ``spent`` seconds, the next waits at least ``spent * (1 - max_cpu) / max_cpu``.
* ``AfterBoot``: after a boot that a drain of ours waits for, runs until one has judged the
  node as Slurm has it back (the remediation's reboot: the node back in service in seconds,
  not at the next HealthCheckInterval).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple


def wants_check(findings: Iterable[Any]) -> bool:
    """Whether any finding asks for a drain (the health check then decides)."""
    return any(getattr(finding, "action", None) == "drain" for finding in findings)


class Trigger:
    """Requests in, runs out: at most one run at a time, starts ``min_interval_s`` apart."""

    def __init__(self, min_interval_s: float):
        self.min_interval_s = max(0.0, float(min_interval_s))
        self.pending = False            # a run is wanted and not started yet
        self.running = False
        self.last_start: Optional[float] = None
        self.requests = 0               # every request
        self.runs = 0                   # runs started

    def request(self, now: float) -> None:
        """Something new asks for a health check."""
        self.requests += 1
        self.pending = True

    @property
    def folded(self) -> int:
        """Requests that did not start a run of their own (nor will: one pending counts as its run)."""
        return self.requests - self.runs - (1 if self.pending else 0)

    def wait_s(self, now: float) -> Optional[float]:
        """Seconds until a pending run may start (0: now); None: nothing pending, or a run
        is going on (it is started when that one has finished and the interval passed)."""
        if not self.pending or self.running:
            return None
        if self.last_start is None:
            return 0.0
        return max(0.0, self.last_start + self.min_interval_s - now)

    def due(self, now: float) -> bool:
        return self.wait_s(now) == 0.0

    def started(self, now: float) -> None:
        self.pending = False
        self.running = True
        self.last_start = now
        self.runs += 1

    def finished(self, now: float) -> None:
        self.running = False


class DutyCycle:
    """How long to wait before the next look at the log, so that reading it takes at most
    ``max_cpu`` of one core whatever the log does (a flood of Xid lines is read in bounded
    slices, ``[xid] read_budget_bytes`` each, with pauses between them)."""

    def __init__(self, max_cpu: float, poll_s: float):
        self.max_cpu = min(1.0, max(0.001, float(max_cpu)))
        self.poll_s = max(0.0, float(poll_s))

    def pause_after(self, spent: float) -> float:
        """Seconds from the end of a look that took ``spent`` seconds to the next look."""
        spent = max(0.0, spent)
        return max(self.poll_s, spent * (1.0 - self.max_cpu) / self.max_cpu)


class Seen:
    """The drain-asking events the watcher already started a run for, so that a flood of one
    Xid starts one run (and again only after ``repeat_s``), while a stronger action for it
    (an escalation) or another GPU or code starts a new one. Bounded: ``limit`` keys."""

    def __init__(self, repeat_s: float = 60.0, limit: int = 4096):
        self.repeat_s = float(repeat_s)
        self.limit = int(limit)
        self._seen: "dict" = {}         # key -> (rank, when)

    def new(self, key: Any, rank: int, now: float) -> bool:
        """Whether ``key`` at ``rank`` is worth a run now; remembers it when it is."""
        before = self._seen.get(key)
        if before is not None and rank <= before[0] and now - before[1] < self.repeat_s:
            return False
        if before is None and len(self._seen) >= self.limit:
            self._seen.clear()
        self._seen[key] = (rank, now)
        return True

    def forget(self) -> None:
        """A new boot: what was seen before it says nothing about now."""
        self._seen.clear()

    def __len__(self) -> int:
        return len(self._seen)


# The health check's judgements that say Slurm had not taken the node back yet: Slurm still
# shows the reboot (the node has not registered), or could not be asked.
NOT_JUDGED_YET = ("slurm-busy", "slurm-unreachable-healthy", "slurm-unreachable-fault")
# The runs after a boot are at least this far apart, whatever [watch] min_interval_s says (0 is
# allowed, for a run at once on each new Xid): each asks slurmctld about the node, and while Slurm
# still shows the reboot every run is "not judged yet" (issue 34: min_interval_s = 0 made 84
# health checks, one scontrol each, in 30 s). Five seconds is min_interval_s's default.
AFTER_BOOT_EVERY_MIN_S = 5.0


def after_boot_every(min_interval_s: float) -> float:
    """How far apart the runs after a boot are: ``[watch] min_interval_s``, at least
    ``AFTER_BOOT_EVERY_MIN_S``."""
    return max(AFTER_BOOT_EVERY_MIN_S, float(min_interval_s))


class AfterBoot:
    """After a boot while a drain of ours waits for one (a reboot the remediation asked): health
    checks until one has judged the node as Slurm has it back, instead of the node waiting for
    the next HealthCheckInterval. From Slurm 24.11 our drain outlives the reboot (no nextstate:
    docs/remediation.md), so the node is out of service until such a run resumes it; slurmd's
    own run at its start comes before the node registers and judges nothing (``slurm-busy``).

    Pure: the watcher says when a boot began with such a drain (``begin``) and hands in the
    health check's last result (its time and rule); ``wants_run`` says whether to ask for
    another run, at most one per ``every_s`` (``after_boot_every``: ``min_interval_s``, never
    below ``AFTER_BOOT_EVERY_MIN_S``). Ends at the first run judged
    after the boot began, or ``limit_s`` after it (Slurm's ResumeTimeout sets a node that never
    registers DOWN: Slurm's then)."""

    def __init__(self, limit_s: float, every_s: float = 0.0):
        self.limit_s = max(0.0, float(limit_s))
        self.every_s = max(0.0, float(every_s))     # the runs it asks for, at least this far apart
        self.until: Optional[float] = None      # monotonic; None: not following a boot
        self.since: float = 0.0                  # wall clock of the boot's start as seen here
        self.asked: Optional[float] = None      # monotonic: when it last asked for a run
        self.runs = 0                            # runs asked for since the boot began

    def begin(self, now: float, wall: float) -> None:
        if self.limit_s > 0:
            self.until, self.since, self.asked, self.runs = now + self.limit_s, wall, None, 0

    @property
    def active(self) -> bool:
        return self.until is not None

    def wants_run(self, now: float, last: Optional[Tuple[float, str]]) -> bool:
        """``last``: (wall time, rule) of the health check's last result, or None."""
        if self.until is None:
            return False
        judged = last is not None and last[0] >= self.since and last[1] not in NOT_JUDGED_YET
        if judged or now >= self.until:
            self.until = None
            return False
        if self.asked is not None and now - self.asked < self.every_s:
            return False
        self.asked = now
        self.runs += 1
        return True
