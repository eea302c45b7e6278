"""The node simulator is faithful where it matters: pynvml's names and exception classes,
every shipped profile loads, and ``sim inject`` changes what the next reader sees."""
from __future__ import annotations

import ctypes
import glob
import inspect
import os

import pynvml
import pytest

from healthcheck.sim import sim_pynvml as sim_nvml
from healthcheck.sim.node import SimNode
from healthcheck.sim.profile import ProfileError, load_profile, parse_assignment
from healthcheck.sources import sim_sources

from .conftest import SIM_PROFILES, run_cli

PROFILES = sorted(glob.glob(os.path.join(SIM_PROFILES, "*.toml")))


def test_simulator_exposes_only_names_pynvml_has():
    extra = {name for name in vars(sim_nvml) if not name.startswith("_")
             and not inspect.ismodule(getattr(sim_nvml, name))} - set(dir(pynvml))
    # typing helpers and the annotations future are not part of the API surface.
    extra -= {"annotations", "Any", "Dict", "List", "Optional", "profiles", "tomlio"}
    assert extra == set(), f"simulator names pynvml lacks: {sorted(extra)}"


def test_simulator_functions_take_pynvml_arguments():
    for name, func in vars(sim_nvml).items():
        if name.startswith("nvml") and inspect.isfunction(func) and func.__module__ == sim_nvml.__name__:
            real = getattr(pynvml, name)
            real_params = list(inspect.signature(real).parameters)
            sim_params = list(inspect.signature(func).parameters)
            assert len(real_params) == len(sim_params), f"{name}: {sim_params} vs pynvml {real_params}"


def test_simulator_raises_pynvml_exception_classes():
    for name in vars(sim_nvml):
        if name.startswith("NVMLError"):
            assert getattr(sim_nvml, name) is getattr(pynvml, name)


@pytest.mark.parametrize("path", PROFILES, ids=os.path.basename)
def test_every_shipped_profile_loads(path):
    profile = load_profile(path)
    assert profile["gpu"], "a profile describes at least one GPU"
    assert "findings" in profile.get("expect", {}), "each shipped profile says what the checks must find"
    for gpu in profile["gpu"]:
        domain, bus, rest = gpu["pci_bus_id"].split(":")
        assert len(domain) == 8 and rest.endswith(".0"), "NVML's bus-id format: 00000000:18:00.0"


def bound(tmp_path, profile="h100-healthy.toml", node="gpu1"):
    sources = sim_sources(node, str(tmp_path), os.path.join(SIM_PROFILES, profile))
    return sources.nvml, sources


def test_healthy_h100_reads_like_nvml(tmp_path):
    nvml, _ = bound(tmp_path)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 8
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    assert nvml.nvmlDeviceGetPciInfo(handle).busId == "00000000:18:00.0"
    assert nvml.nvmlDeviceGetNvLinkState(handle, 17) == 1
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(handle, 18)
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert nvml.nvmlDeviceGetTotalEccErrors(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                            pynvml.NVML_VOLATILE_ECC) == 0
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700000   # milliwatts, as NVML


def test_pcie_profile_has_no_nvlink_or_fabric(tmp_path):
    nvml, _ = bound(tmp_path, "pcie-l40s-healthy.toml", "pcie1")
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(handle, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(pynvml.c_nvmlGpuFabricInfoV_t()))


def test_lost_gpu_raises_gpu_is_lost(tmp_path):
    nvml, _ = bound(tmp_path, "h100-xid79-gpu-lost.toml", "gpu2")
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(3))
    assert nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(2)).startswith("NVIDIA")


def test_inject_changes_what_the_next_probe_sees(tmp_path):
    nvml, sources = bound(tmp_path)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetTotalEccErrors(nvml.nvmlDeviceGetHandleByIndex(3),
                                            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC) == 0
    SimNode(str(tmp_path), "gpu1").inject([("gpu.3.ecc.volatile_uncorrected", 2), ("gpu.5.state", "absent"),
                                           ("gpu.1.nvlink.down", [4, 5]), ("ib.mlx5_2:1.state", "1: DOWN")],
                                          ["NVRM: Xid (PCI:0000:5d:00): 48, pid=7, name=python, DBE"])
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetTotalEccErrors(nvml.nvmlDeviceGetHandleByIndex(3),
                                            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC) == 2
    assert nvml.nvmlDeviceGetCount() == 7                       # an absent GPU is not enumerated
    assert nvml.nvmlDeviceGetNvLinkState(nvml.nvmlDeviceGetHandleByIndex(1), 4) == 0
    port_state = os.path.join(sources.sysfs_root, "class/infiniband/mlx5_2/ports/1/state")
    assert open(port_state).read().strip() == "1: DOWN"
    assert open(sources.kernel_log).read().splitlines()[-1].startswith("NVRM: Xid (PCI:0000:5d:00): 48")


def test_reset_restores_the_profile_and_restarts_the_log(tmp_path):
    _, sources = bound(tmp_path)
    node = SimNode(str(tmp_path), "gpu1")
    node.inject([("gpu.0.state", "lost")], ["NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."])
    size_after_inject = os.path.getsize(sources.kernel_log)
    node.profile_path = os.path.join(SIM_PROFILES, "h100-healthy.toml")
    profile = node.reset()
    assert profile["gpu"][0]["state"] == "ok"
    assert os.path.getsize(sources.kernel_log) < size_after_inject


