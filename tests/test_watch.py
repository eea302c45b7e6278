"""slurm-gpu-watch: when it starts the health check (the trigger rules), that it starts it
through the HealthCheckProgram as slurmd does and decides nothing itself, that it believes
only what the kernel-log reader believes, and that an Xid flood costs it bounded reads and
one run. The lab proves the drain itself (tests/lab/test_lab_watch.py)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest

from healthcheck.config import Config
from healthcheck.config.settings import WatchSettings
from healthcheck.kernellog.scanner import CHUNK
from healthcheck.plain import replace
from healthcheck.watch import service
from healthcheck.watch.trigger import AFTER_BOOT_EVERY_MIN_S, AfterBoot, DutyCycle, Seen, Trigger, after_boot_every, wants_check

# Syslog lines written now (a line from before the running kernel booted never drains on its own).
NOW = time.strftime("%b %e %H:%M:%S")
XID79 = f"{NOW} gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID13 = (f"{NOW} gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, "
         "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address")
FORGED = f"{NOW} gpu001 alice[77]: hi kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
PROGRAM = """#!/bin/sh
env > "{out}.$$"
exit 0
"""


# -- the pure rules -----------------------------------------------------------------------------
def test_a_first_request_runs_at_once_and_later_ones_fold_into_one_run_per_interval():
    trigger = Trigger(5.0)
    assert not trigger.due(0.0) and trigger.wait_s(0.0) is None
    trigger.request(100.0)
    assert trigger.due(100.0)
    trigger.started(100.0)
    for moment in (100.1, 100.2, 101.0):            # while the run goes on
        trigger.request(moment)
    assert not trigger.due(101.0) and trigger.wait_s(101.0) is None
    trigger.finished(101.5)
    assert trigger.wait_s(101.5) == pytest.approx(3.5) and not trigger.due(104.0)
    assert trigger.due(105.0)
    trigger.started(105.0)
    trigger.finished(105.5)
    assert not trigger.due(200.0)                   # nothing new asked
    assert (trigger.requests, trigger.runs, trigger.folded) == (4, 2, 2)


def test_a_flood_of_requests_starts_at_most_one_run_per_interval():
    trigger = Trigger(5.0)
    now = 0.0
    while now < 60.0:                               # a request every 10 ms for a minute
        trigger.request(now)
        if trigger.due(now):
            trigger.started(now)
        if trigger.running and now - trigger.last_start >= 0.3:
            trigger.finished(now)                   # each run takes 0.3 s
        now = round(now + 0.01, 2)
    assert trigger.requests == 6000
    assert 11 <= trigger.runs <= 13


def test_the_duty_cycle_keeps_reads_under_their_share_of_a_core():
    duty = DutyCycle(max_cpu=0.1, poll_s=0.5)
    assert duty.pause_after(0.001) == 0.5           # a quiet log: the poll interval
    for spent in (0.1, 1.0, 10.0):
        pause = duty.pause_after(spent)
        assert spent / (spent + pause) == pytest.approx(0.1)


def test_one_event_starts_one_run_a_stronger_action_or_a_new_boot_another():
    seen = Seen(repeat_s=60.0, limit=3)
    assert seen.new(("kernel.xid", 13, "0000:3b:00"), 1, 0.0)
    assert not seen.new(("kernel.xid", 13, "0000:3b:00"), 1, 10.0)
    assert seen.new(("kernel.xid", 13, "0000:3b:00"), 2, 11.0)        # escalated
    assert not seen.new(("kernel.xid", 13, "0000:3b:00"), 2, 12.0)
    assert seen.new(("kernel.xid", 13, "0000:3b:00"), 2, 80.0)        # repeat_s later
    assert seen.new(("kernel.xid", 79, "0000:3b:00"), 3, 80.0)        # another code
    seen.forget()
    assert seen.new(("kernel.xid", 79, "0000:3b:00"), 3, 81.0)
    for number in range(10):                                            # bounded
        seen.new(("kernel.xid", number, "x"), 1, 90.0)
    assert len(seen) <= 3


def test_wants_check_is_a_drain_finding():
    class F:
        def __init__(self, action):
            self.action = action
    assert wants_check([F("none"), F("drain")])
    assert not wants_check([F("none"), F("warn")])
    assert not wants_check([])


# -- the watcher on a node ----------------------------------------------------------------------
class Node:
    """A node whose kernel log is a plain file, a config naming it, and a stand-in
    HealthCheckProgram that records the environment of each run."""

    def __init__(self, tmp_path, extra: str = ""):
        self.log = tmp_path / "kern.log"
        self.log.write_text("")
        self.state = tmp_path / "state"
        self.config_path = tmp_path / "config.toml"
        # The watcher's textfile ([health] textfile_dir) here, never in the host's node_exporter directory.
        self.metrics = tmp_path / "metrics"
        self.config_path.write_text(f'[paths]\nstate_dir = "{self.state}"\nkernel_log = "{self.log}"\n'
                                    f'[health]\ntextfile_dir = "{self.metrics}"\n{extra}')
        self.runs_prefix = tmp_path / "run"
        self.program = tmp_path / "healthcheck"
        self.program.write_text(PROGRAM.format(out=self.runs_prefix))
        self.program.chmod(0o755)
        self.boot = tmp_path / "boot_id"
        self.boot.write_text("boot-1\n")

    def config(self) -> Config:
        return Config.load(str(self.config_path), {})

    def watcher(self, clock=None, wall=None, **settings) -> service.Watcher:
        config = self.config()
        values = replace(WatchSettings.from_config(config), **settings)
        env = service.child_environment("gpu7", str(self.config_path), {"PATH": "/usr/bin", "HOME": "/root"})
        return service.Watcher(config, "gpu7", str(self.log), str(self.state), [str(self.program)], env, values,
                               boot_id_path=str(self.boot), **({"clock": clock} if clock else {}),
                               **({"wall": wall} if wall else {}))

    def append(self, *lines: str) -> None:
        with open(self.log, "a", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))

    def runs(self):
        folder = self.runs_prefix.parent
        found = []
        for name in sorted(os.listdir(folder)):
            if name.startswith(self.runs_prefix.name + "."):
                with open(folder / name, encoding="utf-8") as handle:
                    found.append(dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line))
        return found


def test_a_draining_xid_runs_the_health_check_as_slurmd_does(tmp_path):
    node = Node(tmp_path)
    watcher = node.watcher()
    watcher.run(service.FileWake(str(node.log)), once=True)       # the log as it is: nothing
    assert node.runs() == []
    node.append(XID79)
    watcher.run(service.FileWake(str(node.log)), once=True)
    runs = node.runs()
    assert len(runs) == 1
    env = {k: v for k, v in runs[0].items() if k not in ("PWD", "SHLVL", "_", "OLDPWD")}
    assert env == {"SLURMD_NODENAME": "gpu7", "SLURM_GPU_HOOKS_CONFIG": str(node.config_path)}
    # Its own cursor moved: the same line is not read again; slurmd's reader still has it.
    watcher.run(service.FileWake(str(node.log)), once=True)
    assert len(node.runs()) == 1
    assert os.path.isdir(node.state / "kernellog" / "gpu7.watch")
    assert not os.path.exists(node.state / "kernellog" / "gpu7.health")


def test_lines_that_do_not_drain_or_are_not_the_kernels_run_nothing(tmp_path):
    node = Node(tmp_path)
    watcher = node.watcher()
    watcher.run(service.FileWake(str(node.log)), once=True)
    node.append(XID13, FORGED, f"{NOW} gpu001 kernel: usb 1-1: new high-speed USB device")
    watcher.run(service.FileWake(str(node.log)), once=True)
    assert node.runs() == []
    assert watcher.trigger.requests == 0


def test_an_admin_who_makes_xids_warn_gets_no_runs_from_them(tmp_path):
    node = Node(tmp_path, '[actions]\n"kernel.xid" = "warn"\n')
    watcher = node.watcher()
    node.append(XID79)
    watcher.run(service.FileWake(str(node.log)), once=True)
    assert node.runs() == []


def test_a_broken_watcher_runs_nothing_and_says_so(tmp_path, capsys):
    node = Node(tmp_path)
    watcher = node.watcher()
    os.unlink(node.log)
    os.mkdir(node.log)                       # not a file: the reader refuses it
    assert watcher.run(service.FileWake(str(node.log)), once=True) == 0
    assert node.runs() == [] and watcher.errors == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot follow the kernel log" in err[0] and "Traceback" not in err[0]


def test_a_health_check_that_cannot_start_is_one_line_and_not_retried_at_once(tmp_path, capsys):
    node = Node(tmp_path)
    watcher = node.watcher()
    watcher.program = [str(tmp_path / "missing")]
    node.append(XID79)
    watcher.run(service.FileWake(str(node.log)), once=True)
    assert "cannot start the health check" in capsys.readouterr().err
    assert not watcher.trigger.pending and not watcher.trigger.running


def test_an_xid_flood_is_read_in_bounded_slices_and_starts_one_run(tmp_path):
    """A million-line flood of one Xid: each look reads at most [xid] read_budget_bytes (plus
    one chunk), the flood folds into one event, and one health check is asked for."""
    node = Node(tmp_path, "[xid]\nread_budget_bytes = 1048576\n")
    watcher = node.watcher()
    watcher.run(service.FileWake(str(node.log)), once=True)
    line = (XID79 + "\n").encode()
    with open(node.log, "ab") as handle:
        handle.write(line * (6 * 1024 * 1024 // len(line)))
    size = os.path.getsize(node.log)
    reads = []
    from healthcheck.kernellog import api

    real = api.read_new_events

    def counting(*args, **kwargs):
        read = real(*args, **kwargs)
        reads.append(read.stats.bytes_read)
        return read

    api.read_new_events = counting
    try:
        for _ in range(20):
            watcher.look()
            if not watcher._more:
                break
    finally:
        api.read_new_events = real
    assert sum(reads) >= size - len(line) and len(reads) >= size // (1024 * 1024 + CHUNK)
    assert max(reads) <= 1024 * 1024 + CHUNK
    assert watcher.trigger.requests == 1


def test_the_command_refuses_a_bad_config_in_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[watch]\nmax_cpu = 7\n")
    done = subprocess.run([sys.executable, "-m", "healthcheck.watch.service", "--config", str(bad), "--once"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "watch.max_cpu" in done.stderr


def test_the_command_follows_a_simulated_node_and_runs_its_health_check(sim_config, tmp_path):
    """--once on a simulated node: the simulator's kern.log is followed; an Xid 79 starts the
    program given, with the node's name."""
    from healthcheck.sim.node import SimNode

    config = Config.load(str(sim_config), {})
    sim = SimNode(config.state_dir, "gpu1", config.sim_profile_path("gpu1"))
    sim.ensure()
    out = tmp_path / "ran"
    program = tmp_path / "hc"
    program.write_text(PROGRAM.format(out=out))
    program.chmod(0o755 | stat.S_IXUSR)
    argv = [sys.executable, "-m", "healthcheck.watch.service", "--config", str(sim_config), "--node", "gpu1",
            "--program", str(program), "--once"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    sim.inject([], ["NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python3, GPU has fallen off the bus."])
    second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "running the health check" in second.stderr, second.stderr
    ran = [name for name in os.listdir(tmp_path) if name.startswith("ran.")]
    assert len(ran) == 1
    assert "SLURMD_NODENAME=gpu1" in (tmp_path / ran[0]).read_text()


def test_the_systemd_unit_runs_the_installed_command_and_nothing_requires_it():
    from .conftest import ROOT

    with open(os.path.join(ROOT, "etc", "systemd", "slurm-gpu-watch.service"), encoding="utf-8") as handle:
        unit = handle.read()
    lines = [line.strip() for line in unit.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "ExecStart=/opt/slurm-gpu-hooks/current/bin/slurm-gpu-watch" in lines     # docs/install.md step 2
    assert "Restart=on-failure" in lines
    assert not any(line.startswith(("RequiredBy=", "Before=slurmd")) for line in lines)
    with open(os.path.join(ROOT, "setup.cfg"), encoding="utf-8") as handle:
        assert "slurm-gpu-watch = healthcheck.watch.service:main" in handle.read()
    with open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8") as handle:
        assert "etc/systemd/slurm-gpu-watch.service" in handle.read()


# -- after a boot that a drain of ours waits for ---------------------------------------------------
def test_after_boot_runs_until_one_run_has_judged_the_node_as_slurm_has_it_back():
    follow = AfterBoot(600)
    assert not follow.active and not follow.wants_run(0.0, None)
    follow.begin(100.0, 5000.0)
    assert follow.wants_run(101.0, None)                          # no run yet
    assert follow.wants_run(102.0, (4990.0, "resume"))            # a run from before the boot: not this one
    assert follow.wants_run(103.0, (5001.0, "slurm-busy"))        # slurmd's start-up run: Slurm shows the reboot
    assert follow.wants_run(104.0, (5002.0, "slurm-unreachable-healthy"))
    assert not follow.wants_run(105.0, (5003.0, "resume")) and not follow.active   # judged: done
    follow.begin(200.0, 6000.0)
    assert not follow.wants_run(800.0, (6001.0, "slurm-busy")) and not follow.active  # past the limit
    off = AfterBoot(0)
    off.begin(1.0, 1.0)
    assert not off.active


def _drained_in(node: "Node", boot: str, mode: str = "after_reboot") -> None:
    from healthcheck.actions.state import Drained, NodeState, save

    save(str(node.state), "gpu7", NodeState(boot_id=boot, drained=Drained(
        cause="gpu.lost gpu3", resume_mode=mode, boot_id=boot, at=time.time())))


def _last_result(node: "Node", rule: str) -> None:
    import json

    from healthcheck.actions.state import last_path

    path = last_path(str(node.state), "gpu7")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"time": time.time(), "rule": rule}, handle)


