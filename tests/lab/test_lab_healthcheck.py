"""slurm-gpu-healthcheck as Slurm's HealthCheckProgram on the lab (HealthCheckInterval 10 s):
every acceptance line of issue 10 against the real slurmctld and slurmd."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

import pytest

from healthcheck.hooklib.runlog import read_runs
from healthcheck.slurm.cli_backend import CliBackend
from slurm_hooks.lab import watchers
from slurm_hooks.lab.commands import slurm_env

from .conftest import wait_for as _wait_for

pytestmark = pytest.mark.lab

NODES = ("gpu1", "gpu2", "gpu3")
PREFIX = "gpu-hooks:"
XID79 = "NVRM: Xid (PCI:{pci}): 79, pid=4242, name=python3, GPU has fallen off the bus."
DBE = "gpu.3.ecc.volatile_uncorrected=2"
WAIT = 45          # seconds: several HealthCheckIntervals, for polling only (never asserted)


def backend(lab) -> CliBackend:
    return CliBackend(bin_dir=lab.paths.bin, slurm_conf=lab.paths.slurm_conf, env=slurm_env(lab.paths), timeout_s=20)


def runs(lab, node: str, since: float) -> List[dict]:
    return [e for e in read_runs(lab.paths.state)
            if e.get("hook") == "healthcheck" and e.get("node") == node and e.get("time", 0) > since]


def wait_for(what: str, probe, limit: float = WAIT):
    return _wait_for(what, probe, timeout=limit, every=0.3)


def wait_runs(lab, node: str, since: float, count: int = 2) -> List[dict]:
    return wait_for(f"{count} health-check run(s) on {node}",
                    lambda: (lambda found: found if len(found) >= count else None)(runs(lab, node, since)))


def last(lab, node: str) -> dict:
    with open(os.path.join(lab.paths.state, "health", f"{node}.last.json"), encoding="utf-8") as handle:
        return json.load(handle)


class Gpu:
    """``slurm-gpu`` against the lab (its config and SLURM_CONF)."""

    def __init__(self, lab, cli):
        self.lab, self.cli = lab, cli

    def __call__(self, *args: str, timeout: float = 120):
        return self.cli(*args, env=self.lab.env, timeout=timeout)


def sim(gpu: Gpu, *args: str) -> None:
    done = gpu("sim", *args)
    assert done.returncode == 0, done.stderr


def pci(lab, node: str, gpu: int) -> str:
    from healthcheck.config import Config
    from healthcheck.sim.node import SimNode

    config = Config.load(lab.paths.hooks_config)
    bus = SimNode(config.state_dir, node, config.sim_profile_path(node)).ensure()["gpu"][gpu]["pci_bus_id"]
    domain, bus_no, rest = bus.split(":")
    return f"{int(domain, 16):04x}:{int(bus_no, 16):02x}:{int(rest.split('.')[0], 16):02x}"


def restore(lab, gpu: Gpu, *nodes: str) -> None:
    """Mend the simulated nodes; resume the ones this tool or these tests ("admin: ...") drained."""
    slurm = backend(lab)
    for node in nodes:
        sim(gpu, "reset", node)
        info = slurm.node(node)
        if info.reason.startswith((PREFIX, "admin: ")):
            slurm.resume(node)


@pytest.fixture
def gpu(lab, cli) -> Gpu:
    return Gpu(lab, cli)


@pytest.fixture
def clean(lab, gpu):
    restore(lab, gpu, *NODES)
    yield
    restore(lab, gpu, *NODES)


@pytest.mark.every_release
def test_double_bit_ecc_on_gpu2_drains_gpu2_only_and_is_resumed_when_gone(lab, gpu, clean):
    slurm = backend(lab)
    began = time.time()
    sim(gpu, "inject", "gpu2", DBE)
    node = wait_for("gpu2 drained", lambda: (lambda n: n if n.drained else None)(slurm.node("gpu2")))
    took = time.time() - began
    assert node.reason.startswith("gpu-hooks: v1 gpu.ecc.uncorrectable gpu3 dbe:2; ")
    assert len(node.reason) <= 120 and node.reason_user == "root"
    assert not slurm.node("gpu1").drained and not slurm.node("gpu3").drained
    print(f"gpu2 drained {took:.1f} s after the injection (HealthCheckInterval 10 s)")
    sim(gpu, "reset", "gpu2")
    wait_for("gpu2 resumed", lambda: not slurm.node("gpu2").drained)


def test_an_admin_drain_is_kept_never_resumed_and_resume_refuses_it(lab, gpu, clean):
    slurm = backend(lab)
    admin = "admin: swapping the NVLink bridge, ticket 4711"
    lab.run("scontrol", "update", "nodename=gpu1", "state=drain", f"reason={admin}").check_returncode()
    since = time.time()
    sim(gpu, "inject", "gpu1", DBE)
    wait_runs(lab, "gpu1", since)
    assert slurm.node("gpu1").reason == admin
    assert last(lab, "gpu1")["detail"] == "leave-alone"
    since = time.time()
    sim(gpu, "reset", "gpu1")
    wait_runs(lab, "gpu1", since)
    node = slurm.node("gpu1")
    assert node.drained and node.reason == admin
    refused = gpu("resume", "gpu1")
    assert refused.returncode == 1 and "not by this tool" in refused.stderr and "\n" not in refused.stderr.strip()
    assert slurm.node("gpu1").reason == admin
    forced = gpu("resume", "gpu1", "--force")
    assert forced.returncode == 0, forced.stderr
    wait_for("gpu1 resumed", lambda: not slurm.node("gpu1").drained)


def _pid(path: str) -> int:
    with open(path, encoding="ascii") as handle:
        return int(handle.read().split()[0])


def test_slurmctld_down_never_drains_and_the_drain_follows_when_it_is_back(lab, gpu, clean):
    slurm = backend(lab)
    ctld = _pid(lab.paths.slurmctld_pid)
    os.kill(ctld, signal.SIGTERM)
    try:
        wait_for("slurmctld stopped", lambda: not os.path.exists(f"/proc/{ctld}"), 30)
        sim(gpu, "inject", "gpu3", DBE)
        # slurmctld is what asks slurmd for a health check: with it down, run the program the
        # way slurmd does (the wrapper, no environment but SLURMD_NODENAME), twice.
        for _ in range(2):
            began = time.monotonic()
            done = subprocess.run(["/usr/bin/env", "-i", "SLURMD_NODENAME=gpu3", lab.paths.hook("healthcheck")],
                                  capture_output=True, text=True, timeout=120)
            print(f"health check with slurmctld down: {time.monotonic() - began:.1f} s")
            assert done.returncode == 0 and "Traceback" not in done.stderr
            lines = [line for line in done.stderr.splitlines() if "gpu3: blocked" in line]
            assert len(lines) == 1 and "Slurm could not be asked" in lines[0], done.stderr
            result = last(lab, "gpu3")
            assert result["decision"] == "blocked" and result["rule"] == "slurm-unreachable-fault"
            assert result["committed"] is False and result["reason"].startswith("gpu-hooks: v1 gpu.ecc.uncorrectable gpu3")
    finally:
        up = gpu("lab", "up", timeout=300)
        assert up.returncode == 0, up.stderr
    node = wait_for("gpu3 drained once slurmctld is back", lambda: (lambda n: n if n.drained else None)(slurm.node("gpu3")), 90)
    assert node.reason.startswith("gpu-hooks: v1 gpu.ecc.uncorrectable gpu3")


HANGING_SCONTROL = """#!/bin/sh
echo $$ > {marker}
exec sleep 300
"""


def test_a_run_killed_after_reading_an_xid_loses_nothing(lab, gpu, clean, tmp_path):
    """slurmd of gpu3 and its slurm-gpu-watch are paused so only the runs started here read gpu3's kernel log."""
    slurm = backend(lab)
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir()
    marker = tmp_path / "scontrol.pid"
    for name in ("scontrol", "sinfo"):
        (stub_dir / name).write_text(HANGING_SCONTROL.format(marker=marker))
        (stub_dir / name).chmod(0o755)
    with open(lab.paths.hooks_config, encoding="utf-8") as handle:
        text = handle.read()
    stub_config = os.path.join(os.path.dirname(lab.paths.hooks_config), "hooks-hanging-slurm.toml")
    with open(stub_config, "w", encoding="utf-8") as handle:
        # The lab's config names its commands ([slurm] bin_dir = "$LAB/bin"): the stubs replace them.
        stubbed, count = re.subn(r'^bin_dir = .*$', f'bin_dir = "{stub_dir}"', text, count=1, flags=re.MULTILINE)
        handle.write(stubbed if count else text + f'\n[slurm]\nbin_dir = "{stub_dir}"\n')
    slurmd = _pid(lab.paths.slurmd_pid("gpu3"))
    watcher = watchers.pid(lab.paths, "gpu3")
    paused = [pid for pid in (slurmd, watcher) if pid is not None]
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(3)                                   # a run slurmd started before the pause ends
        sim(gpu, "inject", "gpu3", "--log", XID79.format(pci=pci(lab, "gpu3", 0)))
        argv = [os.path.join(os.path.dirname(sys.executable), "slurm-gpu-healthcheck"), "--node", "gpu3",
                "--config", stub_config]
        killed = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        wait_for("the run reached scontrol (after reading the log)", marker.exists, 30)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(10)
        os.kill(int(marker.read_text()), signal.SIGKILL)
        assert not slurm.node("gpu3").drained
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        os.unlink(stub_config)
    # The killed run committed nothing: the next run (slurmd's own) reads the Xid again and drains.
    node = wait_for("gpu3 drained by the next run", lambda: (lambda n: n if n.drained else None)(slurm.node("gpu3")))
    assert "kernel.xid gpu0 xid:79" in node.reason