def test_hanging_nvml_never_returns_in_time(tmp_path):
    import multiprocessing

    SimNode(str(tmp_path), "gpu1", os.path.join(SIM_PROFILES, "h100-healthy.toml")).ensure()
    SimNode(str(tmp_path), "gpu1").inject([("node.nvml", "hang")])
    nvml, _ = bound(tmp_path)
    child = multiprocessing.get_context("fork").Process(target=nvml.nvmlInit)
    child.start()
    child.join(0.5)
    try:
        assert child.is_alive(), "nvml = \"hang\" must block like a stuck driver"
    finally:
        child.kill()
        child.join(2)


def test_sysfs_tree_has_the_kernel_layout(tmp_path):
    _, sources = bound(tmp_path, "pcie-l40s-healthy.toml", "pcie1")
    port = os.path.join(sources.sysfs_root, "class", "infiniband", "mlx5_0", "ports", "1")
    assert open(os.path.join(port, "link_layer")).read().strip() == "Ethernet"
    assert open(os.path.join(port, "gid_attrs", "types", "3")).read().strip() == "RoCE v2"
    assert open(os.path.join(port, "counters", "symbol_error")).read().strip() == "0"


@pytest.mark.parametrize("text,key,value", [
    ("gpu.3.ecc.volatile_uncorrected=1", "gpu.3.ecc.volatile_uncorrected", 1),
    ("gpu.5.state=lost", "gpu.5.state", "lost"),
    ("gpu.1.nvlink.down=[4,5]", "gpu.1.nvlink.down", [4, 5]),
    ('ib.mlx5_2:1.state="1: DOWN"', "ib.mlx5_2:1.state", "1: DOWN"),
])
def test_inject_syntax(text, key, value):
    assert parse_assignment(text) == (key, value)


def test_cli_inject_show_reset(sim_config):
    env = {"SLURM_GPU_HOOKS_CONFIG": sim_config}
    assert run_cli(["sim", "inject", "gpu1", "gpu.5.state=lost", "--log", "NVRM: test line"], env).exit_code == 0
    shown = run_cli(["sim", "show", "gpu1"], env)
    assert shown.exit_code == 0 and shown.stdout.count('state = "lost"') == 1
    assert "NVRM: test line" in shown.stdout
    assert run_cli(["sim", "reset", "gpu1"], env).exit_code == 0
    assert run_cli(["sim", "show", "gpu1"], env).stdout.count('state = "lost"') == 0


@pytest.mark.parametrize("args,needle", [
    (["gpu1", "gpu.99.state=lost"], "no GPU '99'"),
    (["gpu1", "gpu.1.state=melted"], "'melted' is not allowed"),
    (["gpu1", "ib.mlx5_9:1.state=\"1: DOWN\""], "no IB port 'mlx5_9:1'"),
    (["gpu1", "gpu.1.pcie.gen=["], "is not a TOML value"),
    (["gpu1"], "nothing to inject"),
])
def test_cli_inject_bad_input_is_one_line(sim_config, args, needle):
    result = run_cli(["sim", "inject", *args], {"SLURM_GPU_HOOKS_CONFIG": sim_config})
    assert result.exit_code == 2
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_profile_with_unknown_key_is_rejected(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[[gpu]]\nname = "x"\ncolour = "green"\n')
    with pytest.raises(ProfileError, match="gpu\\[0\\].colour: unknown key"):
        load_profile(str(path))


def test_a_fault_on_one_gpu_stays_on_that_gpu(tmp_path):
    """GPUs completed from one defaults table must not share nested tables."""
    profile = load_profile(os.path.join(SIM_PROFILES, "h100-ecc-dbe.toml"))
    counts = [gpu["ecc"]["volatile_uncorrected"] for gpu in profile["gpu"]]
    assert counts == [0, 0, 0, 1, 0, 0, 0, 0]
    node = SimNode(str(tmp_path), "gpu1", os.path.join(SIM_PROFILES, "h100-healthy.toml"))
    node.ensure()
    updated = node.inject([("gpu.2.remapped_rows.pending", True)])
    assert [gpu["remapped_rows"]["pending"] for gpu in updated["gpu"]] == [False, False, True] + [False] * 5


def test_the_simulated_driver_reads_the_completed_rendition_only_while_it_matches_the_live_file(tmp_path):
    """Each nvmlInit reads the rendition SimNode writes with the live profile; a live file
    changed any other way (an admin's editor) is parsed again, never served stale."""
    from healthcheck.safeio import tomlio
    from healthcheck.sim.profile import complete, completed_path, load_live

    node = SimNode(str(tmp_path), "gpu1", os.path.join(SIM_PROFILES, "h100-healthy.toml"))
    node.ensure()
    node.inject([("gpu.4.ecc.volatile_uncorrected", 3)])
    rendition = completed_path(node.live_path)
    assert os.path.isfile(rendition)
    parsed = complete(tomlio.load_file(node.live_path), node.live_path)
    assert load_live(node.live_path) == parsed and parsed["gpu"][4]["ecc"]["volatile_uncorrected"] == 3
    with open(node.live_path, "a", encoding="utf-8") as handle:
        handle.write("\n# edited by hand\n")
    with open(rendition, "r+", encoding="utf-8") as handle:     # a rendition that would now lie
        text = handle.read().replace('"volatile_uncorrected": 3', '"volatile_uncorrected": 7')
        handle.seek(0)
        handle.write(text)
    assert load_live(node.live_path)["gpu"][4]["ecc"]["volatile_uncorrected"] == 3
    os.unlink(rendition)
    assert load_live(node.live_path) == parsed