@pytest.mark.parametrize("drained_in,mode,follows", [
    ("boot-0", "after_reboot", True),       # drained before this boot, waiting for a reboot: follow it
    ("boot-1", "after_reboot", False),      # drained in this boot: no reboot happened yet
    ("boot-0", "auto", False),              # a drain that resumes on its own checks
    (None, None, False),                    # no drain of ours
])
def test_a_boot_is_followed_only_when_a_drain_of_ours_waits_for_it(tmp_path, drained_in, mode, follows):
    node = Node(tmp_path)
    if drained_in is not None:
        _drained_in(node, drained_in, mode)
    watcher = node.watcher()
    watcher.follow_boot()
    assert watcher.after_boot.active is follows and watcher.trigger.pending is follows


def test_the_watcher_runs_the_health_check_after_a_reboot_until_it_has_judged_the_node(tmp_path):
    node = Node(tmp_path)
    now = [1000.0]
    watcher = node.watcher(min_interval_s=0.0, clock=lambda: now[0])
    watcher.run(service.FileWake(str(node.log)), once=True)         # boot-1, nothing waits
    assert node.runs() == [] and not watcher.after_boot.active
    _drained_in(node, "boot-1")
    node.boot.write_text("boot-2\n")                                 # rebooted under the watcher (the lab)
    watcher._boot_looked = float("-inf")
    watcher.run(service.FileWake(str(node.log)), once=True)
    assert len(node.runs()) == 1 and watcher.after_boot.active
    _last_result(node, "slurm-busy")                                 # Slurm still shows the reboot
    now[0] += AFTER_BOOT_EVERY_MIN_S
    watcher.run(service.FileWake(str(node.log)), once=True)
    assert len(node.runs()) == 2 and watcher.after_boot.active
    _last_result(node, "resume")                                     # judged: back in service
    watcher.run(service.FileWake(str(node.log)), once=True)
    watcher.run(service.FileWake(str(node.log)), once=True)
    assert len(node.runs()) == 2 and not watcher.after_boot.active


