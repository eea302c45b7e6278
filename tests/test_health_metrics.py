"""The health check's Prometheus textfile: the decision metric says what --json says, the
drained-by-us and blocked-by-what gauges, and the file's place and mode (node_exporter runs as
its own user). The FakeBackend stands in for Slurm; the lab proves the same through a real
node_exporter and Prometheus (tests/lab/test_lab_monitoring.py)."""
from __future__ import annotations

import os
import re
import stat

from healthcheck.config import Config
from healthcheck.health.outputs import METRICS, REMEDIATION_FAMILIES, families, prometheus, textfile_path, write_all
from healthcheck.slurm.backend import SlurmError

from .fake_backend import FakeBackend
from .test_health_run import Node

DBE = ("gpu.3.ecc.volatile_uncorrected", 2)


def samples(text: str):
    """{(name, frozenset(labels)): value} of a textfile."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = re.match(r'^([a-z_]+)\{(.*)\} (\S+)$', line)
        assert match, line
        labels = frozenset(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', match.group(2)))
        out[(match.group(1), labels)] = float(match.group(3))
    return out


def value(text: str, name: str, **labels) -> float:
    wanted = frozenset({"node": "gpu2", **labels}.items())
    found = samples(text)
    assert (name, wanted) in found, f"{name}{dict(wanted)} not in:\n{text}"
    return found[(name, wanted)]


def test_a_drain_scontrol_refused_is_blocked_in_the_metrics_as_in_json(tmp_path):
    node = Node(tmp_path)

    class Refusing(FakeBackend):
        def drain(self, name, reason):
            self._call("drain", name, reason)
            raise SlurmError("scontrol: error: Invalid user for SlurmUser root")

    refusing = Refusing()
    for name in ("gpu1", "gpu2", "gpu3"):
        refusing.add_node(name)
    node.slurm = refusing
    node.sim.inject([DBE])
    result = node.run_once()
    assert result.to_json()["decision"] == "blocked"
    text = prometheus(result)
    assert value(text, "slurm_gpu_health_decision", decision="blocked") == 1
    assert value(text, "slurm_gpu_health_decision", decision="drain") == 0
    assert value(text, "slurm_gpu_health_blocked", by="scontrol-failed") == 1
    assert value(text, "slurm_gpu_health_blocked", by="budget") == 0
    assert value(text, "slurm_gpu_health_drained") == 0


def test_a_drain_shows_as_drained_for_its_cause_every_run_until_resumed(tmp_path):
    node = Node(tmp_path)
    node.sim.inject([DBE])
    first = prometheus(node.run_once())
    assert value(first, "slurm_gpu_health_decision", decision="drain") == 1
    assert value(first, "slurm_gpu_health_drained", cause="gpu.ecc.uncorrectable gpu3") == 1
    later = prometheus(node.run_once())             # nothing to do now: still drained, for that cause
    assert value(later, "slurm_gpu_health_decision", decision="none") == 1
    assert value(later, "slurm_gpu_health_drained", cause="gpu.ecc.uncorrectable gpu3") == 1
    node.sim.reset()
    resumed = prometheus(node.run_once())
    assert value(resumed, "slurm_gpu_health_decision", decision="resume") == 1
    assert value(resumed, "slurm_gpu_health_drained") == 0


def test_a_prolog_drain_is_drained_by_us_and_an_admin_drain_is_not(tmp_path):
    node = Node(tmp_path)
    node.slurm.drain("gpu2", "gpu-hooks: v1 gpu.lost gpu5; GPU 5 is not visible")
    node.sim.inject([("gpu.5.state", "lost")])
    text = prometheus(node.run_once())
    assert value(text, "slurm_gpu_health_drained", cause="gpu.lost gpu5") == 1
    node.sim.reset()
    node.slurm.resume("gpu2")
    node.slurm.drain("gpu2", "admin: new NVLink bridge")
    text = prometheus(node.run_once())
    assert value(text, "slurm_gpu_health_drained") == 0
    assert value(text, "slurm_gpu_health_left_alone") == 1


def test_blocked_by_budget_by_slurm_unreachable_and_by_actions_off(tmp_path):
    budget = Node(tmp_path / "budget", budget_max_nodes=1, budget_max_fraction=0)
    budget.slurm.drain("gpu1", "gpu-hooks: v1 gpu.lost gpu0; lost")
    budget.sim.inject([DBE])
    text = prometheus(budget.run_once())
    assert value(text, "slurm_gpu_health_blocked", by="budget") == 1
    assert value(text, "slurm_gpu_health_budget_blocks_total") == 1

    unreachable = Node(tmp_path / "unreachable")
    unreachable.sim.inject([DBE])
    unreachable.slurm.unreachable = "slurm_load_node: Unable to contact slurm controller"
    text = prometheus(unreachable.run_once())
    assert value(text, "slurm_gpu_health_blocked", by="slurm-unreachable") == 1
    assert value(text, "slurm_gpu_health_slurm_up") == 0
    assert value(text, "slurm_gpu_health_decision", decision="blocked") == 1

    off = Node(tmp_path / "off")
    off.config = Config.from_document(dict(off.config.document, drain={"enabled": False}), None)
    off.sim.inject([DBE])
    text = prometheus(off.run_once())
    assert value(text, "slurm_gpu_health_blocked", by="actions-off") == 1
    assert value(text, "slurm_gpu_health_slurm_up") == 1


def test_every_family_has_a_sample_on_a_healthy_run(tmp_path):
    """A dashboard or an alert over any family finds it on every node, healthy or not."""
    text = prometheus(Node(tmp_path).run_once())
    names = {name for name, _ in samples(text)}
    assert names == {name for family in families(Node(tmp_path / "again").run_once()) for name in family.series_names()}
    # those only with [remediate] and a drain not; a histogram is three series
    assert len(families(Node(tmp_path / "third").run_once())) == len(METRICS) - len(REMEDIATION_FAMILIES)


def test_the_textfile_is_0644_in_a_0755_directory_whatever_the_umask(tmp_path):
    node = Node(tmp_path / "node")
    result = node.run_once()
    where = str(tmp_path / "node-exporter" / "textfile")
    old = os.umask(0o077)
    try:
        problems = write_all(result, node.state_dir, where, use_syslog=False)
    finally:
        os.umask(old)
    assert problems == []
    path = textfile_path(where, "gpu2")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o755
    assert os.listdir(where) == [os.path.basename(path)]      # written by rename: no temporary left


def test_a_textfile_directory_node_exporter_cannot_read_is_said(tmp_path):
    node = Node(tmp_path / "node")
    where = tmp_path / "private"
    where.mkdir(mode=0o700)
    os.chmod(where, 0o700)
    problems = write_all(node.run_once(), node.state_dir, str(where), use_syslog=False)
    assert len(problems) == 1 and "mode 0700" in problems[0] and "node_exporter" in problems[0]


def test_docs_healthcheck_lists_exactly_the_metrics_written(tmp_path):
    from .conftest import ROOT

    with open(os.path.join(ROOT, "docs", "healthcheck.md"), encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `(slurm_gpu_health_[a-z_]+)` \|", section, flags=re.M))
    assert rows == {family.name for family in families(Node(tmp_path).run_once())} | set(REMEDIATION_FAMILIES)


def test_records_waiting_for_accounting_and_failed_deliveries_are_in_the_textfile(tmp_path):
    """The host's outbox as the health check sees it every run: entries queued, the oldest one's
    age, the deliveries that failed (kept by the delivery beside the queue)."""
    import time

    from healthcheck.records import outbox, store
    from healthcheck.records.outbox_stats import count_failures

    node = Node(tmp_path)
    healthy = prometheus(node.run_once())
    assert value(healthy, "slurm_gpu_health_outbox_entries") == 0
    assert value(healthy, "slurm_gpu_health_outbox_oldest_age_seconds") == 0
    assert value(healthy, "slurm_gpu_health_delivery_failures_total") == 0
    record = {"job_id": "31", "node": "gpu2", "class": "COMPLETED"}
    store.write_record(node.state_dir, record)
    queued = outbox.queue_record(node.state_dir, record)
    hour_ago = time.time() - 3600
    os.utime(queued, (hour_ago, hour_ago))
    count_failures(node.state_dir, 3)
    text = prometheus(node.run_once())
    assert value(text, "slurm_gpu_health_outbox_entries") == 1
    assert value(text, "slurm_gpu_health_outbox_oldest_age_seconds") >= 3600
    assert value(text, "slurm_gpu_health_delivery_failures_total") == 3
