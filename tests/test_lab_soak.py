"""The soak's pure parts (slurm_hooks/lab/soak.py), without a lab: the schedule drawn from a seed,
the drain bookkeeping, the watcher summary, the results, the table; and `slurm-gpu lab soak` on
bad input and without a lab (one line, no traceback)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slurm_hooks.cli import main
from slurm_hooks.lab import soak as S

NODES = ("gpu1", "gpu2", "gpu3")
PREFIX = "gpu-hooks:"
TWO_HOURS = S.Plan(seconds=7200, nodes=NODES)


# -- the schedule ---------------------------------------------------------------------------------------
def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    first = [e.as_dict() for e in S.schedule(TWO_HOURS, 7)]
    assert first == [e.as_dict() for e in S.schedule(TWO_HOURS, 7)]
    assert first != [e.as_dict() for e in S.schedule(TWO_HOURS, 8)]


def _faults(events):
    injected = {e.detail["id"]: e for e in events if e.kind == "fault"}
    mended = {e.detail["id"]: e for e in events if e.kind == "mend"}
    return injected, mended


@pytest.mark.parametrize("seed", range(25))
def test_faults_are_never_two_on_one_node_and_each_is_mended_in_time(seed):
    plan = TWO_HOURS
    events = S.schedule(plan, seed)
    assert [e.at for e in events] == sorted(e.at for e in events)
    injected, mended = _faults(events)
    assert injected and set(injected) == set(mended)
    windows = []
    for fault_id, fault in injected.items():
        mend = mended[fault_id]
        assert mend.node == fault.node and mend.detail["fault"] == fault.detail["fault"]
        assert plan.fault_for[0] <= round(mend.at - fault.at, 1) <= plan.fault_for[1]
        assert plan.first_at <= fault.at and mend.at <= plan.seconds - plan.quiet_end
        assert fault.detail["fault"] in S.FAULTS_BY_NAME and 0 <= fault.detail["gpu"] < plan.gpus
        windows.append((fault.at, mend.at + plan.settle_s, fault.node))
    for index, (start, until, node) in enumerate(windows):
        for other_start, other_until, other_node in windows[index + 1:]:
            overlap = start < other_until and other_start < until
            # never two faults on one node at once (nor within settle_s of the last mend), and with
            # faults_at_once = 1 never two nodes at once either
            assert not overlap, (node, other_node, start, other_start)


def test_faults_at_once_lets_several_nodes_but_never_one_node_twice():
    plan = S.Plan(seconds=7200, nodes=NODES, faults_at_once=3, fault_every=(5, 20))
    injected, mended = _faults(S.schedule(plan, 3))
    spans = [(f.at, mended[i].at + plan.settle_s, f.node) for i, f in injected.items()]
    most = max(sum(1 for s, u, _ in spans if s <= at < u) for at, _, _ in spans)
    assert 1 < most <= 3
    for index, (start, until, node) in enumerate(spans):
        for other_start, other_until, other_node in spans[index + 1:]:
            if node == other_node:
                assert not (start < other_until and other_start < until)


def test_a_long_soak_draws_every_fault_kind_every_job_shape_both_daemons_and_every_watcher():
    events = S.schedule(TWO_HOURS, 11)
    assert {e.detail["fault"] for e in events if e.kind == "fault"} == set(S.FAULTS_BY_NAME)
    assert {e.detail["shape"] for e in events if e.kind == "job"} == set(S.SHAPES_BY_NAME)
    assert {e.detail["daemon"] for e in events if e.kind == "stop_daemon"} == set(S.DAEMONS)
    assert {e.node for e in events if e.kind == "kill_watcher"} == set(NODES)


@pytest.mark.parametrize("seed", range(10))
def test_daemons_and_watchers_are_down_one_at_a_time_and_back_before_the_end(seed):
    events = S.schedule(TWO_HOURS, seed)
    for stop, start in (("stop_daemon", "start_daemon"), ("kill_watcher", "start_watcher")):
        down = None
        for event in events:
            if event.kind == stop:
                assert down is None
                down = event
            elif event.kind == start:
                assert down is not None and (event.node, event.detail) == (down.node, down.detail)
                assert TWO_HOURS.watcher_down[0] <= event.at - down.at <= TWO_HOURS.watcher_down[1] + 0.1
                down = None
        assert down is None
    assert max(e.at for e in events if e.kind != "job") <= TWO_HOURS.seconds - TWO_HOURS.quiet_end
    assert max(e.at for e in events if e.kind == "job") < TWO_HOURS.seconds


def test_max_faults_caps_the_faults_and_none_drawn_when_it_is_zero():
    assert sum(1 for e in S.schedule(S.Plan(seconds=7200, nodes=NODES, max_faults=2), 5) if e.kind == "fault") == 2
    assert not [e for e in S.schedule(S.Plan(seconds=7200, nodes=NODES, max_faults=0), 5)
                if e.kind in ("fault", "mend")]


def test_the_lab_tests_three_minute_schedule_has_a_fault_a_restart_and_a_kill():
    """tests/lab/test_lab_soak.py runs this plan and seed: what it asserts needs these in it."""
    from tests.lab.test_lab_soak import PLAN, SEED

    events = S.schedule(PLAN, SEED)
    kinds = [e.kind for e in events]
    assert 1 <= kinds.count("fault") <= 2 and "stop_daemon" in kinds and "kill_watcher" in kinds
    assert kinds.count("disk_full") == kinds.count("disk_free") == 1


def _windows(events, opens, closes, key):
    started, out = {}, []
    for event in events:
        if event.kind == opens:
            started[key(event)] = event.at
        elif event.kind == closes:
            out.append((started.pop(key(event)), event.at))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_the_state_disk_is_full_apart_from_faults_and_daemon_restarts_and_free_before_the_end(seed):
    plan = S.Plan(seconds=3 * 3600, nodes=NODES, daemon_every=(300, 900), disk_every=(300, 900))
    events = S.schedule(plan, seed)
    disks = _windows(events, "disk_full", "disk_free", lambda e: "disk")
    assert disks and all(until - start == pytest.approx(60, abs=0.11) for start, until in disks)
    assert disks[-1][1] <= plan.seconds - plan.quiet_end
    busy = _windows(events, "fault", "mend", lambda e: e.detail["id"]) + \
        _windows(events, "stop_daemon", "start_daemon", lambda e: e.detail["daemon"])
    for start, until in disks:
        assert not any(b_start <= until and start <= b_until for b_start, b_until in busy), (start, until)
    for (_, until), (start, _) in zip(disks, disks[1:]):
        assert start - until >= plan.disk_every[0]


# -- drains --------------------------------------------------------------------------------------------
LOST = f"{PREFIX} v1 gpu.lost gpu3; GPU 3 fell off the bus"
XID = f"{PREFIX} v1 kernel.xid gpu3 xid:79; Xid 79 on GPU 3"


def _look(tracker, at, **nodes):
    tracker.see(at, {node: {"state": state, "reason": reason} for node, (state, reason) in nodes.items()})


def test_the_tracker_turns_looks_into_drains_with_their_causes():
    tracker = S.DrainTracker(PREFIX)
    _look(tracker, 1, gpu1=("idle", ""), gpu2=("idle", ""))
    _look(tracker, 3, gpu1=("drained", LOST), gpu2=("down*", "Not responding"))
    _look(tracker, 5, gpu1=("drained", LOST + " : reboot issued"), gpu2=("idle", ""))
    tracker.see(7, {})                                   # slurmctld down: a look that ends nothing
    _look(tracker, 9, gpu1=("drained", XID), gpu2=("idle", ""))
    _look(tracker, 11, gpu1=("idle", ""), gpu2=("idle", ""))
    ours = [d for d in tracker.drains if d.ours]
    others = [d for d in tracker.drains if not d.ours]
    assert len(ours) == 1
    [drain] = ours
    assert (drain.node, drain.first_at, drain.last_at, drain.ended_at) == ("gpu1", 3, 9, 11)
    assert drain.checks == ["gpu.lost", "kernel.xid"] and drain.cause == "gpu.lost"
    assert [(d.node, d.cause, d.ended_at) for d in others] == [("gpu2", "Not responding", 5)]


def _fault(fault_id=0, kind="xid79-gpu-lost", node="gpu1", at=10.0, mended_at=70.0):
    return S.FaultRecord(fault_id, kind, node, 3, "mlx5_3:1", at, mended_at)


def _drain(node, first_at, *checks):
    return S.Drain(node, first_at, first_at, reasons=[f"{PREFIX} v1 {c} gpu3" for c in checks], checks=list(checks))


def test_a_drain_in_its_nodes_fault_window_is_the_faults_and_one_outside_is_false():
    faults = [_fault()]
    drains = [_drain("gpu1", 12, "kernel.xid.repeat"),        # under kernel.xid: the fault's cause
              _drain("gpu2", 20, "gpu.lost"),                 # another node: no fault there
              _drain("gpu1", 70 + 180 + 5, "gpu.lost")]       # after the mend and the settle time
    S.attribute(drains, faults, settle_s=180)
    assert [d.fault for d in drains] == [0, None, None]
    assert faults[0].drained and faults[0].cause_ok and faults[0].checks == ["kernel.xid.repeat"]


def test_a_fault_drained_for_another_cause_is_not_drained_with_its_cause():
    faults = [_fault(kind="ib-port-down")]
    S.attribute([_drain("gpu1", 30, "gpu.ecc.uncorrectable")], faults, settle_s=60)
    assert faults[0].drained and not faults[0].cause_ok


def test_cause_matches_the_check_or_one_under_it_only():
    assert S.cause_matches("kernel.xid.repeat", ("kernel.xid",))
    assert S.cause_matches("gpu.lost", ("gpu.lost",))
    assert not S.cause_matches("kernel.xidx", ("kernel.xid",))
    assert not S.cause_matches("gpu.ecc.correctable_rate", ("gpu.ecc.uncorrectable",))


# -- watchers ------------------------------------------------------------------------------------------
def test_watcher_growth_is_measured_on_the_longest_lived_process_and_ignores_a_moments_spike():
    samples = [S.Sample(t, 100, 20000 + t, 9 + (3 if t == 50 else 0)) for t in range(0, 100, 10)]
    samples += [S.Sample(t, 200, 18000, 8) for t in range(100, 130, 10)]       # killed, started again
    summary = S.watcher_summary(samples)
    assert summary["processes"] == 2 and summary["measured_pid"] == 100 and summary["measured_samples"] == 10
    assert summary["first"] == {"at": 0, "pid": 100, "rss_kib": 20000, "fds": 9}
    assert summary["last"]["pid"] == 200 and summary["samples"] == 13
    assert summary["fd_growth"] == 0                      # the spike at 50 s is not growth
    assert summary["rss_growth_kib"] == 70 - 0            # least of the last 3 less least of the first 3


def test_a_leak_shows_as_growth():
    samples = [S.Sample(t, 7, 20000 + 100 * t, 9 + t // 10) for t in range(0, 600, 10)]
    summary = S.watcher_summary(samples)
    assert summary["fd_growth"] > 0 and summary["rss_growth_kib"] > 5000


def test_no_samples_is_said_as_none():
    assert S.watcher_summary([])["fd_growth"] is None


# -- results, table, verdict ---------------------------------------------------------------------------
def _observations():
    obs = S.Observations(seed=7, minutes=3.0, seconds=181.0)
    obs.units = [S.Unit("10", "completed", 1, "COMPLETED", True, True),
                 S.Unit("11_1", "array", 2, "COMPLETED", True, True),
                 S.Unit("12", "cancelled", 3, "CANCELLED by 0", True, False),     # lost
                 S.Unit("13", "timeout", 4, "CANCELLED by 0", False, False),      # never ran: nothing to lose
                 S.Unit("14", "failed", 5)]                                       # not in accounting
    obs.faults = [_fault(0, "xid79-gpu-lost", "gpu1", 10, 70), _fault(1, "ib-port-down", "gpu2", 300, 360)]
    obs.faults[0].back = "by_itself"
    obs.drains = [_drain("gpu1", 15, "gpu.lost"), _drain("gpu3", 100, "gpu.ecc.uncorrectable"),
                  S.Drain("gpu2", 50, 52, reasons=["Not responding"], ours=False)]
    obs.samples = {"gpu1": [S.Sample(0, 5, 20000, 9), S.Sample(10, 5, 20100, 9)]}
    obs.daemon_restarts = {"slurmdbd": 1}
    obs.reboots = 1
    return obs


def test_results_count_records_faults_and_drains():
    doc = S.results(_observations(), settle_s=120)
    assert (doc["jobs_submitted"], doc["jobs_ended"], doc["jobs_never_started"], doc["jobs_not_in_accounting"]) \
        == (5, 3, 1, 1)
    assert doc["jobs_by_state"] == {"CANCELLED": 1, "COMPLETED": 2}
    assert (doc["records_in_accounting"], doc["records_lost"], doc["records_lost_jobs"]) == (2, 1, ["12"])
    assert doc["faults_injected"] == 2 and doc["faults_by_kind"] == {"ib-port-down": 1, "xid79-gpu-lost": 1}
    assert doc["faults_drained_with_cause"] == 1
    assert [f["kind"] for f in doc["faults_not_drained_with_cause"]] == ["ib-port-down"]
    assert (doc["drains"], doc["drains_with_fault"], doc["false_drains"]) == (2, 1, 1)
    assert doc["false_drain_list"][0]["node"] == "gpu3"
    assert doc["drains_by_cause"] == {"gpu.ecc.uncorrectable": 1, "gpu.lost": 1}
    assert doc["other_drains"] == {"Not responding": 1}
    assert (doc["back_in_service"], doc["back_by_itself"], doc["in_inspection"]) == (1, 1, 0)
    assert doc["watchers"]["gpu1"]["rss_growth_kib"] == 100
    json.dumps(doc)                                       # the --out file and --json
    problems = S.verdict(doc)
    assert len(problems) == 3 and "12" in problems[0]


def test_a_clean_run_has_no_problems():
    obs = _observations()
    obs.units = obs.units[:2]
    obs.faults = obs.faults[:1]
    obs.drains = obs.drains[:1]
    assert S.verdict(S.results(obs, settle_s=120)) == []


def test_the_table_holds_every_documented_row_and_a_line_per_watcher():
    lines = S.format_table(S.results(_observations(), settle_s=120))
    text = "\n".join(lines)
    for label, _key in S.TABLE_ROWS:
        assert f"| {label} |" in text
    assert "| records lost | 1 |" in lines and "| false drains | 1 |" in lines
    assert "| faults by kind | ib-port-down 1, xid79-gpu-lost 1 |" in lines
    assert any(line.startswith("| gpu1 | 2 | 1 | 20000 | 20100 | 100 | 9 | 9 | 0 |") for line in lines)


def test_the_documented_keys_are_the_results_keys():
    """docs/reliability.md lists every key of the results, and no other."""
    import os
    import re

    doc = S.results(_observations(), settle_s=120)
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "docs", "reliability.md"), encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("## The results", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))
    assert documented == set(doc) | {"v", "started"}


# -- the command ---------------------------------------------------------------------------------------
def test_soak_without_a_duration_is_one_line():
    result = CliRunner().invoke(main, ["lab", "soak"])
    assert result.exit_code != 0 and "--minutes" in result.output and "Traceback" not in result.output


def test_soak_without_a_lab_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["lab", "soak", "--minutes", "3", "--dir", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert "not up" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


# -- the loop, against a fake lab (no daemon, no Slurm): every step runs, in order ----------------------
class FakeBackend:
    def __init__(self, lab):
        self.lab = lab

    def node(self, name):
        from types import SimpleNamespace

        return SimpleNamespace(extra="")

    def set_extra(self, name, text):
        raise AssertionError("no kept reboots to forget")

    def accounting(self, job_ids, fields):
        from healthcheck.records import admin_comment

        rows = []
        for job_id in job_ids:
            lost = job_id == self.lab.lost
            comment = "" if lost else admin_comment.encode({"node": "*", "class": "COMPLETED"})
            rows.append(dict({f: "" for f in fields}, JobID=job_id, State="COMPLETED", NodeList="gpu1",
                             AdminComment=comment))
        return rows


class FakeSlurm:
    def __init__(self, lab):
        self.lab = lab
        self.backend = FakeBackend(lab)
        self.next_id = 100
        self.running = {}
        self.cancelled = []

    def sbatch(self, argv, script):
        assert any(a.startswith("--job-name=lab-soak-") for a in argv) and "slurm_hooks.lab.payload" in script
        self.next_id += 1
        self.running[str(self.next_id)] = self.lab.clock()
        return str(self.next_id)

    def queue(self):
        if self.lab.ctld_down:
            from slurm_hooks.lab import LabError
            raise LabError("squeue: slurmctld does not answer")
        now = self.lab.clock()
        return [{"id": j, "name": "lab-soak-x", "state": "RUNNING"} for j, at in self.running.items()
                if now - at < 1.5]

    def nodes(self):
        return {node: ({"state": "drained", "reason": f"{PREFIX} v1 {self.lab.broken[node]} gpu3; broken"}
                       if node in self.lab.broken else {"state": "idle", "reason": ""}) for node in NODES}

    def cancel(self, *job_ids):
        self.cancelled += job_ids


class FakeLab:
    """The lab as the soak sees it: a session (preflight, `slurm-gpu sim`), Slurm, daemons, watchers."""

    def __init__(self, tmp_path):
        import time
        from types import SimpleNamespace

        self.clock = time.monotonic
        self.root = str(tmp_path)
        self.jobs = str(tmp_path / "jobs")
        self.state = str(tmp_path / "state")
        self.hooks_config = str(tmp_path / "hooks.toml")
        self.slurm_conf = str(tmp_path / "slurm.conf")
        with open(self.hooks_config, "w", encoding="utf-8") as handle:
            handle.write("[drain]\nreason_prefix = \"gpu-hooks:\"\n")
        self.config = SimpleNamespace(state_dir=str(tmp_path / "state"))
        self.slurm = FakeSlurm(self)
        self.broken = {}                # node -> the check its health check would drain it for
        self.ctld_down = False
        self.lost = None
        self.calls = []
        self.drain_prefix = PREFIX
        self.began = time.monotonic()

    # the session
    def preflight(self):
        self.calls.append("preflight")

    def echo(self, message):
        self.calls.append(message)

    def slurm_gpu(self, *args):
        self.calls.append(" ".join(args))
        if args[:2] == ("sim", "inject"):
            first = args[3]
            self.broken[args[2]] = ("gpu.lost" if "state=lost" in first else "gpu.ecc.uncorrectable" if ".ecc." in first
                                    else "nvlink.down" if "nvlink" in first else "ib.port")
        elif args[:2] == ("sim", "reset"):
            self.broken.pop(args[2], None)
        return ""

    def kernel_pci(self, node, gpu):
        return "0000:18:00"

    def script(self, scenario, payload):
        return "exec python -m slurm_hooks.lab.payload " + " ".join(payload)

    def restore_node(self, node, quiet=False):
        self.calls.append(f"restore {node}")


def test_the_loop_runs_every_event_and_the_results_say_what_the_fake_lab_did(tmp_path, monkeypatch):
    import os

    from slurm_hooks.lab import daemons, watchers

    lab = FakeLab(tmp_path)
    lab.lost = "102"
    stopped, started, watched = [], [], []

    def stop(lab_, group, say):
        stopped.append(group[0])
        lab.ctld_down = group[0] == "slurmctld" or lab.ctld_down
        return [group[0]]

    def start(lab_, daemon, say):
        started.append(daemon)
        lab.ctld_down = False
        return True

    monkeypatch.setattr(daemons, "by_name", lambda lab_, name: name)
    monkeypatch.setattr(daemons, "stop", stop)
    monkeypatch.setattr(daemons, "start", start)
    monkeypatch.setattr(watchers, "pid", lambda lab_, node: os.getpid())
    monkeypatch.setattr(watchers, "start", lambda lab_, node, say: watched.append(node) or True)
    killed = []
    monkeypatch.setattr(S.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.setattr(S, "JOBS_WAIT_S", 2)
    monkeypatch.setattr(S, "RECORDS_WAIT_S", 1)
    monkeypatch.setattr(S, "NODES_EVERY_S", 0.5)
    plan = S.Plan(seconds=9, nodes=NODES, job_every=(0.5, 1), fault_every=(2, 3), fault_for=(2.5, 3),
                  settle_s=1, daemon_every=(1, 2), daemon_down=(0.5, 1), watcher_every=(1, 2),
                  watcher_down=(0.5, 1), first_at=0.5, quiet_end=1)
    events = S.schedule(plan, 4)
    kinds = {e.kind for e in events}
    assert {"fault", "mend", "stop_daemon", "kill_watcher"} <= kinds
    soak = S.Soak(lab, plan, 4, lab.echo, sample_s=1, session=lab)
    soak.start()
    with open(lab.hooks_config, encoding="utf-8") as handle:
        assert "[remediate]\nenabled = true" in handle.read()      # remediation on while it runs
    soak.loop(events)
    soak.finish()
    soak.restore()
    soak.obs.drains = soak.tracker.drains
    doc = S.results(soak.obs, plan.settle_s)

    with open(lab.hooks_config, encoding="utf-8") as handle:
        assert "[remediate]" not in handle.read()                 # put back
    assert doc["faults_injected"] == sum(1 for e in events if e.kind == "fault") and not lab.broken
    assert doc["faults_drained_with_cause"] == doc["faults_injected"] and doc["false_drains"] == 0
    assert doc["back_by_itself"] == doc["faults_injected"]
    assert doc["jobs_submitted"] >= 3 and doc["records_lost_jobs"] == ["102"]
    assert sorted(stopped) == sorted(e.detail["daemon"] for e in events if e.kind == "stop_daemon")
    assert len(started) >= len(stopped)
    assert doc["watcher_kills"] == len(killed) == sum(1 for e in events if e.kind == "kill_watcher")
    assert set(watched) == {e.node for e in events if e.kind == "start_watcher"}
    assert doc["watchers"]["gpu1"]["samples"] >= 5 and doc["watchers"]["gpu1"]["fd_growth"] is not None
    assert [c for c in lab.calls if c.startswith("restore ")] == [f"restore {n}" for n in NODES]
    assert S.verdict(doc) and "102" in S.verdict(doc)[0]


@pytest.mark.parametrize("state, reason, later, back, resumed", [
    ("idle", "", None, "by_itself", False),
    ("reboot^", f"{PREFIX} v1 gpu.lost gpu3; lost : reboot issued", "wait", "", False),
    ("drained", f"{PREFIX} v1 gpu.lost gpu3 reboots:2; inspect: lost after 2 reboots", None, "inspection", True),
    ("drained", f"{PREFIX} v1 kernel.xid.repeat gpu3 xid:79 reboots:2; Xid 79 again", None, "inspection", True),
    ("drained", f"{PREFIX} v1 ib.port mlx5_3:1; down", None, "resumed_by_soak", True),
    ("drained", "admin: PSU", "wait", "", False),           # someone else's: looked at again, left alone
])
def test_a_check_back_tells_back_by_itself_inspection_and_still_drained(tmp_path, monkeypatch, state, reason, later,
                                                                         back, resumed):
    from slurm_hooks.lab import commands

    lab = FakeLab(tmp_path)
    lab.slurm.nodes = lambda: {"gpu2": {"state": state, "reason": reason}}
    ran = []
    monkeypatch.setattr(commands, "run", lambda argv, **kw: ran.append(argv[-2:]) or type("R", (), {"returncode": 0})())
    soak = S.Soak(lab, S.Plan(seconds=60, nodes=NODES, settle_s=30), 1, lab.echo, session=lab)
    soak.tracker = S.DrainTracker(PREFIX)
    soak.faults[0] = _fault(0, "gpu-lost", "gpu2", 1, 2)
    soak.faults[0].mended_at = soak.now()
    done = soak.check_back(0)
    assert done is (later is None)
    assert soak.faults[0].back == back
    assert ran == ([["resume", "gpu2"]] if resumed else [])
