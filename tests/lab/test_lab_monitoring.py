"""The lab's monitoring: Debian's node_exporter reads the lab nodes' textfiles (as its own user),
Debian's Prometheus scrapes it with the shipped rules loaded, a node the health check drains
for a double-bit ECC error fires SlurmGpuNodeDrained through Prometheus's HTTP API, and records
that cannot reach accounting (slurmdbd stopped) fire SlurmGpuRecordsNotDelivered; every lab
node's slurm-gpu-watch is in Prometheus too, following its log."""
from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
import urllib.request

import pytest

from healthcheck.config import Config
from healthcheck.records import admin_comment as ac
from healthcheck.records import outbox, outbox_stats
from slurm_hooks.lab import daemons, monitoring

from .conftest import slurm_gpu
from .conftest import wait_for as poll
from .test_lab_job_classes import admin_comment, submit, wait_ended

from .test_lab_healthcheck import DBE, NODES, backend, clean, gpu, sim, wait_for  # noqa: F401 (fixtures)

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(ROOT, "etc", "grafana", "slurm-gpu-hooks.json")


def api(lab, path: str, **params) -> dict:
    base = lab.env["SLURM_GPU_LAB_PROMETHEUS"]
    url = f"{base}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as answer:
        doc = json.load(answer)
    assert doc["status"] == "success", doc
    return doc["data"]


def names_in_prometheus(lab) -> set:
    result = query(lab, 'count by (__name__) ({__name__=~"slurm_gpu_(health|watch)_.+"})')
    return {row["metric"]["__name__"] for row in result}


def query(lab, expr: str) -> list:
    """An instant query's result vector."""
    return api(lab, "/api/v1/query", query=expr)["result"]


def firing(lab, alertname: str, node: str):
    """The alert ``alertname`` firing for ``node`` in the lab's Prometheus, or None."""
    for alert in api(lab, "/api/v1/alerts")["alerts"]:
        labels = alert["labels"]
        if labels.get("alertname") == alertname and labels.get("node") == node and alert["state"] == "firing":
            return alert
    return None


def test_lab_env_exports_the_prometheus_url_on_localhost(lab):
    assert lab.env["SLURM_GPU_LAB_PROMETHEUS"] == f"http://127.0.0.1:{monitoring.PROMETHEUS_PORT}"
    rules = api(lab, "/api/v1/rules")
    loaded = {rule["name"] for group in rules["groups"] for rule in group["rules"]}
    assert {"SlurmGpuNodeDrained", "SlurmGpuDrainBudgetBlocked", "SlurmGpuHealthChecksNotRunning",
            "SlurmGpuSlurmUnreachable"} <= loaded


def test_every_metric_the_dashboard_queries_is_in_the_labs_prometheus(lab):
    from tests.test_monitoring_files import METRIC, dashboard_exprs

    _, exprs = dashboard_exprs()
    queried = {name for expr in exprs for name in METRIC.findall(expr)}
    present = wait_for("every dashboard metric in Prometheus",
                       lambda: (lambda found: found if queried <= found else None)(names_in_prometheus(lab)), 90)
    assert queried <= present
    # ... for every lab node, read by node_exporter as its own user
    nodes = {row["metric"]["node"] for row in query(lab, "slurm_gpu_health_last_run_timestamp_seconds")}
    assert set(NODES) <= nodes
    for expr in exprs:                       # and every panel's query is one Prometheus evaluates
        # (Grafana's label_values(METRIC, LABEL) of the node variable: its METRIC)
        expr = re.sub(r"^label_values\((\w+), \w+\)$", r"\1", expr)
        query(lab, expr.replace("$node", ".*"))


