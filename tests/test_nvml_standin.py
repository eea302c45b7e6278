"""The real C boundary: stand-in libnvidia-ml.so.1 libraries, compiled here with the system
compiler once per driver branch (exporting exactly what that branch exports), loaded by the
real pynvml through the library path, read by the production probe and judged by
``slurm-gpu check``. The simulator replaces pynvml, so only this proves pynvml's own
behaviour: which exception a missing symbol raises, structure layouts, the fabric byte.

Each run is a child process: the library path is read when a process starts. Runs use the
newest nvidia-ml-py (the venv's) and the oldest that setup.cfg allows (installed by
scripts/bootstrap.sh under .pynvml-floor/).
"""
from __future__ import annotations

import configparser
import ctypes
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from healthcheck import driver_support

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "tests", "nvml_standin", "libnvidia-ml.c")
FLOOR_DIR = os.path.join(ROOT, ".pynvml-floor")
DRIVERS = {"R470": "470.256.02", "R525": "525.147.05", "R535": "535.161.08", "R550": "550.90.07",
           "R570": "570.133.20"}
H100 = textwrap.dedent("""
    [[nodes]]
    match = "n1"
    gpus = 8
    gpu_model = "H100"
    nvlinks_per_gpu = 18
    nvswitch_fabric = true
    power_limit_w = 700
""")
A100_PCIE = textwrap.dedent("""
    [[nodes]]
    match = "n1"
    gpus = 4
    gpu_model = "A100"
    nvswitch_fabric = false
""")

FACTS_SCRIPT = textwrap.dedent("""
    import json, pynvml
    from healthcheck.plain import asdict
    from healthcheck.probes.nvml import probe_nvml
    facts = probe_nvml(pynvml, 20.0)
    out = asdict(facts)
    out["pynvml_file"] = pynvml.__file__
    print(json.dumps(out))
""")


def floor_version() -> str:
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    match = re.search(r"nvidia-ml-py>=([\d.]+)", parser["options"]["install_requires"])
    assert match, "setup.cfg names no nvidia-ml-py floor"
    return match.group(1)


