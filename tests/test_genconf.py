"""``slurm-gpu genconf``: the entry it prints for each shipped healthy profile is one that
``check --sim`` of that profile passes and of each of its faulty variants fails; the Gres
parser reads Slurm's spellings; --slurm reports a count Slurm promises that NVML does not see."""
from __future__ import annotations

import json
import os

import pytest

from healthcheck.config import CONFIG_SCHEMA, shipped
from healthcheck.config.node_entry import PROBED_KEYS, gres_problems, node_entry
from healthcheck.facts import GpuFacts, IbFacts, IbPortFacts, NvmlFacts
from healthcheck.safeio import tomlio
from healthcheck.schema import validate
from healthcheck.slurm.backend import gpu_gres

from .conftest import run_cli

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "slurm")


def _raw(name: str):
    return tomlio.load_file(shipped.resolve(name))


HEALTHY = [name for name in shipped.shipped_names() if "base" not in _raw(name)]
VARIANTS = {name: [v for v in shipped.shipped_names() if _raw(v).get("base") == f"{name}.toml"
                   and _raw(v).get("expect", {}).get("findings")]
            for name in HEALTHY}


@pytest.fixture(autouse=True)
def no_config(isolated_env):
    """As an admin on a node before writing any config."""


def genconf(*args, env=None):
    return run_cli(["genconf", "--node", "gpu1", *args], env=env)


def test_the_shipped_profiles_have_healthy_bases_with_faulty_variants():
    assert {"h100-healthy", "a100-healthy", "pcie-l40s-healthy", "v100-healthy"} <= set(HEALTHY)
    assert len(VARIANTS["h100-healthy"]) >= 20 and VARIANTS["pcie-l40s-healthy"] == ["pcie-l40s-roce-gid-missing"]


@pytest.mark.parametrize("name", HEALTHY)
def test_the_printed_entry_passes_its_profile_and_fails_each_faulty_variant(tmp_path, name):
    printed = genconf("--sim", name)
    assert printed.exit_code == 0, printed.stderr
    # The admin's choices the profile's hardware table makes (imex_owned): genconf leaves them out.
    chosen = "".join(f"{key} = {json.dumps(value)}\n" for key, value in _raw(name).get("hardware", {}).items()
                     if key not in PROBED_KEYS)
    # A short probe deadline only for the variants that hang (they expect probe.timeout): on a
    # loaded machine (CI, a lab coming up) a healthy probe may take more than a second.
    configs = {}
    for timeout in (1.0, 30.0):
        configs[timeout] = tmp_path / f"config-{timeout:g}.toml"
        configs[timeout].write_text(f"[gpu]\nprobe_timeout_s = {timeout}\n[perftest]\nduration_s = 1\n"
                                    "server_wait_s = 0.1\n" + printed.stdout + chosen)
    [entry] = tomlio.load_file(str(configs[1.0]))["nodes"]
    assert entry["match"] == "gpu1" and set(entry) - {"match"} <= set(PROBED_KEYS) | set(_raw(name)["hardware"])

    def check(profile):
        hangs = "probe.timeout" in _raw(profile).get("expect", {}).get("findings", [])
        config = configs[1.0 if hangs else 30.0]
        done = run_cli(["check", "--config", str(config), "--node", "gpu1", "--sim", profile, "--json"])
        return done.exit_code, {f["check"] for f in json.loads(done.stdout)["findings"]}

    assert check(name) == (0, set())
    for variant in VARIANTS[name]:
        code, found = check(variant)
        assert code != 0 and found == set(_raw(variant)["expect"]["findings"]), variant


@pytest.mark.parametrize("name", HEALTHY)
def test_the_printed_entry_says_what_the_profiles_own_hardware_table_says(name):
    doc = json.loads(genconf("--sim", name, "--json").stdout)
    entry, hardware = doc["entry"], _raw(name)["hardware"]
    assert doc["v"] == 1 and doc["node"] == "gpu1" and doc["slurm"] is None and doc["findings"] == []
    for key, value in hardware.items():
        if key not in PROBED_KEYS:
            continue                    # the admin's choice (imex_owned), not a probed fact
        if key == "gpu_model":
            assert value in entry[key], (key, entry[key])
        else:
            assert entry[key] == value, (key, entry[key], value)
    assert validate({"nodes": [entry]}, CONFIG_SCHEMA) == []


def test_it_prints_the_hardware_keys_and_leaves_the_admins_choices_to_the_admin():
    choices = {"match", "nvml_required", "nccl_env", "imex_owned"}
    assert list(PROBED_KEYS) == [key for key in CONFIG_SCHEMA["nodes"].item if key not in choices]


