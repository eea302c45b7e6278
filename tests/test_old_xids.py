"""Old Xids: events written before the running kernel booted are evidence, never a drain on
their own, also when there is no cursor (a first run, or after a corrupt cursor)."""
from __future__ import annotations

import time

from healthcheck.kernellog.api import read_new_events
from healthcheck.xid.event_findings import xid_findings
from healthcheck.runner import run_checks
from healthcheck.sim.node import SimNode

from .checks_support import hardware_for, make_config, sim

NOW = float(int(time.time()))
DAY = 86400.0


def syslog(moment, code=48, pid=77):
    stamp = time.strftime("%b %d %H:%M:%S", time.localtime(moment))
    return f"{stamp} gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): {code}, pid={pid}, name=python, DBE (0x0000000b).\n"


def test_an_xid_from_before_the_boot_is_evidence_only(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(syslog(NOW - 3 * DAY))
    read = read_new_events(str(log), str(tmp_path / "state"), "gpu1", now=NOW, booted=NOW - DAY)
    assert read.rescan == "no cursor yet"
    [event] = read.events
    assert event.before_boot
    [finding] = xid_findings(read.events)
    assert (finding.status, finding.action) == ("warn", "none")
    assert finding.evidence["before_boot"] is True and finding.evidence["code"] == 48
    assert "before the current boot" in finding.message


def test_the_same_xid_since_the_boot_drains(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(syslog(NOW - 3 * DAY) + syslog(NOW - 60, pid=78))
    read = read_new_events(str(log), str(tmp_path / "state"), "gpu1", now=NOW, booted=NOW - DAY)
    assert sorted(event.before_boot for event in read.events) == [False, True]
    [finding] = xid_findings(read.events)
    assert (finding.status, finding.action) == ("fail", "drain")
    assert "before_boot" not in finding.evidence


def test_without_a_boot_time_nothing_is_called_old(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(syslog(NOW - 3 * DAY))
    read = read_new_events(str(log), str(tmp_path / "state"), "gpu1", now=NOW + 3 * DAY, booted=0.0)
    assert [event.before_boot for event in read.events] == [False]


def test_the_health_check_does_not_drain_for_an_xid_from_before_the_boot(tmp_path):
    """On the real clock: this machine booted after a line stamped three days ago."""
    state = tmp_path / "state"
    cfg = make_config(hardware=hardware_for("H100"), state_dir=str(state), tiers={"health": ["kernel.xid"]})
    sources = sim(state, "h100-healthy.toml")
    SimNode(str(state), "n1").inject([], [syslog(time.time() - 3 * DAY).rstrip("\n")])
    report = run_checks(cfg, "n1", "health", sources=sources)
    assert [(f.check, f.status, f.action) for f in report.findings] == [("kernel.xid", "warn", "none")]
    assert report.action != "drain"
