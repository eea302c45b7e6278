"""The hook server on the real cluster (``[watch] serve_hooks``, the example config's setting):
one node's watcher (gpu2) restarted with serving on, at that node's socket (``[watch] hook_socket``
with ``{node}``; the lab's wrappers point each node's prolog, epilog and health check at
``$LAB/var/run/hooks/<node>.sock``). Through the real slurmd and scontrol: a healthy job's prolog
and epilog are served, a lost GPU makes the served prolog refuse the job and drain gpu2 with our
reason, and slurmd's periodic health check is served, while gpu1 (nothing listens at its socket)
runs its hooks in process. The watcher is put back as ``lab up`` starts it afterwards."""
from __future__ import annotations

import os
import time

import pytest

from healthcheck.hooklib.runlog import read_runs
from slurm_hooks.lab import daemons as D
from slurm_hooks.lab import watchers
from slurm_hooks.lab.render import toml_string

from .conftest import wait_for
from .test_lab_healthcheck import backend
from .test_lab_job_classes import inject, mend, prolog_sees_it_first, submit, wait_ended  # noqa: F401

# All three pass on 22.05, 24.11 and 26.05 (each run green on each, no rerun, 2026-12-01): every release.
pytestmark = [pytest.mark.lab, pytest.mark.every_release]

NODE = "gpu2"
OTHER = "gpu1"


def _log_since(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def entries(lab, hook: str, node: str, since: float, job=None):
    return [e for e in read_runs(lab.paths.state) if e.get("hook") == hook and e.get("node") == node
            and e.get("time", 0) >= since and (job is None or str(e.get("job_id")) == job)]


def job_entries(lab, node: str, job: str, since: float):
    """The prolog's and the epilog's entries of ``job`` on ``node``, once both are there."""
    found = {hook: entries(lab, hook, node, since, job) for hook in ("prolog", "epilog")}
    return found if all(found.values()) else None


@pytest.fixture
def serving(lab):
    """gpu2's watcher restarted on a config that serves the hooks; the usual one back after."""
    socket = lab.paths.hook_socket(NODE)
    config = os.path.join(os.path.dirname(lab.paths.hooks_config), "slurm-gpu-hooks.served.toml")
    with open(lab.paths.hooks_config, encoding="utf-8") as handle:
        text = handle.read()         # the lab's own config (sim profiles are relative to its directory)
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(text + "\n[watch]\nserve_hooks = true\n"
                     f"hook_socket = {toml_string(os.path.join(lab.paths.hook_sockets, '{node}.sock'))}\n")
    log = watchers.logfile(lab.paths, NODE)
    offset = os.path.getsize(log) if os.path.exists(log) else 0
    try:
        watchers.start(lab.paths, NODE, print, config=config)
        watcher = watchers.pid(lab.paths, NODE)
        assert watcher is not None and config in D.proc_cmdline(watcher)
        wait_for(f"{NODE}'s hook server listening at {socket}",
                 lambda: f"serving the hooks at {socket}" in _log_since(log, offset) and os.path.exists(socket))
        assert not os.path.exists(lab.paths.hook_socket(OTHER))
        yield watcher
    finally:
        watchers.start(lab.paths, NODE, print)         # the usual command line: restarted
        os.unlink(config)
    usual = watchers.pid(lab.paths, NODE)
    assert usual is not None and "--config" not in D.proc_cmdline(usual)
    assert not os.path.exists(socket)                  # the server went with its watcher


def test_a_healthy_jobs_prolog_and_epilog_are_served_on_the_serving_node_only(lab, serving):
    since = time.time() - 1
    job = submit(lab, "-w", NODE, "--gres=gpu:2", "--wrap", "true")
    other = submit(lab, "-w", OTHER, "--gres=gpu:2", "--wrap", "true")
    assert wait_ended(lab, job) == "COMPLETED"
    assert wait_ended(lab, other) == "COMPLETED"
    served = wait_for(f"job {job}'s prolog and epilog entries", lambda: job_entries(lab, NODE, job, since))
    for hook, found in served.items():
        assert [e.get("served") for e in found] == [True], (hook, found)
        assert found[0]["pid"] != serving, found                     # the server's child, not the watcher
    assert served["prolog"][0]["result"] == "ok" and served["prolog"][0]["job_gpus"], served
    in_process = wait_for(f"job {other}'s entries on {OTHER}", lambda: job_entries(lab, OTHER, other, since))
    for hook, found in in_process.items():
        assert len(found) == 1 and "served" not in found[0], (hook, found)


def test_slurmds_health_check_is_served_while_the_watcher_serves(lab, serving):
    since = time.time()
    found = wait_for(f"a served health-check run on {NODE}",
                     lambda: [e for e in entries(lab, "healthcheck", NODE, since) if e.get("served") is True])
    assert found[0]["pid"] != serving


def test_a_lost_gpu_makes_the_served_prolog_refuse_the_job_and_drain_the_node(lab, serving, prolog_sees_it_first):
    slurm = backend(lab)
    since = time.time() - 1
    inject(lab, NODE, "gpu.3.state=lost")
    try:
        job = submit(lab, "-w", NODE, "--gres=gpu:8", "--no-requeue", "--wrap", "touch /dev/null")
        assert wait_ended(lab, job) == "CANCELLED"
        reason = slurm.node(NODE).reason
        assert slurm.node(NODE).drained and reason.startswith("gpu-hooks: v1 gpu.lost gpu3"), reason
        refused = wait_for(f"job {job}'s prolog entry", lambda: entries(lab, "prolog", NODE, since, job))
        assert refused[0]["result"] == "bad-node" and refused[0].get("served") is True, refused
    finally:
        mend(lab, NODE)
