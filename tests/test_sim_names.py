"""Names that become path components follow one safe-name rule (``fsutil.name_problem``):
simulator profiles and ``slurm-gpu sim inject`` cannot make root write outside
``<state>/sim/<node>``."""
from __future__ import annotations

import os

import pytest

from healthcheck.config import Config, ConfigError
from healthcheck.safeio.fsutil import name_problem, path_component
from healthcheck.sim.node import SimNode
from healthcheck.sim.profile import ProfileError, load_profile

from .conftest import run_cli

BAD_NAMES = ["../../../x", "..", ".", "/abs/path", "a/b", ".hidden", "", "a\nb", "x" * 256, "é" * 128]
GOOD_NAMES = ["mlx5_0", "gpu1", "symbol_error", "node-01.example", "x" * 255]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_the_rule_refuses_names_that_are_not_one_component(name):
    assert name_problem(name)
    with pytest.raises(ValueError) as caught:
        path_component(name)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_the_rule_accepts_ordinary_names(name):
    assert name_problem(name) is None and path_component(name) == name


def write_profile(tmp_path, ib_table: str) -> str:
    path = tmp_path / "evil.toml"
    path.write_text('[[gpu]]\nname = "NVIDIA H100 80GB HBM3"\n[[ib]]\nport = 1\n' + ib_table)
    return str(path)


IB_TABLES = {
    "hca-parent": 'hca = "../../../escaped"\n',
    "hca-absolute": 'hca = "{outside}/abs"\n',
    "counter-parent": 'hca = "mlx5_0"\ncounters = {{ "../../../../escaped" = 1 }}\n',
    "counter-absolute": 'hca = "mlx5_0"\ncounters = {{ "{outside}/abs" = 1 }}\n',
    "gid-parent": 'hca = "mlx5_0"\ngid_types = {{ "../../../../../escaped" = "RoCE v2" }}\n',
}


@pytest.mark.parametrize("case", sorted(IB_TABLES))
def test_a_profile_naming_a_path_outside_is_refused_and_nothing_is_written(tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    state = tmp_path / "state" / "deep" / "er"
    profile = write_profile(tmp_path, IB_TABLES[case].format(outside=outside))
    with pytest.raises(ProfileError):
        load_profile(profile)
    with pytest.raises(ProfileError):
        SimNode(str(state), "gpu1", profile).ensure()
    assert list(outside.iterdir()) == []
    written = {os.path.relpath(os.path.join(d, f), tmp_path) for d, _, files in os.walk(tmp_path) for f in files}
    inside = os.path.join("state", "deep", "er", "sim", "gpu1") + os.sep
    assert {path for path in written if not path.startswith(inside)} == {"evil.toml"}


@pytest.mark.parametrize("assignment", [
    'ib.mlx5_0:1.hca="../../../../escaped"',
    'ib.mlx5_0:1.hca="{tmp}/abs"',
    "ib.mlx5_0:1.counters.{tmp}/escaped=1",            # the dotted path splits on dots only
    'ib.mlx5_0:1.gid_types.{tmp}/escaped="RoCE v2"',
])
def test_sim_inject_cannot_name_a_path_outside(sim_config, tmp_path, assignment):
    assert "." not in str(tmp_path)
    assert run_cli(["sim", "show", "--config", sim_config, "gpu1"]).exit_code == 0
    before = {os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files}
    result = run_cli(["sim", "inject", "--config", sim_config, "gpu1", assignment.format(tmp=tmp_path)])
    assert result.exit_code != 0
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    after = {os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files}
    assert after == before


@pytest.mark.parametrize("node", ["../../x", ".lock", "a/b"])
def test_sim_inject_refuses_an_unsafe_node_name(sim_config, tmp_path, node):
    result = run_cli(["sim", "inject", "--config", sim_config, node, "gpu.0.state=lost"])
    assert result.exit_code != 0 and "not usable as a file name" in result.stderr
    assert not (tmp_path / "x").exists()


def test_config_refuses_sim_node_names_that_are_not_file_names(tmp_path):
    with pytest.raises(ConfigError) as caught:
        Config.from_document({"sim": {"nodes": {"../../x": "p.toml"}}}, str(tmp_path / "c.toml"))
    assert any("sim.nodes" in line and "'/'" in line for line in caught.value.lines())