class _CountingWake:
    """A wake that records each idle wait and stops the watcher after a few."""

    def __init__(self, watcher, doorbell: bool):
        self.watcher, self.doorbell, self.waits = watcher, doorbell, []

    def changed(self) -> bool:
        return False

    def wait(self, timeout: float) -> None:
        self.waits.append(timeout)
        if len(self.waits) >= 3:
            self.watcher.stopping = True

    def close(self) -> None:
        pass


@pytest.mark.parametrize("doorbell", [True, False])
def test_an_idle_watcher_with_a_doorbell_sleeps_until_its_next_duty_not_every_poll(tmp_path, doorbell):
    """Issue 30: at most 1 wake-up a second on an idle node. /dev/kmsg wakes the watcher for a new
    record, so idle it waits IDLE_S (its next duty: the boot id); a file is looked at every poll_s.
    (Measured: 2.05 wake-ups a second before, 0.50 after, following the host's /dev/kmsg.)"""
    node = Node(tmp_path)
    watcher = node.watcher(poll_s=0.5)
    wake = _CountingWake(watcher, doorbell)
    watcher.run(wake)
    idle = [timeout for timeout in wake.waits if timeout > 0]
    assert idle and max(idle) == (service.IDLE_S if doorbell else 0.5), wake.waits
    assert service.IDLE_S >= 1.0


