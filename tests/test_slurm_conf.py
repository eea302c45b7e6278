"""``slurm-gpu slurm-conf``: the slurm.conf lines for this installation, and etc/slurm.conf.snippet."""
from __future__ import annotations

import os

import pytest

from slurm_hooks.cli.slurm_conf_cmd import HOOK_COMMANDS, installed_bin_dir

from .conftest import ETC, run_cli

STABLE = "/opt/slurm-gpu-hooks/current/bin"


def settings(text):
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_the_snippet_in_etc_is_what_the_command_prints_for_the_documented_layout():
    result = run_cli(["slurm-conf", "--bin-dir", STABLE])
    assert result.exit_code == 0, result.stderr
    with open(os.path.join(ETC, "slurm.conf.snippet"), encoding="utf-8") as handle:
        assert handle.read() == result.stdout, "regenerate: slurm-gpu slurm-conf --bin-dir " + STABLE


def test_the_lines_name_every_hook_by_absolute_path():
    result = run_cli(["slurm-conf", "--bin-dir", STABLE + "/", "--interval", "120", "--node-state", "IDLE"])
    assert result.exit_code == 0, result.stderr
    assert settings(result.stdout) == {
        "PrologFlags": "Alloc",
        "Prolog": f"{STABLE}/slurm-gpu-prolog",
        "Epilog": f"{STABLE}/slurm-gpu-epilog",
        "EpilogSlurmctld": f"{STABLE}/slurm-gpu-epilog",
        "TaskProlog": f"{STABLE}/slurm-gpu-taskprolog",
        "HealthCheckProgram": f"{STABLE}/slurm-gpu-healthcheck",
        "HealthCheckInterval": "120",
        "HealthCheckNodeState": "IDLE",
    }


def test_every_setting_has_its_comment_right_above():
    lines = run_cli(["slurm-conf", "--bin-dir", STABLE]).stdout.splitlines()
    for index, line in enumerate(lines):
        if line and not line.startswith("#"):
            assert index > 0 and lines[index - 1].startswith("# ") and len(lines[index - 1]) > 10, line


def test_by_default_the_paths_are_this_installation_and_exist():
    result = run_cli(["slurm-conf"])
    assert result.exit_code == 0, result.stderr
    found = settings(result.stdout)
    for key in ("Prolog", "Epilog", "EpilogSlurmctld", "TaskProlog", "HealthCheckProgram"):
        assert os.path.isabs(found[key]) and os.access(found[key], os.X_OK), found[key]


def _fake_install(root):
    real = root / "0.1.0" / "bin"
    real.mkdir(parents=True)
    for name in (*HOOK_COMMANDS, "slurm-gpu", "python"):
        (real / name).write_text("#!/bin/sh\n")
        (real / name).chmod(0o755)
    (root / "current").symlink_to("0.1.0")
    return real


def test_the_bin_dir_is_the_path_slurm_gpu_was_called_by(tmp_path):
    """Called through /opt/.../current/bin, the lines keep that stable path (upgrades flip the link)."""
    real = _fake_install(tmp_path)
    called = str(tmp_path / "current" / "bin" / "slurm-gpu")
    assert installed_bin_dir(called, str(real / "python")) == str(tmp_path / "current" / "bin")
    assert installed_bin_dir("/usr/lib/python3/dist-packages/pytest", str(real / "python")) == str(real)
    assert installed_bin_dir("slurm-gpu", str(tmp_path / "python")) is None
    # An admin's PATH link to the stable path: the lines still name the stable path.
    (tmp_path / "usr-local-bin").mkdir()
    (tmp_path / "usr-local-bin" / "slurm-gpu").symlink_to(tmp_path / "current" / "bin" / "slurm-gpu")
    assert installed_bin_dir(str(tmp_path / "usr-local-bin" / "slurm-gpu"), str(real / "python")) == \
        str(tmp_path / "current" / "bin")


@pytest.mark.parametrize("bin_dir,needle", [
    ("relative/bin", "must be an absolute path"),
    ("/opt/my hooks/bin", "cannot go into slurm.conf"),
    ("/opt/hooks#1/bin", "cannot go into slurm.conf"),
])
def test_a_bin_dir_slurm_cannot_use_is_one_line(bin_dir, needle):
    result = run_cli(["slurm-conf", "--bin-dir", bin_dir])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and needle in result.stderr


def test_an_interval_too_short_is_refused():
    result = run_cli(["slurm-conf", "--bin-dir", STABLE, "--interval", "1"])
    assert result.exit_code == 2 and "Traceback" not in result.stderr


@pytest.mark.parametrize("release, added", [
    ("22.05", []), ("24.11", []), ("25.05", ["PrologTimeout", "EpilogTimeout"]),
    ("25.11", ["PrologTimeout", "EpilogTimeout"]),
    ("26.05", ["PrologTimeout", "EpilogTimeout", "HealthCheckTimeout"])])
def test_settings_a_release_added_are_printed_only_for_that_release_and_later(release, added):
    base = run_cli(["slurm-conf", "--bin-dir", STABLE, "--slurm", "22.05"])
    result = run_cli(["slurm-conf", "--bin-dir", STABLE, "--slurm", release])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(base.stdout)
    extra = settings(result.stdout[len(base.stdout):])
    assert list(extra) == added
    assert all(value == "60" for value in extra.values())


def test_a_release_that_is_not_one_is_one_line_and_nonzero():
    result = run_cli(["slurm-conf", "--bin-dir", STABLE, "--slurm", "latest"])
    assert result.exit_code != 0
    assert "not a Slurm release" in result.stderr and "Traceback" not in result.stderr


def test_health_check_timeout_is_left_out_when_the_interval_is_not_above_it():
    """26.05's slurmctld: "HealthCheckTimeout (60) must be less than HealthCheckInterval (30)"."""
    short = run_cli(["slurm-conf", "--bin-dir", STABLE, "--slurm", "26.05", "--interval", "60"])
    assert "HealthCheckTimeout" not in settings(short.stdout)
    assert "# HealthCheckTimeout=60 left out: Slurm wants it below HealthCheckInterval (60)." in short.stdout
    long = run_cli(["slurm-conf", "--bin-dir", STABLE, "--slurm", "26.05", "--interval", "61"])
    assert settings(long.stdout)["HealthCheckTimeout"] == "60"


@pytest.mark.parametrize("release, noted", [("22.05", False), ("24.11", False), ("25.11", False), ("26.05", True)])
def test_the_boot_time_states_are_left_out_with_a_note_on_the_releases_that_have_them(release, noted):
    """26.05's START_ONLY and REBOOT_ONLY work only alone and stop the periodic check; with ANY every
    Slurm command is fatal (measured: docs/slurm-versions.md). Never set; 26.05 gets the note."""
    result = run_cli(["slurm-conf", "--bin-dir", STABLE, "--slurm", release])
    assert result.exit_code == 0, result.stderr
    assert settings(result.stdout)["HealthCheckNodeState"] == "ANY"
    assert not any(value.endswith("_ONLY") for value in settings(result.stdout).values())
    assert ("# HealthCheckNodeState=START_ONLY / REBOOT_ONLY (26.05+) is not set" in result.stdout) is noted
