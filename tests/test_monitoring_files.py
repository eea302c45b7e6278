"""The shipped Prometheus rules and Grafana dashboard: promtool accepts the rules and their unit
tests pass, every alert has a unit test (it fires; a healthy node and one drained by someone else
stay silent) and a runbook_url to a docs section that exists, and both name exactly the metrics
the health check writes (the lab proves they exist in a real Prometheus:
tests/lab/test_lab_monitoring.py)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from healthcheck.health.outputs import families
from healthcheck.watch.series import Snapshot
from healthcheck.watch.series import families as watch_families

from .conftest import ETC, ROOT
from .test_health_run import Node

RULES = os.path.join(ETC, "prometheus", "slurm-gpu-hooks.rules.yml")
RULES_TESTS = os.path.join(ROOT, "tests", "data", "prometheus", "slurm-gpu-hooks.rules.test.yml")
DASHBOARD = os.path.join(ETC, "grafana", "slurm-gpu-hooks.json")
# The health check's series and slurm-gpu-watch's (healthcheck/watch/series.py).
METRIC = re.compile(r"\bslurm_gpu_(?:health|watch)_[a-z_]+")
# runbook_url is a docs page's section as a path from the source tree's root (how the project names
# its docs everywhere), its anchor as GitHub renders the heading.
RUNBOOK = re.compile(r"^docs/([\w-]+\.md)#([\w-]+)$")
# The nodes every alert's unit test must hold series for, and must stay silent on.
SILENT_NODES = ("healthy", "foreign")


def promtool() -> str:
    found = shutil.which("promtool", path="/usr/bin:/usr/local/bin:" + os.environ.get("PATH", ""))
    if found is None:
        pytest.fail("promtool not found: install Debian's prometheus package (scripts/bootstrap.sh does)",
                    pytrace=False)
    return found


def written_metrics(tmp_path):
    """The series names in the health check's and the watcher's textfiles (a histogram's _bucket,
    _sum and _count)."""
    written = families(Node(tmp_path).run_once()) + watch_families(Snapshot())
    return {name for family in written for name in family.series_names()}


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
            "SlurmGpuSlurmUnreachable", "SlurmGpuWatcherStalled"} <= set(alerts)


def test_the_dashboard_queries_exactly_the_metrics_the_tool_writes(tmp_path):
    board, exprs = dashboard_exprs()
    queried = {name for expr in exprs for name in METRIC.findall(expr)}
    assert queried == written_metrics(tmp_path)
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in board["panels"])


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def alerts_of(rules_text):
    """{alert: (expr, runbook_url or None)} from the rules file, one alert per ``- alert:`` block."""
    found = {}
    for block in re.split(r"^\s+- alert: ", rules_text, flags=re.M)[1:]:
        name = block.split("\n", 1)[0].strip()
        expr = re.search(r"^\s+expr: (.+)$", block, flags=re.M)
        url = re.search(r"^\s+runbook_url: (.+)$", block, flags=re.M)
        found[name] = (expr.group(1) if expr else "", url.group(1).strip().strip("\"'") if url else None)
    return found


def github_anchors(markdown):
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces to '-',
    a repeated one numbered)."""
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def alert_problems(rules_text, tests_text, docs_dir):
    """What the rules and their unit tests lack: an alert without a case that fires, without series
    of its metrics for the healthy and the foreign-drain node, or without a runbook_url to a docs
    section that exists. One line each; empty when all is there."""
    problems = []
    cases = re.findall(r"^\s+alertname: (\S+)\s*\n\s+exp_alerts:(.*?)(?=^\s+- eval_time:|\Z)",
                       tests_text, flags=re.M | re.S)
    fires = {name for name, expected in cases if expected.strip() != "[]"}
    series = re.findall(r"^\s+- series: '([\w:]+)\{([^}]*)\}'", tests_text, flags=re.M)
    for alert, (expr, url) in alerts_of(rules_text).items():
        if alert not in fires:
            problems.append(f"{alert}: no promtool case in which it fires")
        metrics = {name for name, _ in series if re.search(rf"\b{name}\b", expr)}
        if not metrics:
            problems.append(f"{alert}: the unit tests have no series its expression reads")
        for metric in sorted(metrics):
            # A node's series by its node label; node_exporter's own metrics have only instance.
            label = "node" if any(name == metric and 'node="' in labels for name, labels in series) else "instance"
            for node in SILENT_NODES:
                if not any(name == metric and re.search(rf'\b{label}="{node}[":]', labels)
                           for name, labels in series):
                    problems.append(f"{alert}: no {metric} series for the {node} node")
        where = RUNBOOK.match(url or "")
        if url is None:
            problems.append(f"{alert}: no runbook_url")
        elif where is None:
            problems.append(f"{alert}: runbook_url {url} is not docs/<page>.md#<anchor>")
        else:
            page = os.path.join(docs_dir, where.group(1))
            if not os.path.isfile(page) or where.group(2) not in github_anchors(_read(page)):
                problems.append(f"{alert}: runbook_url {url} names no section of the docs")
    return problems


