"""The whole run's deadline, as the commands of the run see it (``programs.run``/``stream``).

``hooklib/watchdog.whole_run`` sets it for a hook's run; every command the run then starts is
given at most the time left, less the reserve the run keeps to save what it did (``within``).
Outside such a run (``slurm-gpu``, the lab, tests) nothing is cut. Its own module, importing
nothing but ``time``: the watchdog is on the TaskProlog's import path, which loads no subprocess.
"""
from __future__ import annotations

import time
from typing import Optional

MIN_STEP_S = 0.1           # the least a command is given, however little time the run has left

_deadline: Optional[float] = None      # time.monotonic() at which the run's watchdog strikes
_reserve_s = 0.0


def set_deadline(deadline: Optional[float], reserve_s: float = 0.0) -> None:
    """The whole run ends at ``deadline`` (monotonic; None: no run deadline): no command started
    from now on is given more than the time left, less ``reserve_s``."""
    global _deadline, _reserve_s
    _deadline, _reserve_s = deadline, max(0.0, float(reserve_s))


def within(timeout_s: float) -> float:
    """``timeout_s``, cut to what the whole run has left less its reserve (never below
    MIN_STEP_S): a step that would outlast the run ends first, as its own one-line failure, and
    the run still saves what it did before its watchdog strikes (issue 34: a GPU reset's 20 s,
    not cut, let the deadline strike between our drain and its record)."""
    if _deadline is None:
        return timeout_s
    return max(MIN_STEP_S, min(float(timeout_s), _deadline - time.monotonic() - _reserve_s))