def _set_budget(path: str, nodes: int) -> str:
    with open(path, encoding="utf-8") as handle:
        original = handle.read()
    assert "budget_max_nodes = 3" in original
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(original.replace("budget_max_nodes = 3", f"budget_max_nodes = {nodes}"))
    return original


def test_faults_on_all_three_nodes_with_a_budget_of_one_drain_exactly_one(lab, gpu, clean):
    slurm = backend(lab)
    original = _set_budget(lab.paths.hooks_config, 1)
    try:
        since = time.time()
        for node in NODES:
            sim(gpu, "inject", node, DBE)
        for node in NODES:
            wait_for(f"3 runs on {node}", lambda: len(runs(lab, node, since)) >= 3, 120)
        drained = [name for name in NODES if slurm.node(name).drained]
        assert len(drained) == 1, [(n, slurm.node(n).state, slurm.node(n).reason) for n in NODES]
        for name in set(NODES) - set(drained):
            result = last(lab, name)
            assert result["decision"] == "blocked" and result["rule"] == "drain-budget", result
    finally:
        with open(lab.paths.hooks_config, "w", encoding="utf-8") as handle:
            handle.write(original)


def test_an_ib_port_down_for_one_run_does_not_drain_for_two_it_does(lab, gpu, clean):
    slurm = backend(lab)
    down = ['ib.mlx5_3:1.state="1: DOWN"', 'ib.mlx5_3:1.phys_state="3: Disabled"']
    since = time.time()
    sim(gpu, "inject", "gpu1", *down)
    wait_for("a run that saw the port down", lambda: [e for e in runs(lab, "gpu1", since) if e.get("pending")])
    sim(gpu, "reset", "gpu1")
    assert not slurm.node("gpu1").drained
    since = time.time()
    wait_runs(lab, "gpu1", since, 2)
    assert not slurm.node("gpu1").drained
    sim(gpu, "inject", "gpu1", *down)
    node = wait_for("gpu1 drained after two failing runs",
                    lambda: (lambda n: n if n.drained else None)(slurm.node("gpu1")))
    assert node.reason.startswith("gpu-hooks: v1 ib.port mlx5_3:1")


