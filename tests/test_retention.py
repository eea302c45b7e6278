"""The state dir pruned by age ([retention]) by the health check itself."""
from __future__ import annotations

import os
import time

from healthcheck.config import Config
from healthcheck.health.retention import DAY, STAMP, Retention, maybe_prune, prune

from .conftest import builtin_settings


def touch(path, age_days: float, now: float, text: str = "{}\n") -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)
    os.utime(path, (now - age_days * DAY, now - age_days * DAY))
    return path


def test_old_job_records_evidence_and_journals_go_and_new_ones_stay(tmp_path):
    now = time.time()
    state = str(tmp_path)
    touch(f"{state}/jobs/100/gpu1.json", 120, now)
    touch(f"{state}/jobs/100/gpu1.baseline.json", 121, now)
    touch(f"{state}/jobs/200/gpu1.json", 120, now)
    touch(f"{state}/jobs/200/_job.json", 2, now)              # a late job-level record keeps the job
    touch(f"{state}/jobs/300/gpu1.json", 1, now)
    touch(f"{state}/health/gpu1.evidence.jsonl.1", 400, now)
    touch(f"{state}/health/gpu1.evidence.jsonl", 10, now)
    touch(f"{state}/health/gpu1.json", 400, now)              # the node's state: never pruned
    touch(f"{state}/hook-runs/gpu1.jsonl.1", 100, now)
    touch(f"{state}/hook-runs/gpu9.jsonl", 100, now)          # a node gone long ago
    touch(f"{state}/hook-runs/gpu1.jsonl", 0, now)
    touch(f"{state}/outbox/100.json", 400, now)               # undelivered: never pruned
    pruned = prune(state, builtin_settings(Retention), now)
    assert pruned.jobs == ["100"]
    assert sorted(pruned.files) == ["health/gpu1.evidence.jsonl.1", "hook-runs/gpu1.jsonl.1", "hook-runs/gpu9.jsonl"]
    assert sorted(os.listdir(f"{state}/jobs")) == ["200", "300"]
    for kept in ("health/gpu1.evidence.jsonl", "health/gpu1.json", "hook-runs/gpu1.jsonl", "outbox/100.json"):
        assert os.path.exists(os.path.join(state, kept)), kept


def test_zero_keeps_forever_and_links_are_not_followed(tmp_path):
    now = time.time()
    state = str(tmp_path / "state")
    outside = touch(str(tmp_path / "outside" / "x.json"), 500, now)
    touch(f"{state}/jobs/1/gpu1.json", 500, now)
    os.symlink(os.path.dirname(outside), f"{state}/jobs/2")
    assert prune(state, builtin_settings(Retention, job_records_days=0, evidence_days=0, journal_days=0), now).jobs == []
    assert prune(state, builtin_settings(Retention), now).jobs == ["1"]
    assert os.path.exists(outside) and os.path.islink(f"{state}/jobs/2")


def test_pruning_runs_at_most_once_per_every_s(tmp_path):
    now = time.time()
    state = str(tmp_path)
    touch(f"{state}/jobs/1/gpu1.json", 200, now)
    keep = builtin_settings(Retention, every_s=DAY)
    assert maybe_prune(state, keep, now).jobs == ["1"]
    touch(f"{state}/jobs/2/gpu1.json", 200, now)
    assert maybe_prune(state, keep, now + 60) is None           # not due: one stat
    assert os.path.isdir(f"{state}/jobs/2")
    assert maybe_prune(state, keep, now + DAY + 1).jobs == ["2"]
    assert os.path.isfile(os.path.join(state, STAMP))


def test_the_health_check_prunes_as_a_post_decision_step(tmp_path):
    from healthcheck.health.run import POST_DECISION_STEPS

    from .test_health_run import Node

    node = Node(tmp_path)
    now = time.time()
    touch(f"{node.state_dir}/jobs/7/gpu2.json", 100, now)
    result = node.run_once()
    for step in POST_DECISION_STEPS:
        step(result, node.config)
    assert not os.path.exists(f"{node.state_dir}/jobs/7")
    keys = Config.from_document({}, None).section("retention")
    assert set(keys) == {"job_records_days", "evidence_days", "journal_days", "every_s"}