@pytest.fixture(scope="session")
def standin(tmp_path_factory):
    """branch -> a directory holding that branch's libnvidia-ml.so.1."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "no C compiler: scripts/bootstrap.sh installs gcc"
    libs = {}
    for branch, version in DRIVERS.items():
        out = tmp_path_factory.mktemp(f"nvml-{branch}")
        defines = [f"-DHAVE_{name}" for name in sorted(driver_support.exports(branch))]
        defines += [f"-DKNOWS_FIELD_{entry.id}" for entry in driver_support.fields().values()
                    if driver_support.driver_knows_field(version, entry.id)]
        defines += [f"-DACCEPTS_{entry.function}_V{entry.version}" for entry in driver_support.struct_versions().values()
                    if driver_support.driver_accepts_version(version, entry.function, entry.version)]
        built = subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wl,-soname,libnvidia-ml.so.1",
                                f'-DDRIVER_VERSION="{version}"', *defines, "-o", str(out / "libnvidia-ml.so.1"),
                                SOURCE], capture_output=True, text=True, timeout=120)
        assert built.returncode == 0, built.stderr
        libs[branch] = str(out)
    return libs


@pytest.fixture(scope="session")
def floor_pynvml():
    """The directory holding the oldest nvidia-ml-py setup.cfg allows."""
    floor = floor_version()
    found = glob.glob(os.path.join(FLOOR_DIR, f"nvidia_ml_py-{floor}*.dist-info"))
    assert found and os.path.isfile(os.path.join(FLOOR_DIR, "pynvml.py")), \
        f"nvidia-ml-py {floor}.* is not under {FLOOR_DIR}: run scripts/bootstrap.sh"
    return FLOOR_DIR


def run(libdir, args, pynvml_dir=None, **standin_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGH_STANDIN_", "SLURM_GPU_HOOKS"))}
    env["LD_LIBRARY_PATH"] = libdir
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pynvml_dir, ROOT) if p)
    env.update({f"SGH_STANDIN_{key.upper()}": str(value) for key, value in standin_env.items()})
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)


def facts(libdir, pynvml_dir=None, **standin_env):
    proc = run(libdir, ["-c", FACTS_SCRIPT], pynvml_dir, **standin_env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def check(tmp_path, libdir, nodes, pynvml_dir=None, **standin_env):
    """``slurm-gpu check --json`` on the real NVML backend; (exit code, report)."""
    (tmp_path / "sys").mkdir(parents=True, exist_ok=True)
    (tmp_path / "kern.log").write_text("")
    config = tmp_path / "config.toml"
    config.write_text(textwrap.dedent(f"""
        [paths]
        state_dir = "{tmp_path / 'state'}"
        kernel_log = "{tmp_path / 'kern.log'}"
        sysfs_root = "{tmp_path / 'sys'}"

        [gpu]
        backend = "nvml"
        probe_timeout_s = 30
    """) + nodes)
    proc = run(libdir, ["-c", "from slurm_hooks.cli import main; main()", "check", "--config", str(config),
                        "--node", "n1", "--json"], pynvml_dir, **standin_env)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


# -- the libraries are what the table says ----------------------------------------------------------
def test_each_stand_in_exports_exactly_its_branch(standin):
    for branch, libdir in standin.items():
        lib = ctypes.CDLL(os.path.join(libdir, "libnvidia-ml.so.1"))
        exported = {name for name in driver_support.functions() if hasattr(lib, name)}
        assert exported == driver_support.exports(branch), branch


def test_the_source_gates_every_function_some_branch_lacks():
    source = open(SOURCE, encoding="utf-8").read()
    for name, entry in driver_support.functions().items():
        assert re.search(rf"\b{name}\(", source), f"{name} is not in the stand-in"
        if entry.since != driver_support.BRANCHES[0]:
            assert f"#ifdef HAVE_{name}\n" in source, f"{name} ({entry.since}) is exported on every branch"


def test_the_source_gates_every_structure_version_a_branch_that_has_the_call_refuses():
    source = open(SOURCE, encoding="utf-8").read()
    for (name, version), entry in driver_support.struct_versions().items():
        assert name in driver_support.functions(), name
        if entry.since != driver_support.functions()[name].since:
            assert f"#ifdef ACCEPTS_{name}_V{version}\n" in source, f"{name} v{version} ({entry.since})"


# -- healthy on every branch, with both ends of the pynvml range -------------------------------------
@pytest.mark.parametrize("bindings", ["newest", "floor"])
@pytest.mark.parametrize("branch", sorted(DRIVERS))
def test_healthy_h100_checks_ok(tmp_path, standin, floor_pynvml, branch, bindings):
    pynvml_dir = floor_pynvml if bindings == "floor" else None
    code, report = check(tmp_path, standin[branch], H100, pynvml_dir)
    assert (code, report["status"]) == (0, "ok"), report["findings"]


@pytest.mark.parametrize("bindings", ["newest", "floor"])
def test_fabric_is_read_through_whichever_call_the_driver_has_and_as_one_byte(standin, floor_pynvml, bindings):
    pynvml_dir = floor_pynvml if bindings == "floor" else None
    for branch in ("R525", "R535", "R550"):
        out = facts(standin[branch], pynvml_dir)
        assert out["driver_version"] == DRIVERS[branch]
        assert {(g["state"], g["fabric_state"], g["fabric_status"]) for g in out["gpus"]} == {("ok", 3, 0)}, branch
        # before R570 only the fabric's health (fabric info v3) is beyond the driver
        assert all(g["driver_missing"] == {"fabric_health": "nvmlGpuFabricInfo_v3"} and g["errors"] == {}
                   for g in out["gpus"]), branch
    r470 = facts(standin["R470"], pynvml_dir)
    gpu = r470["gpus"][0]
    assert gpu["fabric_state"] is None and "fabric" in gpu["driver_missing"] and "fabric" in gpu["unsupported"]
    assert gpu["clock_event_reasons"] == 0 and gpu["errors"] == {} and gpu["state"] == "ok"


@pytest.mark.parametrize("bindings", ["newest", "floor"])
def test_the_recovery_action_is_read_where_the_driver_knows_the_field_and_unsupported_before(
        tmp_path, standin, floor_pynvml, bindings):
    """Field 230 through the real pynvml and nvmlDeviceGetFieldValues' per-field return (the
    floor bindings have no constant for it): R570 answers it, R550 answers "not supported" in
    the field's slot, which is no failure and drains nothing."""
    pynvml_dir = floor_pynvml if bindings == "floor" else None
    gpus = facts(standin["R570"], pynvml_dir, recovery="4:2")["gpus"]
    assert [g["recovery_action"] for g in gpus] == [0, 0, 0, 0, 2, 0, 0, 0]
    assert all("recovery_action" not in g["unsupported"] and g["errors"] == {} for g in gpus)
    old = facts(standin["R550"], pynvml_dir, recovery="4:2")["gpus"]
    assert {(g["recovery_action"], "recovery_action" in g["unsupported"], g["state"]) for g in old} == \
        {(None, True, "ok")}
    code, report = check(tmp_path / "570", standin["R570"], H100, pynvml_dir, recovery="4:2")
    assert code == 2 and [(f["check"], f["gpu"], f["action"], f["evidence"]["recovery_action"])
                          for f in report["findings"]] == [("gpu.recovery_action", 4, "drain", "reboot")]
    code, report = check(tmp_path / "550", standin["R550"], H100, pynvml_dir, recovery="4:2")
    assert (code, report["findings"]) == (0, [])