def _drained(slurm, node: str):
    return wait_for(f"{node} drained", lambda: (lambda n: n if n.drained else None)(slurm.node(node)))


def test_reboots_resume_what_they_clear_and_inspect_what_returns(lab, gpu, clean):
    slurm = backend(lab)
    state = os.path.join(lab.paths.state, "health", "gpu3.json")
    if os.path.exists(state):
        os.unlink(state)                     # no Xid history from an earlier session
    sim(gpu, "inject", "gpu3", "gpu.2.state=lost")
    assert "gpu.lost gpu2" in _drained(slurm, "gpu3").reason
    sim(gpu, "reboot", "gpu3")
    wait_for("gpu3 resumed after the reboot", lambda: not slurm.node("gpu3").drained)

    line = XID79.format(pci=pci(lab, "gpu3", 0))
    for _ in range(2):
        sim(gpu, "inject", "gpu3", "--log", line)
        assert "kernel.xid gpu0 xid:79" in _drained(slurm, "gpu3").reason
        sim(gpu, "reboot", "gpu3")
        wait_for("gpu3 resumed after the reboot", lambda: not slurm.node("gpu3").drained)
    sim(gpu, "inject", "gpu3", "--log", line)
    reason = _drained(slurm, "gpu3").reason
    assert reason.startswith("gpu-hooks: v1 kernel.xid.repeat gpu0 xid:79 reboots:2; ")
    since = time.time()
    sim(gpu, "reboot", "gpu3")
    wait_runs(lab, "gpu3", since)
    assert slurm.node("gpu3").reason == reason
    assert last(lab, "gpu3")["rule"] == "resume-never"
    resumed = gpu("resume", "gpu3")
    assert resumed.returncode == 0, resumed.stderr
    wait_for("gpu3 resumed by slurm-gpu resume", lambda: not slurm.node("gpu3").drained)

    sim(gpu, "inject", "gpu3", "gpu.1.remapped_rows.failure=true")
    assert "gpu.remap.failed gpu1" in _drained(slurm, "gpu3").reason
    since = time.time()
    sim(gpu, "reset", "gpu3")
    wait_runs(lab, "gpu3", since)
    assert slurm.node("gpu3").drained and last(lab, "gpu3")["rule"] == "resume-never"


