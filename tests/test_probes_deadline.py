"""Deadlines are enforced from outside the call: a child that never answers costs the
caller the deadline plus a small margin, and nothing after."""
from __future__ import annotations

import os
import time

from healthcheck.probes.deadline import call_with_deadline, run_with_deadline
from healthcheck.probes.nvml import probe_nvml
from healthcheck.sim.node import SimNode

from .checks_support import LONE_HANG_TIMEOUT_S, sim

DEADLINE_S = 1.0
MARGIN_S = 3.0      # a correctness bound (fork, pipe, kill), not a benchmark


def test_a_value_comes_back():
    outcome = call_with_deadline(lambda: {"answer": 42}, 5.0)
    assert outcome.finished and outcome.records == [{"answer": 42}] and not outcome.timed_out


def test_an_exception_in_the_child_comes_back_as_text():
    def boom():
        raise RuntimeError("driver said no")

    outcome = call_with_deadline(boom, 5.0)
    assert outcome.error == "RuntimeError: driver said no" and not outcome.timed_out


def test_a_child_that_dies_silently_is_an_error_not_a_wait():
    outcome = run_with_deadline(lambda emit: os._exit(7), 5.0)
    assert outcome.error and not outcome.timed_out and outcome.elapsed_s < 5.0


def test_a_child_that_never_answers_is_killed_at_the_deadline():
    pids = []

    def stuck(emit):
        emit(os.getpid())
        emit("partial")
        time.sleep(60)

    started = time.monotonic()
    outcome = run_with_deadline(stuck, DEADLINE_S)
    elapsed = time.monotonic() - started
    pids.extend(r for r in outcome.records if isinstance(r, int))
    assert outcome.timed_out and outcome.records[1:] == ["partial"]
    assert elapsed < DEADLINE_S + MARGIN_S
    time.sleep(0.05)
    try:
        os.kill(pids[0], 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, "the stuck child must be gone (killed and reaped)"


def test_hanging_nvml_yields_a_timeout_within_the_deadline(tmp_path):
    sources = sim(tmp_path, "h100-nvml-hang.toml")
    started = time.monotonic()
    facts = probe_nvml(sources.nvml, DEADLINE_S)
    assert time.monotonic() - started < DEADLINE_S + MARGIN_S
    assert facts.status == "timeout" and facts.gpus == []


def test_one_hanging_gpu_does_not_hide_the_others(tmp_path):
    sources = sim(tmp_path, "h100-gpu-hang.toml")
    SimNode(str(tmp_path), "n1").inject([("gpu.2.ecc.volatile_uncorrected", 1)])
    started = time.monotonic()
    facts = probe_nvml(sources.nvml, LONE_HANG_TIMEOUT_S)
    assert time.monotonic() - started < LONE_HANG_TIMEOUT_S + MARGIN_S
    assert facts.status == "ok"
    assert [g.state for g in facts.gpus] == ["ok"] * 5 + ["hang"] + ["ok"] * 2
    assert facts.gpus[2].ecc["volatile_uncorrected"] == 1


def test_a_probe_that_cannot_fork_is_an_error(monkeypatch):
    def no_fork():
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    outcome = call_with_deadline(lambda: 1, 5.0)
    assert outcome.error == "cannot start the probe process: Resource temporarily unavailable"


def test_a_child_that_answered_is_reaped_by_the_next_probe():
    """The caller does not wait for an answered child's exit; the next probe's start reaps it
    (no zombie is left behind a long-lived caller)."""
    first = call_with_deadline(os.getpid, 5.0)
    pid = first.records[0]
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # until it has exited; not reaped by this
    except ChildProcessError:
        pass                                                # it was gone before wait() returned
    assert call_with_deadline(lambda: 1, 5.0).finished
    try:
        os.waitpid(pid, os.WNOHANG)
        reaped = False
    except ChildProcessError:
        reaped = True
    assert reaped, "the answered child must have been reaped"
