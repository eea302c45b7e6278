"""Nodes booted from a stateless image (issue 31), on the real lab: `slurm-gpu lab up --stateless`
makes the lab's RebootProgram empty a rebooted node's state and runtime directories, as a diskless
(Warewulf) node's /var and /run are after a boot. What must outlive a boot lives in Slurm: the
reboot count in the node's Extra (merged into what another tool wrote there), "ours, waits for a
reboot" in our reason and Slurm's BootTime. A lemon still gets exactly max_reboots reboots; a GPU
lost once is back in service by itself."""
from __future__ import annotations

import os
import time

import pytest

from healthcheck.actions import kept
from healthcheck.actions import state as node_state

from slurm_hooks.lab.releases import current as lab_release

from .conftest import slurm_gpu, wait_for
from .test_lab_remediate import PREFIX, REBOOTING, Remediating, backend, boot_epoch, boot_time, distinct_boots

pytestmark = pytest.mark.lab

OTHER_TOOL = "rack=12 owner=ml"


@pytest.fixture
def stateless(lab):
    up = slurm_gpu("lab", "up", "--stateless", env=lab.env, timeout=300)
    assert up.returncode == 0, up.stderr
    assert "nodes: stateless" in up.stdout
    try:
        yield lab
    finally:
        back = slurm_gpu("lab", "up", env=lab.env, timeout=300)
        assert back.returncode == 0, back.stderr
        assert not os.path.exists(lab.paths.stateless_file)


def lab_log_lines(lab) -> list:
    with open(lab.paths.lab_log, encoding="utf-8", errors="replace") as handle:
        return handle.read().splitlines()


def last_notes(state_dir: str, node: str) -> str:
    import json

    try:
        with open(os.path.join(state_dir, "health", f"{node}.last.json"), encoding="utf-8") as handle:
            last = json.load(handle)
    except (OSError, ValueError):
        return ""
    return f"{last.get('rule')}: {last.get('notes')} {json.dumps(last.get('remediation'))}"


def set_extra(lab, node: str, text: str) -> None:
    done = lab.run("scontrol", "update", f"nodename={node}", f"extra={text}")
    assert done.returncode == 0, done.stderr


@pytest.mark.every_release
def test_a_lemon_on_a_stateless_node_gets_exactly_max_reboots_then_inspection(stateless):
    lab, slurm = stateless, backend(stateless)
    with Remediating(lab, max_reboots=2):
        set_extra(lab, "gpu3", OTHER_TOOL)
        try:
            result = slurm_gpu("sim", "inject", "gpu3", "gpu.5.state=lost", "gpu.5.lost_every_boot=true", env=lab.env)
            assert result.returncode == 0, result.stderr
            boots = {boot_epoch(lab, "gpu3")}
            logged = len(lab_log_lines(lab))

            def inspected():
                boots.add(boot_epoch(lab, "gpu3"))
                info = slurm.node("gpu3")
                return info.drained and " reboots:2; inspect: " in info.reason and not info.has(*REBOOTING)
            wait_for("gpu3 drained for inspection", inspected, timeout=420, every=1)
            assert distinct_boots(boots) == 3              # the first boot and the two the reboots made
            # each boot started with the node's state emptied (its ledger among it)
            wiped = [line for line in lab_log_lines(lab)[logged:] if "gpu3: stateless boot: " in line]
            assert len(wiped) == 2, wiped
            info = slurm.node("gpu3")
            assert info.extra.startswith(OTHER_TOOL + " " + kept.TOKEN)
            [times] = kept.reboots_kept(info.extra).values()
            assert len(times) == 2
            reason, settled = info.reason, boot_epoch(lab, "gpu3")
            time.sleep(25)                                 # two more health-check intervals: left alone
            info = slurm.node("gpu3")
            assert info.drained and info.reason == reason
            assert distinct_boots([settled, boot_epoch(lab, "gpu3")]) == 1
        finally:
            set_extra(lab, "gpu3", "")


@pytest.mark.every_release
def test_a_gpu_lost_once_on_a_stateless_node_is_back_in_service_by_itself(stateless):
    lab, slurm = stateless, backend(stateless)
    with Remediating(lab) as remediating:
        before = boot_time(lab, "gpu2")
        result = slurm_gpu("sim", "inject", "gpu2", "gpu.3.state=lost", env=lab.env)
        assert result.returncode == 0, result.stderr
        wait_for("gpu2 drained by us", lambda: slurm.node("gpu2").reason.startswith(PREFIX + "gpu.lost gpu3"),
                 timeout=60)
        wait_for("gpu2 rebooted (a new BootTime)", lambda: boot_time(lab, "gpu2") not in ("", before), timeout=180)
        wait_for("gpu2 back in service", lambda: (lambda info: not info.drained and not info.down
                                                  and not info.has(*REBOOTING))(slurm.node("gpu2")), timeout=120)
        # The new boot's health state holds no drain: it learnt from Slurm, not from a file.
        assert node_state.load(remediating.state_dir, "gpu2").drained is None


