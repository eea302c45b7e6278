"""Back in service by itself (issue 21) on the real lab: with [remediate] on, a GPU lost once is
drained, rebooted through Slurm (`scontrol reboot ASAP reason=<ours>`, the lab's RebootProgram:
its BootTime changes) and back in service with nobody acting; a lemon (lost again after every
boot) gets exactly max_reboots reboots, then is drained for inspection and left alone; a storm on
every node keeps the reboot budget (at most max_rebooting_nodes rebooting at any moment).

Each test rewrites the lab's hooks config (the hooks read it at every run) and puts everything
back in a finally: the faults, our drains, the config."""
from __future__ import annotations

import subprocess
import sys
import time
from typing import Optional

import pytest

from healthcheck.config import Config
from healthcheck.actions import kept, ledger as ledgers
from healthcheck.sim.node import SimNode
from healthcheck.slurm.cli_backend import CliBackend
from slurm_hooks.lab import watchers
from slurm_hooks.lab.commands import slurm_env

from .conftest import slurm_gpu, wait_for

pytestmark = pytest.mark.lab

NODES = ("gpu1", "gpu2", "gpu3")
PREFIX = "gpu-hooks: v1 "
REBOOTING = ("REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT")


def backend(lab) -> CliBackend:
    """The lab's release's own clients ($LAB/bin): a 22.05 client cannot talk to a 24.11 slurmctld."""
    return CliBackend(bin_dir=lab.paths.bin, slurm_conf=lab.paths.slurm_conf, env=slurm_env(lab.paths), timeout_s=20)


def boot_time(lab, node: str) -> str:
    shown = lab.run("scontrol", "show", "node", "-o", node)
    return next((word.split("=", 1)[1] for word in shown.stdout.split() if word.startswith("BootTime=")), "")


