"""The shipped Prometheus rules and Grafana dashboard: promtool accepts the rules and their unit
tests pass, and both name exactly the metrics the health check writes (the lab proves they exist
in a real Prometheus: tests/lab/test_lab_monitoring.py)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from healthcheck.health.outputs import families

from .conftest import ETC, ROOT
from .test_health_run import Node

RULES = os.path.join(ETC, "prometheus", "slurm-gpu-hooks.rules.yml")
RULES_TESTS = os.path.join(ROOT, "tests", "data", "prometheus", "slurm-gpu-hooks.rules.test.yml")
DASHBOARD = os.path.join(ETC, "grafana", "slurm-gpu-hooks.json")
METRIC = re.compile(r"\bslurm_gpu_health_[a-z_]+")


def promtool() -> str:
    found = shutil.which("promtool", path="/usr/bin:/usr/local/bin:" + os.environ.get("PATH", ""))
    if found is None:
        pytest.fail("promtool not found: install Debian's prometheus package (scripts/bootstrap.sh does)",
                    pytrace=False)
    return found


def written_metrics(tmp_path):
    return {family.name for family in families(Node(tmp_path).run_once())}


def dashboard_exprs():
    with open(DASHBOARD, encoding="utf-8") as handle:
        board = json.load(handle)
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    exprs += [var["definition"] for var in board["templating"]["list"] if "definition" in var]
    return board, exprs


def test_promtool_check_rules_passes():
    done = subprocess.run([promtool(), "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_rules_fire_for_what_they_say(tmp_path):
    """promtool's rule unit tests: a drain, a budget block, Slurm unreachable, checks not running."""
    done = subprocess.run([promtool(), "test", "rules", RULES_TESTS], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_name_only_metrics_the_tool_writes(tmp_path):
    with open(RULES, encoding="utf-8") as handle:
        text = handle.read()
    exprs = re.findall(r"^\s+expr: (.+)$", text, flags=re.M)
    named = {name for expr in exprs for name in METRIC.findall(expr)}
    assert named and named <= written_metrics(tmp_path)
    alerts = re.findall(r"^\s+- alert: (\S+)$", text, flags=re.M)
    assert {"SlurmGpuNodeDrained", "SlurmGpuDrainBudgetBlocked", "SlurmGpuHealthChecksNotRunning",
            "SlurmGpuSlurmUnreachable"} <= set(alerts)


def test_the_dashboard_queries_exactly_the_metrics_the_tool_writes(tmp_path):
    board, exprs = dashboard_exprs()
    queried = {name for expr in exprs for name in METRIC.findall(expr)}
    assert queried == written_metrics(tmp_path)
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in board["panels"])
