"""slurm-gpu-watch on the lab (one per simulated node, started by ``lab up``): with the health
interval long, an Xid 79 on an idle node drains it through the watcher, not the interval; with
the watcher killed, the periodic health check still drains. Times are printed, never asserted
(bench/run's ``xid_to_drain_s`` is the measurement)."""
from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager

import pytest

from slurm_hooks.lab import daemons as D
from slurm_hooks.lab import watchers

from .conftest import wait_for
from .test_lab_healthcheck import XID79, Gpu, backend, pci, restore, sim

pytestmark = pytest.mark.lab

LONG_INTERVAL = 300


def _drained(slurm, node: str, limit: float):
    return wait_for(f"{node} drained", lambda: (lambda n: n if n.drained else None)(slurm.node(node)),
                    timeout=limit, every=0.1)


def _conf_interval(lab) -> str:
    with open(lab.paths.slurm_conf, encoding="utf-8") as handle:
        return next(line.strip() for line in handle if line.startswith("HealthCheckInterval="))


@contextmanager
def long_health_interval(lab, cli, gpu: Gpu, node: str):
    """The lab with HealthCheckInterval LONG_INTERVAL and ``node`` healthy; afterwards ``node``
    mended and the lab's usual interval back."""
    up = cli("lab", "up", "--health-interval", str(LONG_INTERVAL), timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        assert _conf_interval(lab) == f"HealthCheckInterval={LONG_INTERVAL}"
        restore(lab, gpu, node)
        yield
    finally:
        restore(lab, gpu, node)
        back = cli("lab", "up", timeout=300)
        assert back.returncode == 0, back.stdout + back.stderr
    assert _conf_interval(lab) == "HealthCheckInterval=10"


def test_with_the_watcher_an_xid_79_on_an_idle_node_drains_it_long_before_the_interval(lab, cli):
    gpu = Gpu(lab, cli)
    with long_health_interval(lab, cli, gpu, "gpu1"):
        slurm = backend(lab)
        assert not slurm.node("gpu1").drained
        assert watchers.pid(lab.paths, "gpu1") is not None
        time.sleep(3)          # slurmd's start-up health check (it runs once when slurmd starts) is done
        began = time.time()
        sim(gpu, "inject", "gpu1", "--log", XID79.format(pci=pci(lab, "gpu1", 0)))
        # Slurm's next health check is up to 300 s away: a drain within a minute is the watcher's.
        node = _drained(slurm, "gpu1", 60)
        print(f"gpu1 drained {time.time() - began:.1f} s after the Xid 79 line (HealthCheckInterval "
              f"{LONG_INTERVAL} s)")
        assert "xid:79" in node.reason and node.reason.startswith("gpu-hooks: v1 kernel.xid")
        with open(watchers.logfile(lab.paths, "gpu1"), encoding="utf-8", errors="replace") as handle:
            assert "gpu1: kernel.xid: Xid 79" in handle.read()


def test_a_killed_watcher_leaves_the_periodic_health_check_draining(lab, cli):
    gpu = Gpu(lab, cli)
    up = cli("lab", "up", timeout=300)          # the watchers run (lab up starts any that does not)
    assert up.returncode == 0, up.stdout + up.stderr
    assert _conf_interval(lab) == "HealthCheckInterval=10"
    restore(lab, gpu, "gpu2")
    slurm = backend(lab)
    watcher = watchers.pid(lab.paths, "gpu2")
    assert watcher is not None
    os.kill(watcher, signal.SIGKILL)
    wait_for("the watcher of gpu2 gone", lambda: not D.alive(watcher), timeout=10)
    try:
        assert watchers.pid(lab.paths, "gpu2") is None
        sim(gpu, "inject", "gpu2", "--log", XID79.format(pci=pci(lab, "gpu2", 1)))
        node = _drained(slurm, "gpu2", 60)
        assert "xid:79" in node.reason
        assert watchers.pid(lab.paths, "gpu2") is None         # nobody started it again
    finally:
        restore(lab, gpu, "gpu2")
        again = cli("lab", "up", timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
    assert watchers.pid(lab.paths, "gpu2") is not None         # `lab up` starts it again


def test_with_the_watcher_a_node_the_remediation_rebooted_is_back_long_before_the_interval(lab, cli):
    """[remediate] on, HealthCheckInterval 300 s: an Xid 79 drains an idle node (through the
    watcher), the same health check asks Slurm to reboot it, and from 24.11 our drain outlives the
    reboot; slurmd's start-up run judges nothing (Slurm still shows the reboot), so the node would
    wait for the next interval. The watcher sees the new boot with our drain waiting for it and
    runs the health check until one has judged the node: back in service well before 300 s."""
    from .test_lab_remediate import REBOOTING, Remediating, boot_time

    gpu = Gpu(lab, cli)
    with long_health_interval(lab, cli, gpu, "gpu3"):
        slurm = backend(lab)
        with Remediating(lab) as remediating:
            time.sleep(3)          # slurmd's start-up health check is done
            before = boot_time(lab, "gpu3")
            sim(gpu, "inject", "gpu3", "--log", XID79.format(pci=pci(lab, "gpu3", 2)))
            _drained(slurm, "gpu3", 60)
            wait_for("gpu3 rebooted (a new BootTime)", lambda: boot_time(lab, "gpu3") not in ("", "None", before),
                     timeout=120)
            rebooted = time.time()
            # The interval is 300 s: a node back within two minutes of its reboot is the watcher's doing.
            wait_for("gpu3 back in service", lambda: (lambda info: not info.drained and not info.down
                                                      and not info.has(*REBOOTING))(slurm.node("gpu3")), timeout=120)
            print(f"gpu3 back in service {time.time() - rebooted:.1f} s after its new BootTime was shown "
                  f"(HealthCheckInterval {LONG_INTERVAL} s)")
            [entry] = remediating.ledger("gpu3").entries.values()
            assert len(entry.reboots) == 1 and entry.episodes[-1].outcome == "resumed"
            with open(watchers.logfile(lab.paths, "gpu3"), encoding="utf-8", errors="replace") as handle:
                assert "a drain of ours waits for one" in handle.read()
