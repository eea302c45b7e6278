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


def test_a_clean_start_wipes_what_earlier_runs_left_and_nothing_else(tmp_path):
    """`slurm-gpu lab up --clean` (what tests/lab/conftest.py runs): the hooks' state with its
    outbox, jobs' output, slurmctld's state, the slurmd spools and the database go; the config,
    the logs and the munge key stay. Proven on the real lab by tests/lab/test_lab_down.py."""
    import pytest

    from slurm_hooks.lab import LabError, cluster
    from slurm_hooks.lab.paths import LabPaths

    lab = LabPaths(str(tmp_path / "lab"))
    junk = [os.path.join(lab.state, "outbox", "524_1.json"), os.path.join(lab.state, "health", "gpu1.json"),
            os.path.join(lab.ctld_state, "job_state"), os.path.join(lab.spool, "gpu1", "cred_state"),
            os.path.join(lab.mysql_data, "slurm_acct_db", "job_table.ibd"), os.path.join(lab.jobs, "out.txt")]
    kept = [lab.slurm_conf, os.path.join(lab.log, "slurmctld.log")]
    for path in junk + kept:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write('{"queued_at": "x"')
    said = []
    removed = cluster.wipe_state(lab, said.append)
    assert not any(os.path.lexists(path) for path in junk) and all(os.path.exists(path) for path in kept)
    assert set(removed) == {lab.state, lab.jobs, lab.ctld_state, lab.spool, lab.mysql} and said
    os.symlink(str(tmp_path), lab.state)                    # never followed
    with pytest.raises(LabError, match="symbolic link"):
        cluster.wipe_state(lab, said.append)
    assert os.path.exists(lab.slurm_conf)


def test_lab_up_has_a_clean_option():
    result = invoke("up", "--help")
    assert result.exit_code == 0 and "--clean" in result.output