def test_every_lab_nodes_watcher_is_in_prometheus_following_its_log(lab):
    """slurm-gpu-watch's own textfile (one per lab node, beside the health check's), read by
    node_exporter: each watcher's last look is recent, and SlurmGpuWatcherStalled is silent."""
    def fresh():
        rows = query(lab, "time() - slurm_gpu_watch_last_look_timestamp_seconds < 180")
        found = {row["metric"]["node"] for row in rows}
        return found if set(NODES) <= found else None

    assert set(NODES) <= wait_for("every lab watcher's series in Prometheus", fresh, 150)
    for node in NODES:
        assert firing(lab, "SlurmGpuWatcherStalled", node) is None


def test_a_node_drained_for_a_dbe_fires_slurm_gpu_node_drained(lab, gpu, clean):
    slurm = backend(lab)
    sim(gpu, "inject", "gpu2", DBE)
    wait_for("gpu2 drained", lambda: slurm.node("gpu2").drained)

    alert = wait_for("SlurmGpuNodeDrained firing for gpu2", lambda: firing(lab, "SlurmGpuNodeDrained", "gpu2"), 90)
    assert alert["labels"]["cause"] == "gpu.ecc.uncorrectable gpu3"
    assert "gpu2" in alert["annotations"]["summary"]
    # the demo's payoff: `lab alert` prints gpu2's alert and no other node's
    shown = slurm_gpu("lab", "alert", "SlurmGpuNodeDrained", "gpu2", env=lab.env)
    assert shown.returncode == 0 and shown.stdout.startswith("FIRING SlurmGpuNodeDrained node=gpu2 "), shown
    assert [line for line in shown.stdout.splitlines() if "node=gpu2 " not in line] == []
    decision = query(lab, 'slurm_gpu_health_drained{node="gpu2"} == 1')
    assert decision and decision[0]["metric"]["cause"] == "gpu.ecc.uncorrectable gpu3"


def test_records_that_wait_for_accounting_fire_slurm_gpu_records_not_delivered_until_delivered(lab):
    """slurmdbd stopped, a job ends on gpu2: its entry waits in the outbox. The shipped rule fires
    once the oldest entry has waited 10 minutes; here the entry's queue time (its file's mtime,
    what the metric reads) is set 11 minutes back instead of stopping slurmdbd that long. slurmdbd
    back, the entry delivered: the alert clears."""
    state_dir = Config.load(lab.env["SLURM_GPU_HOOKS_CONFIG"]).state_dir
    queue = outbox_stats.outbox_dir(state_dir)
    dbd = daemons.by_name(lab.paths, "slurmdbd")
    try:
        assert daemons.stop(lab.paths, [dbd], lambda line: None) == ["slurmdbd"]
        job = submit(lab, "-w", "gpu2", "--gres=gpu:1", "--wrap", "true")
        wait_ended(lab, job)
        wait_for("the entry queued while accounting is down", lambda: job in set(outbox.pending(state_dir)), 30)
        long_ago = time.time() - 660
        for name in os.listdir(queue):
            if outbox_stats.is_queue_file(name):
                os.utime(os.path.join(queue, name), (long_ago, long_ago))
        alert = wait_for("SlurmGpuRecordsNotDelivered firing for gpu2",
                         lambda: firing(lab, "SlurmGpuRecordsNotDelivered", "gpu2"), 120)
        assert alert["annotations"]["runbook_url"].startswith("docs/operations.md#")
    finally:
        assert daemons.start(lab.paths, dbd, lambda line: None) or dbd.pid(lab.paths) is not None

    def delivered():
        if ac.parse(admin_comment(lab, job)):
            return True
        submit(lab, "-w", "gpu3", "--wrap", "true")      # any later hook run delivers what is queued
        time.sleep(3)
        return False
    poll("the queued entry in accounting", delivered, timeout=120, every=1)
    poll("SlurmGpuRecordsNotDelivered cleared for gpu2",
             lambda: firing(lab, "SlurmGpuRecordsNotDelivered", "gpu2") is None, 120, every=2)
    assert slurm_gpu("lab", "status", env=lab.env).returncode == 0