def test_min_interval_0_with_after_boot_cannot_storm_while_slurm_shows_the_reboot(tmp_path):
    """Issue 34, 5: [watch] min_interval_s = 0 (allowed) with after_boot_s made 84 health checks,
    one scontrol each, in 30 s while Slurm still showed the reboot. The runs after a boot are
    now at least AFTER_BOOT_EVERY_MIN_S apart; the key is still accepted, the watcher says so."""
    node = Node(tmp_path, extra="[watch]\nmin_interval_s = 0\nafter_boot_s = 600\n")
    settings = WatchSettings.from_config(node.config())
    assert settings.min_interval_s == 0.0
    now = [1000.0]
    watcher = node.watcher(clock=lambda: now[0])
    _drained_in(node, "boot-0")
    for _ in range(60):                                    # 30 s of the loop, half a second a turn
        watcher.run(service.FileWake(str(node.log)), once=True)
        _last_result(node, "slurm-busy")                   # every run: Slurm still shows the reboot
        now[0] += 0.5
    assert 1 <= len(node.runs()) <= 30 / AFTER_BOOT_EVERY_MIN_S + 1
    assert watcher.after_boot.active                       # still following the boot
    note = service.after_boot_note(settings)
    assert note is not None and "min_interval_s = 0" in note and "\n" not in note
    (tmp_path / "defaults").mkdir()
    assert service.after_boot_note(WatchSettings.from_config(Node(tmp_path / "defaults").config())) is None


def test_after_boot_runs_are_paced_by_its_own_floor():
    follow = AfterBoot(600, after_boot_every(0))
    follow.begin(100.0, 5000.0)
    asked = [t for t in range(100, 130) if follow.wants_run(float(t), (5001.0, "slurm-busy"))]
    assert asked == [100, 105, 110, 115, 120, 125]
    assert after_boot_every(30) == 30
