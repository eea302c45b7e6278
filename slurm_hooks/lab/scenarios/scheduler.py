"""Which scenarios may run at the same time, and the loop that runs them so.

The rules are pure functions over ``Holds`` (what the running scenarios hold of each node),
so they are tested without a lab:

* an ``exclusive`` scenario has its nodes to itself;
* two fault scenarios never share a node (they would inject into one simulator);
* scenarios start in table order, and none overtakes an earlier one that wants a node it
  shares in a conflicting way (so the slow TIMEOUT row, listed first, starts first).

``run_table`` is the only impure part: one thread per running scenario, polling.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

from .results import JobResult
from .table import Scenario


@dataclass(frozen=True)
class NodeHold:
    exclusive: bool = False   # an exclusive scenario runs on it
    shared: int = 0           # how many non-exclusive scenarios run on it
    sim: bool = False         # a fault scenario injects into its simulator


Holds = Dict[str, NodeHold]


def no_holds(nodes: Iterable[str]) -> Holds:
    return {node: NodeHold() for node in nodes}


def conflicts(a: Scenario, b: Scenario) -> bool:
    """Whether two scenarios may never run at the same time."""
    shared = set(a.nodes) & set(b.nodes)
    return bool(shared) and (a.exclusive or b.exclusive or (a.uses_sim and b.uses_sim))


def fits(scenario: Scenario, holds: Holds) -> bool:
    """Whether ``scenario`` may start next to what already runs."""
    for node in scenario.nodes:
        hold = holds.get(node, NodeHold())
        if hold.exclusive:
            return False
        if scenario.exclusive and (hold.shared or hold.sim):
            return False
        if scenario.uses_sim and hold.sim:
            return False
    return True


def take(holds: Holds, scenario: Scenario) -> Holds:
    """The holds once ``scenario`` runs."""
    out = dict(holds)
    for node in scenario.nodes:
        hold = out.get(node, NodeHold())
        if scenario.exclusive:
            hold = replace(hold, exclusive=True)
        else:
            hold = replace(hold, shared=hold.shared + 1)
        if scenario.uses_sim:
            hold = replace(hold, sim=True)
        out[node] = hold
    return out


def release(holds: Holds, scenario: Scenario) -> Holds:
    """The holds once ``scenario`` has finished."""
    out = dict(holds)
    for node in scenario.nodes:
        hold = out.get(node, NodeHold())
        if scenario.exclusive:
            hold = replace(hold, exclusive=False)
        else:
            hold = replace(hold, shared=max(0, hold.shared - 1))
        if scenario.uses_sim:
            hold = replace(hold, sim=False)
        out[node] = hold
    return out


def startable(pending: Sequence[Scenario], holds: Holds) -> Tuple[List[Scenario], Holds]:
    """The pending scenarios to start now (in table order) and the holds after starting them.

    A scenario starts when it fits and no earlier scenario still waiting conflicts with it."""
    start: List[Scenario] = []
    waiting: List[Scenario] = []
    for scenario in pending:
        if fits(scenario, holds) and not any(conflicts(scenario, earlier) for earlier in waiting):
            holds = take(holds, scenario)
            start.append(scenario)
        else:
            waiting.append(scenario)
    return start, holds


def run_table(table: Sequence[Scenario], nodes: Iterable[str], drive: Callable[[Scenario], List[JobResult]],
              echo: Callable[[str], None], deadline: float, poll: float = 0.2) -> List[JobResult]:
    """Run every scenario through ``drive`` as the rules allow; results in table order.

    ``deadline`` is a ``time.monotonic()`` instant: scenarios not started 30 s after it are
    reported as not started, and ones still running as not finished."""
    results: Dict[str, List[JobResult]] = {}
    pending = list(table)
    running: Dict[str, threading.Thread] = {}
    holds = no_holds(nodes)
    by_name = {s.name: s for s in table}

    def worker(scenario: Scenario) -> None:
        try:
            results[scenario.name] = drive(scenario)
        except Exception as exc:  # a bug must not hang the run: report it on the row
            failed = JobResult(scenario.name, "job", scenario.expect_state)
            failed.problems.append(f"{type(exc).__name__}: {exc}")
            results[scenario.name] = [failed]

    while pending or running:
        start, holds = startable(pending, holds)
        for scenario in start:
            pending.remove(scenario)
            echo(f"{scenario.name}: start ({scenario.title})")
            thread = threading.Thread(target=worker, args=(scenario,), daemon=True,
                                      name=f"scenario-{scenario.name}")
            running[scenario.name] = thread
            thread.start()
        for name, thread in list(running.items()):
            if not thread.is_alive():
                del running[name]
                holds = release(holds, by_name[name])
                for result in results.get(name, []):
                    echo(f"{name}: job {result.job_id or '-'} {result.role}: "
                         f"{result.state or '-'}{' ' + result.note if result.note else ''}"
                         f" ({'as expected' if result.ok else '; '.join(result.problems)})")
        if time.monotonic() > deadline + 30:
            for scenario in pending:
                late = JobResult(scenario.name, "job", scenario.expect_state)
                late.problems.append("not started: the run's --timeout passed")
                results[scenario.name] = [late]
            pending = []
            if running:
                echo(f"still running after the timeout: {', '.join(running)}")
                for name in running:
                    late = JobResult(name, "job", by_name[name].expect_state)
                    late.problems.append("did not finish before the run's --timeout")
                    results.setdefault(name, [late])
                break
        time.sleep(poll)
    return [r for s in table for r in results.get(s.name, [])]