def test_match_takes_a_hostlist_for_the_whole_group():
    printed = genconf("--sim", "h100-healthy", "--match", "gpu[001-064]")
    assert printed.exit_code == 0 and '\nmatch = "gpu[001-064]"\n' in printed.stdout
    assert printed.stdout.startswith("# slurm-gpu genconf: gpu1 as probed (8x NVIDIA H100 80GB HBM3")


def test_a_faulty_node_is_described_as_it_is():
    """genconf believes the node: taken on a node missing a GPU, the entry says 7."""
    doc = json.loads(genconf("--sim", "h100-gpu-missing", "--json").stdout)
    assert doc["entry"]["gpus"] == 7


@pytest.mark.parametrize("args,code,words", [
    (["--sim", "no-such-profile"], 2, "no shipped simulator profile named 'no-such-profile'"),
    (["--sim", "h100-healthy", "--match", "gpu[1-"], 2, "--match 'gpu[1-': malformed hostlist"),
    (["--sim", "h100-driver-not-loaded"], 3, "NVML did not answer (Driver Not Loaded); nothing printed"),
])
def test_bad_input_and_an_unprobed_node_are_one_line(args, code, words):
    done = genconf(*args)
    assert done.exit_code == code and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, done.stderr


# -- Slurm's Gres -------------------------------------------------------------------------------

@pytest.mark.parametrize("text,gpus", [
    ("gpu:8", {"": 8}),                                             # the lab's scontrol and --json
    ("gpu:h100:8(S:0-1)", {"h100": 8}),
    ("gpu:h100:4(S:0),gpu:h100:4(S:1)", {"h100": 8}),
    ("gpu:a100:4(S:0,1),gpu:a10:2(S:1),shard:16", {"a100": 4, "a10": 2}),
    ("gpu:nvidia_h100_80gb_hbm3:8(S:0-1),mps:400", {"nvidia_h100_80gb_hbm3": 8}),
    ("gpu:no_consume:2", {"": 2}),
    ("gpu", {"": 1}),
    ("gpu:v100", {"v100": 1}),
    ("(null)", {}),
    ("", {}),
    ("mps:100", {}),
])
def test_gpu_gres_reads_slurms_spellings(text, gpus):
    assert gpu_gres(text) == gpus


@pytest.mark.parametrize("text", ["gpu:a:b:4", "gpu::4"])
def test_a_gres_that_is_no_gres_is_a_value_error(text):
    with pytest.raises(ValueError, match="is not gpu"):
        gpu_gres(text)


def test_the_backend_reads_the_gres_from_scontrol_text_and_json():
    from healthcheck.slurm.cli_backend import CliBackend, node_from_json, parse_scontrol_record

    with open(os.path.join(FIXTURES, "scontrol-show-node-idle.txt")) as handle:
        fields = parse_scontrol_record(handle.read().strip())
    assert CliBackend()._node_from_fields(fields).gres == "gpu:8"
    for release in ("24.11", "26.05"):
        with open(os.path.join(FIXTURES, "releases", release, "scontrol-json-show-node-drained.json")) as handle:
            [item] = json.load(handle)["nodes"]
        assert node_from_json(item).gres == "gpu:8", release


def _nvml(names):
    return NvmlFacts(device_count=len(names), gpus=[GpuFacts(index=i, name=n) for i, n in enumerate(names)])


def test_gres_problems_name_the_count_and_the_type():
    h100s = _nvml(["NVIDIA H100 80GB HBM3"] * 8)
    assert gres_problems({"": 8}, "gpu:8", h100s) == []
    assert gres_problems({"h100": 8}, "gpu:h100:8", h100s) == []
    assert gres_problems({"h100_80gb_hbm3": 8}, "gpu:h100_80gb_hbm3:8", h100s) == []
    assert gres_problems({"": 8}, "gpu:8", _nvml(["NVIDIA H100 80GB HBM3"] * 7)) == \
        ["Slurm's Gres=gpu:8 promises 8 GPUs, NVML sees 7"]
    assert gres_problems({"a10": 8}, "gpu:a10:8", _nvml(["NVIDIA A100-SXM4-80GB"] * 8)) == \
        ["Slurm's GPU type 'a10' names none of the GPUs NVML sees (NVIDIA A100-SXM4-80GB)"]
    assert gres_problems({}, "(null)", h100s) == ["Slurm's Gres=(null) promises 0 GPUs, NVML sees 8"]


def _stand_in_scontrol(tmp_path, fixture):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(f"#!/bin/sh\nexec cat {os.path.join(FIXTURES, fixture)}\n")
    (bindir / "scontrol").chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(f'[slurm]\nbin_dir = "{bindir}"\n')
    return str(config)