def boot_epoch(lab, node: str) -> Optional[float]:
    try:
        return time.mktime(time.strptime(boot_time(lab, node), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


# One boot's BootTime moves by a second between slurmd's registrations (it is now - uptime:
# 20:58:42 then 20:58:43 for one boot on 24.11, in CI); boots closer than this are one.
SAME_BOOT_S = 3.0


def distinct_boots(epochs) -> int:
    count, last = 0, None
    for epoch in sorted(e for e in epochs if e is not None):
        if last is None or epoch - last > SAME_BOOT_S:
            count += 1
        last = epoch
    return count


def forget_kept(lab, node: str) -> None:
    """The reboot counts remediation keeps in the node's Extra (healthcheck/actions/kept.py) go,
    another tool's words stay: the next test counts from zero."""
    extra = backend(lab).node(node).extra
    if kept.reboots_kept(extra):
        done = lab.run("scontrol", "update", f"nodename={node}", f"extra={kept.forgetting(extra)}")
        assert done.returncode == 0, done.stderr


class Remediating:
    """The lab's hooks config with [remediate] on, restored afterwards with every node healthy."""

    def __init__(self, lab, **keys):
        self.lab = lab
        with open(lab.paths.hooks_config, encoding="utf-8") as handle:
            self.original = handle.read()
        assert "[remediate]" not in self.original
        lines = ["", "[remediate]", "enabled = true"] + [f"{key} = {value}" for key, value in keys.items()]
        self.text = self.original + "\n".join(lines) + "\n"
        self.state_dir = Config.load(lab.paths.hooks_config).state_dir

    def __enter__(self):
        for node in NODES:
            ledgers.save(self.state_dir, node, ledgers.Ledger())       # each test counts from zero
            forget_kept(self.lab, node)                                 # here and in Slurm
        with open(self.lab.paths.hooks_config, "w", encoding="utf-8") as handle:
            handle.write(self.text)
        return self

    def __exit__(self, *exc):
        with open(self.lab.paths.hooks_config, "w", encoding="utf-8") as handle:
            handle.write(self.original)
        slurm = backend(self.lab)
        for node in NODES:
            slurm_gpu("sim", "reset", node, env=self.lab.env)
        wait_for("no node rebooting", lambda: not any(slurm.node(n).has(*REBOOTING) for n in NODES), timeout=120)
        for node in NODES:
            info = slurm.node(node)
            if (info.drained or info.down) and info.reason.startswith(PREFIX):
                slurm.resume(node)
            ledgers.save(self.state_dir, node, ledgers.Ledger())
            forget_kept(self.lab, node)
        time.sleep(2)          # resumed nodes are idle* until the next ping
        return False

    def ledger(self, node: str):
        return ledgers.load(self.state_dir, node)

    def back_in_service(self, slurm, node: str) -> None:
        """Wait until Slurm has the node in service again and the ledger closed its episode."""
        wait_for(f"{node} back in service", lambda: (lambda info: not info.drained and not info.down
                                                     and not info.has(*REBOOTING))(slurm.node(node)), timeout=120)
        wait_for("the episode closed", lambda: any(e.outcome == "resumed" for entry in
                                                   self.ledger(node).entries.values()
                                                   for e in entry.episodes), timeout=60)


def test_a_gpu_lost_once_is_rebooted_through_slurm_and_back_in_service_by_itself(lab):
    slurm = backend(lab)
    with Remediating(lab) as remediating:
        before = boot_time(lab, "gpu2")
        assert before
        result = slurm_gpu("sim", "inject", "gpu2", "gpu.3.state=lost", env=lab.env)
        assert result.returncode == 0, result.stderr
        wait_for("gpu2 drained by us", lambda: slurm.node("gpu2").reason.startswith(PREFIX + "gpu.lost gpu3"),
                 timeout=60)
        wait_for("gpu2 rebooted (a new BootTime)", lambda: boot_time(lab, "gpu2") not in ("", before), timeout=180)
        # Nobody acted: the reboot is the health check's, counted in the ledger, the episode closed.
        remediating.back_in_service(slurm, "gpu2")
        [entry] = remediating.ledger("gpu2").entries.values()
        assert len(entry.reboots) == 1 and entry.cause == "gpu.lost gpu3"


def test_a_lemon_gets_exactly_max_reboots_then_is_drained_for_inspection_and_left_alone(lab):
    slurm = backend(lab)
    with Remediating(lab, max_reboots=2) as remediating:
        result = slurm_gpu("sim", "inject", "gpu3", "gpu.5.state=lost", "gpu.5.lost_every_boot=true", env=lab.env)
        assert result.returncode == 0, result.stderr
        boots = {boot_epoch(lab, "gpu3")}

        def inspected():
            boots.add(boot_epoch(lab, "gpu3"))
            info = slurm.node("gpu3")
            return info.drained and " reboots:2; inspect: " in info.reason and not info.has(*REBOOTING)
        wait_for("gpu3 drained for inspection", inspected, timeout=420, every=1)
        [entry] = remediating.ledger("gpu3").entries.values()
        assert len(entry.reboots) == 2
        assert distinct_boots(boots) == 3              # the first boot and the two the reboots made
        settled = boot_epoch(lab, "gpu3")
        boot_id = SimNode(remediating.state_dir, "gpu3").boot_id()
        reason = slurm.node("gpu3").reason
        time.sleep(25)                                 # two more health-check intervals: left alone
        info = slurm.node("gpu3")
        assert info.drained and info.reason == reason
        assert SimNode(remediating.state_dir, "gpu3").boot_id() == boot_id
        assert distinct_boots([settled, boot_epoch(lab, "gpu3")]) == 1
        assert len(remediating.ledger("gpu3").entries[next(iter(remediating.ledger("gpu3").entries))].reboots) == 2


def test_a_storm_on_every_node_keeps_the_reboot_budget(lab):
    slurm = backend(lab)
    with Remediating(lab, max_rebooting_nodes=1):
        before = {node: boot_time(lab, node) for node in NODES}
        for node in NODES:
            result = slurm_gpu("sim", "inject", node, "gpu.0.state=lost", env=lab.env)
            assert result.returncode == 0, result.stderr
        most = 0
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            now_rebooting = [n.name for n in slurm.nodes() if n.has(*REBOOTING)]
            most = max(most, len(now_rebooting))
            if all(boot_time(lab, node) != before[node] for node in NODES) and not now_rebooting:
                break
            time.sleep(0.5)
        assert most == 1
        assert all(boot_time(lab, node) != before[node] for node in NODES), "not every node was rebooted"


@pytest.mark.every_release
def test_a_gpu_lost_once_is_reset_without_a_reboot_and_back_in_service_by_itself(lab):
    slurm = backend(lab)
    # The node's slurm-gpu-watch runs throughout: it must hold no GPU open (the simulated reset
    # refuses while a process has NVML open on the node; the test below shows it).
    watcher = watchers.pid(lab.paths, "gpu1")
    assert watcher is not None, "the lab runs no slurm-gpu-watch for gpu1"
    with Remediating(lab, gpu_reset="true") as remediating:
        boot_id = SimNode(remediating.state_dir, "gpu1").boot_id()
        injected = time.time()
        result = slurm_gpu("sim", "inject", "gpu1", "gpu.2.state=lost", env=lab.env)
        assert result.returncode == 0, result.stderr
        wait_for("gpu1 drained by us", lambda: slurm.node("gpu1").reason.startswith(PREFIX + "gpu.lost gpu2"),
                 timeout=60)
        # The reset is the health check's (the simulated node's nvidia-smi), then the next run
        # finds the GPU back and resumes the node: nobody acts, Slurm reboots nothing.
        remediating.back_in_service(slurm, "gpu1")
        [entry] = remediating.ledger("gpu1").entries.values()
        [episode] = entry.episodes
        assert entry.cause == "gpu.lost gpu2" and entry.reboots == [] and len(episode.resets) == 1
        assert SimNode(remediating.state_dir, "gpu1").boot_id() == boot_id
        # Slurm saw no reboot: the node's BootTime (shown again once the resumed node answers; it
        # moves by a second when slurmd restarts) is still from before the fault.
        wait_for("gpu1's BootTime shown", lambda: boot_time(lab, "gpu1") not in ("", "None"), timeout=60)
        assert time.mktime(time.strptime(boot_time(lab, "gpu1"), "%Y-%m-%dT%H:%M:%S")) < injected

    assert watchers.pid(lab.paths, "gpu1") == watcher


# A process with NVML initialised on the simulated node, as the watcher's event thread was.
HOLD_OPEN = ("import sys; from healthcheck.sim import sim_pynvml as nvml; nvml._bind(sys.argv[1]); nvml.nvmlInit(); "
             "print('open', flush=True); sys.stdin.read()")


@pytest.mark.every_release
def test_a_gpu_reset_refused_while_a_process_holds_the_gpus_falls_back_to_a_reboot(lab):
    """The test above fails when something holds the node's GPUs open: the reset is refused,
    counted, and the reboot follows (docs/remediation.md)."""
    slurm = backend(lab)
    with Remediating(lab, gpu_reset="true") as remediating:
        node = SimNode(remediating.state_dir, "gpu1")
        holder = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, node.live_path], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "open" and holder.pid in node.holders()
            before = boot_time(lab, "gpu1")
            assert before
            result = slurm_gpu("sim", "inject", "gpu1", "gpu.2.state=lost", env=lab.env)
            assert result.returncode == 0, result.stderr
            wait_for("gpu1 drained by us", lambda: slurm.node("gpu1").reason.startswith(PREFIX + "gpu.lost gpu2"),
                     timeout=60)
            wait_for("gpu1 rebooted (a new BootTime)", lambda: boot_time(lab, "gpu1") not in ("", before),
                     timeout=180)
            remediating.back_in_service(slurm, "gpu1")
            [entry] = remediating.ledger("gpu1").entries.values()
            assert entry.cause == "gpu.lost gpu2" and len(entry.reboots) == 1
            assert sum(len(episode.resets) for episode in entry.episodes) == 1      # tried, refused
        finally:
            holder.kill()
            holder.wait()
