"""``slurm-gpu drained`` and ``slurm-gpu resume``: what they print and refuse, over a FakeBackend
(the lab test runs them against the real Slurm)."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from healthcheck.actions import state as node_state
from .fake_backend import FakeBackend
from slurm_hooks.cli import drained_cmd, main

from .test_health_run import PROFILE

OURS = "gpu-hooks: v1 gpu.ecc.uncorrectable gpu3 dbe:2; GPU 3: 2 DBE"


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[gpu]\nbackend = "sim"\n[sim]\nprofile = "{PROFILE}"\n')
    fake = FakeBackend()
    fake.add_node("gpu1", "IDLE+DRAIN", "admin: PSU", "alice")
    fake.add_node("gpu2", "MIXED+DRAIN", OURS)
    fake.add_node("gpu3")
    monkeypatch.setattr(drained_cmd, "_backend", lambda config: fake)
    node_state.save(str(tmp_path), "gpu2", node_state.NodeState(drained=node_state.Drained(
        cause="gpu.ecc.uncorrectable gpu3", resume_mode="auto", boot_id="b", at=1.0, reason=OURS,
        evidence=[{"check": "gpu.ecc.uncorrectable", "gpu": 3}])))
    return str(config), fake


def run(*args):
    try:
        runner = CliRunner(mix_stderr=False)        # click < 8.2 mixes stderr in by default
    except TypeError:
        runner = CliRunner()
    return runner.invoke(main, list(args))


def test_drained_json_lists_ours_and_others(cluster):
    config, _ = cluster
    done = run("drained", "--config", config, "--json")
    assert done.exit_code == 0, done.stderr
    rows = {row["node"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"gpu1", "gpu2"}
    assert {"node", "state", "reason", "ours", "set_by", "since", "evidence"} <= set(rows["gpu1"])
    assert (rows["gpu1"]["ours"], rows["gpu1"]["set_by"], rows["gpu1"]["evidence"]) == (False, "alice", None)
    assert rows["gpu2"]["ours"] and rows["gpu2"]["evidence"] == [{"check": "gpu.ecc.uncorrectable", "gpu": 3}]
    assert rows["gpu2"]["cause"] == "gpu.ecc.uncorrectable gpu3" and "by itself" in rows["gpu2"]["recommended"]
    assert len(json.loads(run("drained", "--config", config, "--json", "--all").stdout)) == 3


def test_drained_for_people(cluster):
    config, _ = cluster
    out = run("drained", "--config", config).stdout
    assert "not ours" in out and "admin: PSU" in out
    assert [line.split()[0] for line in out.splitlines() if not line.startswith(" ")] == ["gpu1", "gpu2"]


def test_resume_refuses_someone_elses_drain_without_force(cluster):
    config, fake = cluster
    done = run("resume", "--config", config, "gpu1")
    assert done.exit_code == 1 and "not by this tool" in done.stderr and fake.writes() == []
    forced = run("resume", "--config", config, "gpu1", "--force")
    assert forced.exit_code == 0, forced.stderr
    assert fake.writes() == [("resume", "gpu1")]


def test_resume_rechecks_and_refuses_an_unhealthy_node(cluster, tmp_path):
    config, fake = cluster
    from healthcheck.sim.node import SimNode

    SimNode(str(tmp_path), "gpu2", PROFILE).inject([("gpu.3.ecc.volatile_uncorrected", 2)])
    done = run("resume", "--config", config, "gpu2")
    assert done.exit_code == 1 and "still unhealthy" in done.stderr and fake.writes() == []


def test_resume_of_our_healthy_node_forgets_our_record(cluster, tmp_path):
    config, fake = cluster
    done = run("resume", "--config", config, "gpu2")
    assert done.exit_code == 0, done.stderr
    assert fake.writes() == [("resume", "gpu2")]
    assert node_state.load(str(tmp_path), "gpu2").drained is None


def test_resume_of_a_node_in_service_does_nothing(cluster):
    config, fake = cluster
    done = run("resume", "--config", config, "gpu3")
    assert done.exit_code == 0 and "nothing to resume" in done.stdout and fake.writes() == []


def test_drained_escapes_control_characters_in_reasons(tmp_path, monkeypatch):
    """A reason is anyone's text (`scontrol update reason=...`): a terminal must not obey it."""
    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n')
    fake = FakeBackend()
    fake.add_node("gpu1", "IDLE+DRAIN", "evil\x1b]0;owned\x07\x1b[2J\x00end", "mallory\x1b[31m")
    monkeypatch.setattr(drained_cmd, "_backend", lambda config: fake)
    out = run("drained", "--config", str(config)).stdout
    assert "\x1b" not in out and "\x07" not in out and "\x00" not in out
    assert "evil\\x1b]0;owned\\x07\\x1b[2J\\x00end" in out and "mallory\\x1b[31m" in out
