"""Read, act, then commit: the kernel-log cursor and counter samples are saved only when the
caller commits; the runner gives back the facts it gathered, extra reads included."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from healthcheck.kernellog.api import read_new_events
from healthcheck.runner import BASELINE_READS, run_checks
from healthcheck.sim.node import SimNode

from .checks_support import hardware_for, make_config, sim
from .conftest import ROOT

STAMP = time.strftime("%b %d %H:%M:%S", time.localtime(time.time()))
XID48 = STAMP + " gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=77, name=python, DBE (0x0000000b).\n"
XID79 = "[ 9000.000001] NVRM: Xid (PCI:0000:9a:00): 79, pid=77, name=python, GPU has fallen off the bus."


def codes(read):
    return [event.code for event in read.events]


def test_events_read_and_not_committed_come_back(tmp_path):
    log, state = tmp_path / "kern.log", str(tmp_path / "state")
    log.write_text(XID48)
    assert codes(read_new_events(str(log), state, "gpu1")) == [48]
    again = read_new_events(str(log), state, "gpu1")
    assert codes(again) == [48]                          # nothing was saved by reading
    again.commit()
    assert codes(read_new_events(str(log), state, "gpu1")) == []
    with open(log, "a") as handle:
        handle.write(XID48.replace("48, pid=77", "48, pid=78"))
    after = read_new_events(str(log), state, "gpu1")
    assert [(e.code, e.count_new) for e in after.events] == [(48, 1)]   # only the new line


def test_a_reader_killed_between_read_and_commit_loses_nothing(tmp_path):
    log, state = tmp_path / "kern.log", str(tmp_path / "state")
    log.write_text(XID48)
    # A first run commits a cursor, so the killed one starts from a real cursor, not a rescan.
    read_new_events(str(log), state, "gpu1").commit()
    with open(log, "a") as handle:
        handle.write(XID48.replace("pid=77", "pid=99").replace(": 48,", ": 79,"))
    reader = ("import sys, time\n"
              "from healthcheck.kernellog.api import read_new_events\n"
              "read = read_new_events(sys.argv[1], sys.argv[2], 'gpu1')\n"
              "print('read', [e.code for e in read.events], flush=True)\n"
              "time.sleep(60)\n"
              "read.commit()\n")
    child = subprocess.Popen([sys.executable, "-c", reader, str(log), state], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert child.stdout.readline().strip() == "read [79]"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()
    assert codes(read_new_events(str(log), state, "gpu1")) == [79]


def test_commit_of_a_one_shot_scan_is_harmless(tmp_path):
    from healthcheck.kernellog.api import scan_events

    log = tmp_path / "kern.log"
    log.write_text(XID48)
    scan = scan_events(str(log))
    scan.commit()                                       # nothing to save: no cursor is involved
    assert not (tmp_path / "state").exists() and codes(scan) == [48]


def _kernel_config(state):
    return make_config(hardware=hardware_for("H100"), state_dir=str(state), tiers={"health": ["kernel.xid"]})


def test_run_checks_saves_nothing_until_the_caller_commits(tmp_path):
    state = tmp_path / "state"
    cfg = _kernel_config(state)
    path = "h100-healthy.toml"
    run_checks(cfg, "n1", "health", sources=sim(state, path), commit=True)
    SimNode(str(state), "n1").inject([], [XID79])
    first = run_checks(cfg, "n1", "health", sources=sim(state, path))
    assert [f.evidence["code"] for f in first.findings] == [79]
    # The hook died before acting: the next run judges the same Xid again.
    second = run_checks(cfg, "n1", "health", sources=sim(state, path))
    assert [f.evidence["code"] for f in second.findings] == [79]
    assert second.commit() == []
    assert second.commit() == []                        # a second commit saves nothing more
    assert run_checks(cfg, "n1", "health", sources=sim(state, path)).findings == []


def test_counter_samples_are_saved_by_the_commit(tmp_path):
    state = tmp_path / "state"
    cfg = make_config(hardware=hardware_for("H100"), state_dir=str(state), tiers={"health": ["ib.counters"]})
    report = run_checks(cfg, "n1", "health", sources=sim(state, "h100-healthy.toml"), now=1_000_000.0)
    history = state / "counters" / "n1.json"
    assert not history.exists()
    assert report.commit() == []
    assert history.exists()
    assert report.facts.history == {}                   # what the checks saw: nothing yet


def test_a_commit_that_cannot_save_says_so_and_the_lines_come_back(tmp_path):
    state = tmp_path / "state"
    cfg = _kernel_config(state)
    run_checks(cfg, "n1", "health", sources=sim(state, "h100-healthy.toml"), commit=True)
    SimNode(str(state), "n1").inject([], [XID79])
    report = run_checks(cfg, "n1", "health", sources=sim(state, "h100-healthy.toml"))
    store = report.facts.kernel.read.pending.store.dir
    os.rename(store, store + ".away")
    with open(store, "w") as blocker:                   # the state dir's place taken by a file
        blocker.write("x")
    [problem] = report.commit()
    assert problem.check == "probe.error" and "kernel-log cursor not saved" in problem.message
    report.add([problem])
    assert report.status == "error"
    os.unlink(store)
    os.rename(store + ".away", store)
    again = run_checks(cfg, "n1", "health", sources=sim(state, "h100-healthy.toml"))
    assert [f.evidence["code"] for f in again.findings] == [79]


def test_extra_reads_come_back_as_facts_with_minor_numbers(tmp_path):
    state = tmp_path / "state"
    cfg = make_config(hardware=hardware_for("H100"), state_dir=str(state), tiers={"prolog": ["gpu.count"]})
    sources = sim(state, "h100-healthy.toml")
    SimNode(str(state), "n1").inject([("gpu.2.state", "absent"), ("gpu.6.minor_number", 42)])
    plain = run_checks(cfg, "n1", "prolog", sources=sources)
    assert plain.facts.nvml.gpus[0].ecc == {} and plain.facts.ib is None
    report = run_checks(cfg, "n1", "prolog", gpus=[0, 1, 5], sources=sources, extra_reads=BASELINE_READS)
    gpus = report.facts.nvml.gpus
    # NVML index -> /dev/nvidiaN: the absent GPU 2 leaves a gap; the profile overrode GPU 6's.
    assert [(g.index, g.minor_number) for g in gpus] == [(0, 0), (1, 1), (5, 42)]
    assert all(g.uuid and g.pci_bus_id for g in gpus)
    assert gpus[0].ecc["volatile_uncorrected"] == 0 and gpus[0].remapped_rows is not None
    assert gpus[0].nvlink_errors and len(report.facts.ib.ports) == 8
    assert report.to_json().keys() == {"node", "status", "findings", "duration_ms"}


def test_an_unknown_extra_read_is_refused(tmp_path):
    cfg = make_config(state_dir=str(tmp_path))
    for bad in ("nvml:nope", "dcgm", "ib:counters", "smart"):
        with pytest.raises(ValueError, match="unknown extra read"):
            run_checks(cfg, "n1", "prolog", sources=sim(tmp_path, "h100-healthy.toml"), extra_reads=[bad])


def test_commit_never_raises(tmp_path):
    """A bug or an absurd counter while saving is a finding, not an exception in the hook."""
    from healthcheck.runner import Report

    def broken():
        raise ZeroDivisionError("oops")

    report = Report(node="n1", status="ok", pending=[broken, lambda: None])
    [problem] = report.commit()
    assert (problem.check, problem.status, problem.action) == ("check.error", "error", "none")
    assert "ZeroDivisionError: oops" in problem.message and report.commit() == []


def test_a_counter_too_big_for_a_float_does_not_break_the_commit(tmp_path):
    state = tmp_path / "state"
    cfg = make_config(hardware=hardware_for("H100"), state_dir=str(state), tiers={"health": ["ib.counters"]})
    sources = sim(state, "h100-healthy.toml")
    counters = state / "sim" / "n1" / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    (counters / "symbol_error").write_text("1" + "0" * 400 + "\n")
    report = run_checks(cfg, "n1", "health", sources=sources)
    problems = report.commit()
    assert all(p.check in ("probe.error", "check.error") for p in problems)
    from healthcheck.counters.history import CounterHistory

    assert isinstance(CounterHistory(str(state), "n1").load(), dict)   # still readable afterwards