@pytest.mark.parametrize("bindings", ["newest", "floor"])
def test_c2c_links_are_read_per_link_from_r525_and_unsupported_on_r470(tmp_path, standin, floor_pynvml, bindings):
    """Fields 170 and 171 (the link by scopeId) through the real pynvml: from R525 each GPU's
    links and their status, a link down drains its GPU; R470 answers both "not supported" in
    their slots: unknown, nothing judged."""
    pynvml_dir = floor_pynvml if bindings == "floor" else None
    gpus = facts(standin["R525"], pynvml_dir, c2c="2:5")["gpus"]
    assert [g["c2c_links"] for g in gpus] == [{"0": 1, "1": 1}] * 5 + [{"0": 0, "1": 1}] + [{"0": 1, "1": 1}] * 2
    assert [g["c2c_links"] for g in facts(standin["R570"], pynvml_dir)["gpus"]] == [{}] * 8    # no C2C
    old = facts(standin["R470"], pynvml_dir, c2c="2:5")["gpus"]
    assert {(g["c2c_links"] is None, "c2c" in g["unsupported"], g["state"]) for g in old} == {(True, True, "ok")}
    code, report = check(tmp_path / "525", standin["R525"], H100, pynvml_dir, c2c="2:5")
    assert code == 2 and [(f["check"], f["gpu"], f["evidence"]["down"]) for f in report["findings"]] == \
        [("nvlink.c2c", 5, [0])]
    code, report = check(tmp_path / "470", standin["R470"], H100, pynvml_dir, c2c="2:5")
    assert (code, report["findings"]) == (0, [])


def test_fabric_health_is_read_with_the_v3_struct_from_r570_and_unsupported_before(tmp_path, standin, floor_pynvml):
    """Fabric info v3 through the real pynvml wrapper nvmlDeviceGetGpuFabricInfoV: R570 accepts
    the v3 version word and reports the health; R550 refuses it (ARGUMENT_VERSION_MISMATCH) and
    the probe reads v2: the fabric is judged, its health is unsupported, never a failure."""
    newest = facts(standin["R570"], fabric="3:170:32766")["gpus"]
    assert {(g["fabric_state"], g["fabric_health_summary"], g["fabric_health_mask"], g["fabric_clique_id"],
             g["fabric_cluster_uuid"]) for g in newest} == {(3, 3, 0xaa, 32766, "11111111-1111-1111-1111-111111111111")}
    assert all(g["errors"] == {} and "fabric_health" not in g["unsupported"] for g in newest)
    quiet = facts(standin["R570"])["gpus"][0]        # a single HGX box: no domain
    assert (quiet["fabric_health_summary"], quiet["fabric_clique_id"], quiet["fabric_cluster_uuid"]) == \
        (1, 0, "00000000-0000-0000-0000-000000000000")
    for branch, bindings in (("R550", None), ("R570", floor_pynvml)):   # old driver; bindings without the call
        old = facts(standin[branch], bindings, fabric="3:170:32766")["gpus"][0]
        assert (old["fabric_state"], old["fabric_health_summary"], old["fabric_clique_id"]) == (3, None, 32766), branch
        assert "fabric_health" in old["unsupported"] and old["errors"] == {} and old["state"] == "ok"
    code, report = check(tmp_path / "570", standin["R570"], H100, fabric="3:0:32766")
    assert code == 2 and {(f["check"], f["action"]) for f in report["findings"]} == {("nvlink.fabric_health", "drain")}
    assert len(report["findings"]) == 8
    code, report = check(tmp_path / "550", standin["R550"], H100, fabric="3:0:32766")
    assert (code, report["findings"]) == (0, [])


