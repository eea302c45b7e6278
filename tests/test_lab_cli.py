"""``slurm-gpu lab`` on bad input and on a lab that is not there: one line, non-zero, no
traceback. None of these start a daemon or install a package."""
from __future__ import annotations

import os

from click.testing import CliRunner

from slurm_hooks.cli import main


def invoke(*args):
    return CliRunner().invoke(main, ["lab", *args], catch_exceptions=False)


def test_lab_help_lists_the_contract_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for name in ("up", "down", "status", "env", "scenarios"):
        assert name in result.output


def test_env_prints_export_lines(tmp_path):
    lab = str(tmp_path / "my lab")
    result = invoke("env", "--dir", lab)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert f"export SLURM_CONF='{lab}/etc/slurm.conf'" in lines
    assert f"export SLURM_GPU_HOOKS_CONFIG='{lab}/etc/slurm-gpu-hooks.toml'" in lines


def test_env_honours_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_GPU_LAB_DIR", str(tmp_path))
    result = invoke("env")
    assert f"export SLURM_CONF={tmp_path}/etc/slurm.conf" in result.output.splitlines()


def test_unknown_scenario_is_one_line():
    result = CliRunner().invoke(main, ["lab", "scenarios", "--only", "no-such-thing"])
    assert result.exit_code == 2
    assert "unknown scenario no-such-thing" in result.output
    assert "Traceback" not in result.output


def test_scenarios_list():
    result = invoke("scenarios", "--list")
    assert result.exit_code == 0 and "TIMEOUT" in result.output and "NODE_FAIL" in result.output


def test_scenarios_without_a_lab_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["lab", "scenarios", "--dir", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert "not up" in result.output and "Traceback" not in result.output


def test_status_of_a_missing_lab_says_stopped(tmp_path):
    result = invoke("status", "--dir", str(tmp_path / "none"))
    assert result.exit_code == 3
    assert "slurmctld" in result.output and "stopped" in result.output


def test_down_of_a_missing_lab_is_a_no_op(tmp_path):
    if os.geteuid() != 0:
        result = CliRunner().invoke(main, ["lab", "down", "--dir", str(tmp_path / "none")])
        assert result.exit_code == 1 and "root" in result.output
        return
    result = invoke("down", "--dir", str(tmp_path / "none"))
    assert result.exit_code == 0 and "nothing to stop" in result.output


def test_up_refuses_a_lab_dir_slurm_cannot_name(tmp_path):
    result = CliRunner().invoke(main, ["lab", "up", "--dir", str(tmp_path / "with space")])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_up_refuses_a_symlinked_lab_dir(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    result = CliRunner().invoke(main, ["lab", "up", "--dir", str(tmp_path / "link")])
    assert result.exit_code == 1
    assert ("not a plain directory" in result.output or "root" in result.output)
    assert "Traceback" not in result.output
