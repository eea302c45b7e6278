"""The scenario scheduler's node-conflict rules, and the loop that applies them, without a lab."""
from __future__ import annotations

import threading
import time

from slurm_hooks.lab.scenarios.results import JobResult
from slurm_hooks.lab.scenarios.scheduler import (NodeHold, conflicts, fits, no_holds, release, run_table,
                                                 startable, take)
from slurm_hooks.lab.scenarios.table import Scenario

NODES = ("gpu1", "gpu2", "gpu3")


def sc(name, nodes=("gpu1",), kind="simple", exclusive=False):
    return Scenario(name=name, title=name, kind=kind, nodes=tuple(nodes), payload=("hello",),
                    expect={"state": "COMPLETED"}, exclusive=exclusive,
                    inject=("gpu.0.state=lost",) if kind == "fault" else ())


def test_conflicts():
    plain, other = sc("a"), sc("b")
    excl = sc("x", exclusive=True)
    fault1, fault2 = sc("f1", kind="fault"), sc("f2", kind="fault")
    assert not conflicts(plain, other)                      # two plain jobs share a node
    assert conflicts(excl, plain) and conflicts(plain, excl)
    assert conflicts(fault1, fault2)                        # one simulator per node
    assert not conflicts(fault1, plain)
    assert not conflicts(sc("e1", ("gpu1",), exclusive=True), sc("e2", ("gpu2",), exclusive=True))
    assert conflicts(sc("three", NODES), sc("e", ("gpu3",), exclusive=True))


def test_fits_against_holds():
    holds = no_holds(NODES)
    assert all(fits(s, holds) for s in (sc("a"), sc("x", exclusive=True), sc("f", kind="fault")))
    shared = take(holds, sc("a"))
    assert fits(sc("b"), shared) and fits(sc("f", kind="fault"), shared)
    assert not fits(sc("x", exclusive=True), shared)
    assert fits(sc("x2", ("gpu2",), exclusive=True), shared)
    excl = take(holds, sc("x", exclusive=True))
    assert not fits(sc("b"), excl) and not fits(sc("three", NODES), excl)
    sim = take(holds, sc("f", kind="fault"))
    assert not fits(sc("g", kind="fault"), sim) and fits(sc("b"), sim)
    assert not fits(sc("x", exclusive=True), sim)


def test_take_and_release_are_pure_and_undo_each_other():
    holds = no_holds(NODES)
    three, fault = sc("three", NODES), sc("f", kind="fault")
    held = take(take(holds, three), fault)
    assert holds == no_holds(NODES)                         # the input is not changed
    assert held["gpu1"] == NodeHold(shared=2, sim=True) and held["gpu2"] == NodeHold(shared=1)
    assert release(release(held, fault), three) == holds
    assert take(holds, sc("x", ("gpu2",), exclusive=True))["gpu2"] == NodeHold(exclusive=True)


def test_startable_keeps_table_order_and_never_overtakes():
    running = take(no_holds(NODES), sc("slow"))             # a plain job holds gpu1
    pending = [sc("excl1", ("gpu1",), exclusive=True),      # must wait for gpu1 to empty
               sc("plain1"),                                # fits, but would overtake excl1
               sc("plain2", ("gpu2",)),                     # another node: starts
               sc("fault2", ("gpu2",), kind="fault"),       # starts next to plain2
               sc("fault2b", ("gpu2",), kind="fault"),      # one simulator: waits
               sc("three", NODES)]                          # fits, but would overtake excl1
    start, holds = startable(pending, running)
    names = [s.name for s in start]
    assert names == ["plain2", "fault2"]
    assert holds["gpu2"] == NodeHold(shared=2, sim=True)
    assert holds["gpu1"] == NodeHold(shared=1)
    # Once gpu1 is empty, the exclusive one goes first and everything on gpu1 waits for it.
    later, _ = startable([s for s in pending if s.name not in names], no_holds(NODES))
    assert [s.name for s in later] == ["excl1", "fault2b"]


def test_run_table_never_runs_conflicting_scenarios_together():
    table = [sc("slow"), sc("excl", exclusive=True), sc("after"), sc("f1", ("gpu2",), kind="fault"),
             sc("f2", ("gpu2",), kind="fault"), sc("other", ("gpu3",))]
    active, overlaps, order = set(), [], []
    lock = threading.Lock()

    def drive(scenario):
        with lock:
            for name in active:
                other = next(s for s in table if s.name == name)
                if conflicts(scenario, other):
                    overlaps.append((scenario.name, name))
            active.add(scenario.name)
            order.append(scenario.name)
        time.sleep(0.05)
        with lock:
            active.discard(scenario.name)
        if scenario.name == "other":
            raise RuntimeError("a driver bug")
        return [JobResult(scenario.name, "job", "COMPLETED", job_id=scenario.name, state="COMPLETED")]

    results = run_table(table, NODES, drive, echo=lambda _m: None, deadline=time.monotonic() + 60, poll=0.01)
    assert not overlaps
    assert [r.scenario for r in results] == [s.name for s in table]
    assert order.index("slow") < order.index("excl") < order.index("after")
    assert order.index("f1") < order.index("f2")
    broken = results[-1]
    assert not broken.ok and broken.problems == ["RuntimeError: a driver bug"]


def test_run_table_reports_what_the_timeout_left():
    table = [sc("first", exclusive=True), sc("second", exclusive=True)]

    def drive(scenario):
        return [JobResult(scenario.name, "job", "COMPLETED", state="COMPLETED")]

    results = run_table(table, NODES, drive, echo=lambda _m: None, deadline=time.monotonic() - 31, poll=0.01)
    by_name = {r.scenario: r for r in results}
    assert by_name["second"].problems == ["not started: the run's --timeout passed"]