@pytest.mark.every_release
def test_a_foreign_drain_set_while_a_stateless_node_reboots_is_kept(stateless):
    """Remediation reboots gpu2 for a GPU lost once; while Slurm reboots it, an admin drains it
    with a reason of their own. The new boot starts with an empty state directory, and the health
    check, which knows "ours" only from the reason's prefix, leaves that drain alone."""
    lab, slurm = stateless, backend(stateless)
    admin = "admin: PSU swap, ticket 4711"
    with Remediating(lab):
        before = boot_epoch(lab, "gpu2")
        try:
            result = slurm_gpu("sim", "inject", "gpu2", "gpu.3.state=lost", env=lab.env)
            assert result.returncode == 0, result.stderr
            wait_for("gpu2 rebooting for us", lambda: slurm.node("gpu2").has(*REBOOTING), timeout=90, every=0.2)
            logged = os.path.getsize(lab.paths.slurmctld_log)
            done = lab.run("scontrol", "update", "nodename=gpu2", "state=drain", f"reason={admin}")
            assert done.returncode == 0, done.stderr
            wait_for("gpu2 rebooted (a new BootTime)",
                     lambda: distinct_boots([before, boot_epoch(lab, "gpu2")]) == 2, timeout=180)
            wait_for("gpu2's reboot over", lambda: not slurm.node("gpu2").has(*REBOOTING), timeout=120)
            time.sleep(25)                                 # two more health-check intervals
            info = slurm.node("gpu2")
            if info.drained or lab_release(lab.paths).version != "22.05":
                # Slurm adds its own words to the reason ("admin: ... : reboot issued"): the text
                # is still the admin's, not ours.
                assert info.drained and info.reason.startswith(admin), (info.state, info.reason)
            else:
                # 22.05 itself ends the drain with the reboot (measured: slurmctld logs the drain
                # as "state set to REBOOT", then "node gpu2 returned to service"); the health
                # check never touched the node after the admin's words.
                with open(lab.paths.slurmctld_log, encoding="utf-8", errors="replace") as handle:
                    handle.seek(logged)
                    after = [line for line in handle.read().splitlines() if " gpu2 " in line + " "]
                assert any("node gpu2 returned to service" in line for line in after), after
                assert not [line for line in after if "update_node: node gpu2" in line
                            and "admin: " not in line and "set to REBOOT" not in line], after
        finally:
            slurm_gpu("sim", "reset", "gpu2", env=lab.env)
            if slurm.node("gpu2").reason.startswith(admin):
                slurm.resume("gpu2")


def test_records_queued_while_slurmdbd_is_down_reach_accounting_though_the_node_is_rebooted(stateless):
    """20 jobs end on gpu2 with slurmdbd stopped: their records wait in gpu2's outbox, which a
    stateless reboot would empty. A fault after the jobs: remediation does not reboot while the
    records are not in accounting (wait-records); slurmdbd back, they are delivered, then the
    reboot comes, and every job's AdminComment holds gpu2's entry with its class."""
    import json

    from slurm_hooks.lab import daemons

    from .test_lab_job_classes import admin_comment, submit, wait_ended
    from healthcheck.records import admin_comment as ac

    lab, slurm = stateless, backend(stateless)
    with Remediating(lab) as remediating:
        # Every node writes its own entry (an ordinary job's is otherwise the controller side's alone).
        with open(lab.paths.hooks_config, "w", encoding="utf-8") as handle:
            assert remediating.text.count("[records]\n") == 1
            handle.write(remediating.text.replace("[records]\n", '[records]\nnode_entries = "always"\n'))
        dbd = daemons.by_name(lab.paths, "slurmdbd")
        before, first_boot = boot_time(lab, "gpu2"), boot_epoch(lab, "gpu2")
        try:
            assert daemons.stop(lab.paths, [dbd], lambda line: None) == ["slurmdbd"]
            jobs = {submit(lab, "-w", "gpu2", "--gres=gpu:1", "--wrap", "true" if n % 2 else "exit 3"):
                    "COMPLETED" if n % 2 else "FAILED" for n in range(20)}
            for job in jobs:
                wait_ended(lab, job)
            result = slurm_gpu("sim", "inject", "gpu2", "gpu.3.state=lost", env=lab.env)
            assert result.returncode == 0, result.stderr
            wait_for("gpu2 drained by us", lambda: slurm.node("gpu2").reason.startswith(PREFIX + "gpu.lost gpu3"),
                     timeout=60)

            def waits_for_records():
                last = os.path.join(remediating.state_dir, "health", "gpu2.last.json")
                try:
                    with open(last, encoding="utf-8") as handle:
                        return "remediate-records-first" in json.dumps(json.load(handle))
                except (OSError, ValueError):
                    return False
            wait_for("remediation waiting for the records (wait-records)", waits_for_records, timeout=60)
            assert distinct_boots([first_boot, boot_epoch(lab, "gpu2")]) == 1     # no reboot while they wait
        finally:
            # slurmdbd alone (`lab up` would write the lab's hooks config again, [remediate] off)
            daemons.start(lab.paths, dbd, lambda line: None)
        seen = []

        def rebooted():
            seen.append(last_notes(remediating.state_dir, "gpu2"))
            return distinct_boots([first_boot, boot_epoch(lab, "gpu2")]) == 2
        try:
            wait_for("gpu2 rebooted once its records were in accounting", rebooted, timeout=300, every=2)
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}; the health check said: {seen[-3:]}", pytrace=False)
        for job, cls in jobs.items():
            entries = [e for e in ac.parse(admin_comment(lab, job)) if e.get("node") == "gpu2"]
            assert [e["class"] for e in entries] == [cls], (job, admin_comment(lab, job))
