"""Shipped simulator profiles are package data, named by their file stem wherever a profile goes."""
from __future__ import annotations

import json
import os

from healthcheck.config import Config
from healthcheck.config import shipped

from .conftest import SIM_PROFILES, run_cli


def test_shipped_names_are_the_files_in_the_package():
    names = shipped.shipped_names()
    files = sorted(name[:-5] for name in os.listdir(SIM_PROFILES) if name.endswith(".toml"))
    assert names == files and "h100-ecc-dbe" in names and "h100-healthy" in names


def test_a_name_is_a_shipped_profile_and_a_path_stays_a_path(tmp_path):
    assert shipped.resolve("h100-ecc-dbe") == os.path.join(shipped.shipped_dir(), "h100-ecc-dbe.toml")
    assert shipped.resolve("mine.toml", str(tmp_path)) == str(tmp_path / "mine.toml")
    assert shipped.resolve("sim/h100-ecc-dbe", str(tmp_path)) == str(tmp_path / "sim" / "h100-ecc-dbe")
    assert shipped.resolve("/abs/x.toml", str(tmp_path)) == "/abs/x.toml"


def test_an_unknown_name_lists_the_shipped_ones():
    try:
        shipped.resolve("h100-no-such-fault")
    except ValueError as exc:
        assert "h100-no-such-fault" in str(exc) and "h100-ecc-dbe" in str(exc)
    else:
        raise AssertionError("an unknown profile name resolved")


def test_config_names_shipped_profiles(tmp_path):
    cfg = Config.from_document({"gpu": {"backend": "sim"},
                                "sim": {"profile": "h100-healthy", "nodes": {"gpu2": "own/x.toml"}}},
                               str(tmp_path / "config.toml"))
    assert cfg.sim_profile_path("gpu1") == os.path.join(shipped.shipped_dir(), "h100-healthy.toml")
    assert cfg.sim_profile_path("gpu2") == str(tmp_path / "own" / "x.toml")


def test_check_sim_by_name(isolated_env, tmp_path):
    result = run_cli(["check", "--node", "gpu1", "--sim", "h100-ecc-dbe", "--json"], env={"HOME": str(tmp_path)})
    assert result.exit_code == 2, result.stderr
    findings = {f["check"] for f in json.loads(result.stdout)["findings"]}
    assert "gpu.ecc.uncorrectable" in findings


def test_check_sim_unknown_name_is_one_line(isolated_env):
    result = run_cli(["check", "--node", "gpu1", "--sim", "h100-nope"])
    assert result.exit_code == 3
    assert result.stderr.count("\n") == 1 and "no shipped simulator profile named 'h100-nope'" in result.stderr


def test_config_check_reports_an_unknown_profile_name(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[gpu]\nbackend = "sim"\n[sim]\nprofile = "h100-nope"\n')
    result = run_cli(["config", "check", str(path)])
    assert result.exit_code == 2 and "sim.profile: no shipped simulator profile named 'h100-nope'" in result.stderr


def test_sim_profiles_lists_every_shipped_profile_with_its_description():
    result = run_cli(["sim", "profiles"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == shipped.shipped_names()
    assert any(line.startswith("h100-ecc-dbe") and "Xid 48" in line for line in lines)
