"""The stand-by probe child (healthcheck/probes/standby.py): forked at a hook's start, it runs
the probe handed to it, under the same deadline and kill as any probe child, and goes away
when the hook ends without needing it."""
from __future__ import annotations

import os
import time

from healthcheck.probes import standby
from healthcheck.probes.deadline import ChildProbe, reap_answered
from healthcheck.probes.nvml import probe_nvml

from .checks_support import sim


def answer(value, emit):
    emit(("pid", os.getpid()))
    emit(value)


def stuck(emit):
    emit(("pid", os.getpid()))
    time.sleep(60)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_probe_handed_over_runs_in_the_standby_child():
    with standby.standby(preload=()):
        [ready] = standby._READY
        pid = ready[0]
        probe = ChildProbe(lambda emit: emit("forked"), 5.0, remote=(__name__, "answer", (42,))).start()
        outcome = probe.wait()
        assert standby._READY == []
    assert outcome.finished and outcome.records == [("pid", pid), 42]


def test_nvml_from_a_lazy_binding_goes_to_the_standby_child(tmp_path):
    sources = sim(tmp_path, "h100-healthy.toml")
    with standby.standby():
        pid = standby._READY[0][0]
        facts = probe_nvml(sources.nvml, 10.0)
        assert standby._READY == []
    assert facts.status == "ok" and len(facts.gpus) == 8
    assert facts.gpus[0].uuid.startswith("GPU-") and pid > 0


def test_a_standby_child_past_its_deadline_is_killed():
    started = time.monotonic()
    with standby.standby(preload=()):
        outcome = ChildProbe(lambda emit: None, 1.0, remote=(__name__, "stuck", ())).start().wait()
    assert outcome.timed_out and time.monotonic() - started < 4.0       # a correctness bound
    pid = outcome.records[0][1]
    time.sleep(0.05)
    assert _gone(pid) or os.waitpid(pid, os.WNOHANG)[0] == pid, "the stuck child must be killed"


def test_an_unused_standby_child_goes_when_the_hook_ends():
    with standby.standby(preload=()):
        pid = standby._READY[0][0]
    assert standby._READY == []
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)       # it leaves on its own
    except ChildProcessError:
        pass
    reap_answered()
    try:
        os.waitpid(pid, os.WNOHANG)
        reaped = False
    except ChildProcessError:
        reaped = True
    assert reaped


def test_without_a_standby_child_a_probe_forks_its_own():
    assert standby._READY == []
    outcome = ChildProbe(lambda emit: emit("forked"), 5.0, remote=(__name__, "answer", (42,))).start().wait()
    assert outcome.records == ["forked"]