def test_floor_bindings_are_the_floor(standin, floor_pynvml):
    out = facts(standin["R550"], floor_pynvml)
    assert out["pynvml_file"].startswith(FLOOR_DIR)


def test_running_processes_on_r470(standin, floor_pynvml):
    """Newest pynvml raises NVMLLibraryMismatchError for the unversioned call (the probe asks
    _v2 instead); the floor's has no _v2 wrapper: the fact alone is lost."""
    newest = facts(standin["R470"])["gpus"][0]
    assert newest["processes"] == [] and "processes" not in newest["driver_missing"]
    floor = facts(standin["R470"], floor_pynvml)["gpus"][0]
    assert floor["processes"] is None and floor["driver_missing"] == {
        "fabric": "nvmlDeviceGetGpuFabricInfo", "processes": "nvmlDeviceGetComputeRunningProcesses"}
    assert floor["state"] == "ok" and floor["ecc"]["volatile_uncorrected"] == 0


# -- failure shapes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("code,error", [(999, "Unknown Error"), (15, "GPU is lost")])
def test_a_gpu_whose_handle_fails_is_lost(tmp_path, standin, code, error):
    exit_code, report = check(tmp_path, standin["R535"], H100, handle_error=f"3:{code}")
    assert exit_code == 2
    assert [(f["check"], f["gpu"], f["status"], f["action"]) for f in report["findings"]] == \
        [("gpu.lost", 3, "fail", "drain")]
    assert error in report["findings"][0]["message"]


def test_pcie_cards_without_a_bridge(tmp_path, standin):
    code, report = check(tmp_path / "a", standin["R550"], A100_PCIE, model="a100-pcie", gpus=4)
    assert (code, report["findings"]) == (0, [])
    code, report = check(tmp_path / "b", standin["R550"], A100_PCIE + "nvlinks_per_gpu = 12\n",
                         model="a100-pcie", gpus=4)
    assert code == 2 and {(f["check"], f["gpu"]) for f in report["findings"]} == {("nvlink.down", i) for i in range(4)}


def test_a_required_fact_the_driver_lacks_fails(tmp_path, standin):
    code, report = check(tmp_path, standin["R470"], H100 + 'nvml_required = ["fabric"]\n')
    assert code == 2 and {(f["check"], f["status"]) for f in report["findings"]} == {("gpu.nvml", "fail")}
    assert len(report["findings"]) == 8


@pytest.mark.parametrize("bindings", ["newest", "floor"])
def test_mig_mode_is_read_through_the_real_pynvml_on_every_branch(standin, floor_pynvml, bindings):
    """The MIG calls exist on every branch modelled (MIG came with R450): the stand-in's GPUs
    answer MIG off, read without a missing function or an error on R470 and on R580 alike."""
    pynvml_dir = floor_pynvml if bindings == "floor" else None
    for branch in sorted(DRIVERS):
        gpus = facts(standin[branch], pynvml_dir)["gpus"]
        assert {(g["mig_mode"], g["mig_devices"], "mig" in g["unsupported"], "mig" in g["driver_missing"],
                 "mig" in g["errors"]) for g in gpus} == {(0, None, False, False, False)}, branch


@pytest.mark.parametrize("bindings", ["newest", "floor"])
@pytest.mark.parametrize("branch", ["R470", "R570"])
def test_mig_devices_and_their_parent_are_read_through_the_real_pynvml(standin, floor_pynvml, branch, bindings):
    """pynvml's own ctypes wrappers against a library that serves MIG devices: the MIG handle,
    its opaque UUID, its instance ids and the parent handle NVML gives back for it."""
    pynvml_dir = floor_pynvml if bindings == "floor" else None
    gpus = facts(standin[branch], pynvml_dir, mig="5:3")["gpus"]
    assert [g["mig_mode"] for g in gpus] == [0, 0, 0, 0, 0, 1, 0, 0]
    assert [(d["index"], d["uuid"], d["gpu_instance"], d["compute_instance"], d["parent_uuid"])
            for d in gpus[5]["mig_devices"]] == \
        [(slot, f"MIG-9c3e51b7-0005-5000-9000-{slot:012x}", slot + 1, 0, gpus[5]["uuid"]) for slot in range(3)]
    assert all(g["errors"] == {} and "mig" not in g["unsupported"] for g in gpus)