def test_slurm_promising_more_gpus_than_nvml_sees_is_a_finding(tmp_path):
    """Argument building and the comparison (a stand-in scontrol printing the lab's gpu1, Gres=gpu:8);
    tests/lab/test_lab_genconf.py asks the real slurmctld."""
    config = _stand_in_scontrol(tmp_path, "scontrol-show-node-idle.txt")
    missing = genconf("--config", config, "--sim", "h100-gpu-missing", "--slurm")
    assert missing.exit_code == 1
    assert "[[nodes]]" in missing.stdout and "gpus = 7" in missing.stdout        # the entry still printed
    [line] = missing.stderr.strip().splitlines()
    assert line.split()[:2] == ["FAIL", "slurm.gres"]
    assert line.endswith("gpu1: Slurm's Gres=gpu:8 promises 8 GPUs, NVML sees 7")
    doc = json.loads(genconf("--config", config, "--sim", "h100-gpu-missing", "--slurm", "--json").stdout)
    assert doc["slurm"] == {"gres": "gpu:8", "gpus": 8, "types": {"": 8}}
    [finding] = doc["findings"]
    assert finding["check"] == "slurm.gres" and finding["evidence"]["nvml_gpus"] == 7
    healthy = genconf("--config", config, "--sim", "h100-healthy", "--slurm")
    assert healthy.exit_code == 0 and healthy.stderr == ""


def test_slurm_unreachable_is_one_line_and_exit_3(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[slurm]\nbin_dir = "/nonexistent-slurm"\n')
    done = genconf("--config", str(config), "--sim", "h100-healthy", "--slurm")
    assert done.exit_code == 3 and "[[nodes]]" in done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and "cannot ask Slurm about gpu1" in done.stderr


# -- the entry from facts -----------------------------------------------------------------------

def test_down_ports_a_second_link_layer_and_idle_gpus():
    gpus = [GpuFacts(index=0, name="NVIDIA L40S", clock_event_reasons=0x1, power_limit_w=350.0,
                     pcie={"gen": 1, "gen_max": 4, "width": 16, "width_max": 16}),
            GpuFacts(index=1, name="NVIDIA L40S", clock_event_reasons=0x1, power_limit_w=300.0,
                     pcie={"gen": 1, "gen_max": 4, "width": 8, "width_max": 16})]
    ports = [IbPortFacts(hca="mlx5_0", port=1, state=4, rate_gbps=400.0, link_layer="InfiniBand"),
             IbPortFacts(hca="mlx5_1", port=1, state=4, rate_gbps=400.0, link_layer="InfiniBand"),
             IbPortFacts(hca="mlx5_2", port=1, state=1, rate_gbps=None, link_layer="InfiniBand"),
             IbPortFacts(hca="mlx5_3", port=1, state=4, rate_gbps=25.0, link_layer="Ethernet")]
    entry, notes = node_entry("gpu[1-4]", NvmlFacts(device_count=2, gpus=gpus), IbFacts(ports=ports))
    assert entry == {"match": "gpu[1-4]", "gpus": 2, "gpu_model": "NVIDIA L40S", "nvlinks_per_gpu": 0,
                     "nvswitch_fabric": False, "ib_ports": ["mlx5_0:1", "mlx5_1:1"], "ib_rate_gbps": 400.0,
                     "ib_link_layer": "InfiniBand", "power_limit_w": 350.0, "pcie_gen": 4, "pcie_width": 16}
    assert notes == ["not ACTIVE, left out of ib_ports: mlx5_2:1",
                     "another link layer, left out of ib_ports: mlx5_3:1 (Ethernet)"]


def test_the_example_in_the_docs_is_what_it_prints():
    from .conftest import ROOT

    with open(os.path.join(ROOT, "docs", "checks.md"), encoding="utf-8") as handle:
        page = handle.read().split("## `slurm-gpu genconf`", 1)[1]
    shown = page.split("```toml\n", 1)[1].split("```\n", 1)[0]
    assert genconf("--sim", "h100-healthy", "--match", "gpu[001-064]").stdout == shown


def test_a_driver_that_cannot_report_the_fabric_is_said():
    gpus = [GpuFacts(index=0, name="NVIDIA H100 80GB HBM3", driver_missing={"fabric": "nvmlDeviceGetGpuFabricInfo"})]
    entry, notes = node_entry("gpu1", NvmlFacts(device_count=1, gpus=gpus), IbFacts())
    assert entry["nvswitch_fabric"] is False and entry["ib_ports"] == []
    assert notes == ["this driver cannot report the NVSwitch fabric: nvswitch_fabric = false may be wrong"]