def test_every_alert_has_a_unit_test_and_a_runbook_that_exists():
    assert alert_problems(_read(RULES), _read(RULES_TESTS), os.path.join(ROOT, "docs")) == []


@pytest.mark.parametrize("change, said", [
    (lambda rules, tests: (rules, tests.replace("alertname: SlurmGpuActionsOff", "alertname: Other")),
     "SlurmGpuActionsOff: no promtool case in which it fires"),
    (lambda rules, tests: (re.sub(r"^\s+runbook_url: docs/operations.md#slurmgpuscontrolfailing\n", "", rules,
                                  flags=re.M), tests),
     "SlurmGpuScontrolFailing: no runbook_url"),
    (lambda rules, tests: (rules.replace("#slurmgpunodedrained", "#slurmgpunodedrain"), tests),
     "SlurmGpuNodeDrained: runbook_url docs/operations.md#slurmgpunodedrain names no section of the docs"),
    (lambda rules, tests: (rules.replace("docs/operations.md#slurmgpunodedrained", "docs/gone.md#slurmgpunodedrained"),
                           tests),
     "SlurmGpuNodeDrained: runbook_url docs/gone.md#slurmgpunodedrained names no section of the docs"),
    (lambda rules, tests: (rules, tests.replace('slurm_gpu_health_slurm_up{node="foreign"', 'slurm_gpu_health_slurm_up{node="x"')),
     "SlurmGpuSlurmUnreachable: no slurm_gpu_health_slurm_up series for the foreign node"),
    (lambda rules, tests: (rules, tests.replace('slurm_gpu_watch_last_look_timestamp_seconds{node="healthy"',
                                                'slurm_gpu_watch_last_look_timestamp_seconds{node="x"')),
     "SlurmGpuWatcherStalled: no slurm_gpu_watch_last_look_timestamp_seconds series for the healthy node"),
])
def test_the_alert_check_finds_what_is_missing(change, said):
    """The check above can fail: each thing it holds, taken away from the shipped files."""
    rules, tests = change(_read(RULES), _read(RULES_TESTS))
    assert said in alert_problems(rules, tests, os.path.join(ROOT, "docs"))


def test_promtool_fails_when_an_alert_fires_for_the_foreign_drain(tmp_path):
    """The unit tests hold silence: the foreign node drained by us too fails them."""
    rules = tmp_path / "etc" / "prometheus"
    tests = tmp_path / "tests" / "data" / "prometheus"
    rules.mkdir(parents=True)
    tests.mkdir(parents=True)
    shutil.copy(RULES, rules)
    text = _read(RULES_TESTS).replace("""'slurm_gpu_health_drained{node="foreign",instance="foreign:9100",job="node"}'
        values: '0x40'""", """'slurm_gpu_health_drained{node="foreign",cause="x",instance="foreign:9100",job="node"}'
        values: '1x40'""")
    (tests / os.path.basename(RULES_TESTS)).write_text(text)
    done = subprocess.run([promtool(), "test", "rules", str(tests / os.path.basename(RULES_TESTS))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "foreign" in done.stdout + done.stderr


def test_the_demos_alert_is_the_drained_nodes_own():
    """The demo printed a firing SlurmGpuNodeDrained of a node resumed two minutes earlier instead of
    the node it had just drained: `slurm-gpu lab alert NAME NODE` keeps that node's alone."""
    from slurm_hooks.lab import monitoring

    def alert(node, state="firing", name="SlurmGpuNodeDrained"):
        return {"labels": {"alertname": name, "node": node, "cause": "gpu.ecc.uncorrectable gpu3"},
                "annotations": {"summary": f"{node} drained"}, "state": state}
    alerts = [alert("gpu1"), alert("gpu2", "pending"), alert("gpu2", name="SlurmGpuActionsOff"), "junk"]
    assert monitoring.firing_for(alerts, "SlurmGpuNodeDrained", "gpu2") == []
    alerts.append(alert("gpu2"))
    [found] = monitoring.firing_for(alerts, "SlurmGpuNodeDrained", "gpu2")
    assert monitoring.alert_line(found) == ("FIRING SlurmGpuNodeDrained node=gpu2 cause=gpu.ecc.uncorrectable gpu3: "
                                            "gpu2 drained")
    with open(os.path.join(ROOT, "scripts", "demo"), encoding="utf-8") as handle:
        demo = handle.read()
    assert "slurm-gpu lab alert SlurmGpuNodeDrained gpu2" in demo and "slurm-gpu sim inject gpu2" in demo