def test_drained_lists_ours_and_others_with_evidence(lab, gpu, clean):
    slurm = backend(lab)
    lab.run("scontrol", "update", "nodename=gpu1", "state=drain", "reason=admin: PSU").check_returncode()
    sim(gpu, "inject", "gpu2", DBE)
    _drained(slurm, "gpu2")

    def listed_with_evidence():
        # The health check writes its evidence record just after the drain shows in Slurm.
        listed = gpu("drained", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {row["node"]: row for row in json.loads(listed.stdout)}
        return rows if (rows.get("gpu2") or {}).get("evidence") else None

    rows = wait_for("gpu2's evidence in `slurm-gpu drained`", listed_with_evidence)
    assert set(rows) == {"gpu1", "gpu2"}
    assert rows["gpu1"]["ours"] is False and rows["gpu1"]["set_by"] == "root" and rows["gpu1"]["evidence"] is None
    assert rows["gpu2"]["ours"] is True and rows["gpu2"]["evidence"][0]["check"] == "gpu.ecc.uncorrectable"
    assert rows["gpu2"]["since"] and "DRAIN" in rows["gpu2"]["state"]
    everything = json.loads(gpu("drained", "--all", "--json").stdout)
    assert {row["node"] for row in everything} == set(NODES)
    lab.run("scontrol", "update", "nodename=gpu1", "state=resume")
