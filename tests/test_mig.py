"""MIG: the simulator serves MIG devices through pynvml's own calls, the probe reads them in its
child, the prolog maps a job's MIG devices to their parent GPUs (asking NVML, never parsing a MIG
UUID), a parent's fault is every instance's, the epilog's record names GPU and instance, and
dcgmi diag is skipped on a MIG GPU."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from healthcheck.checklist import CHECKS
from healthcheck.checks.dcgm import dcgm_diag, diag_targets
from healthcheck.facts import DcgmFacts, GpuFacts
from healthcheck.records import store
from healthcheck.runner import run_checks
from healthcheck.sim.profile import load_profile
from slurm_hooks import epilog, prolog
from slurm_hooks.gpumap import mig_to_parents, mig_uuids

from .checks_support import default_input, hardware_for, make_config, sim
from .conftest import SIM_PROFILES

MIG = os.path.join(SIM_PROFILES, "h100-mig.toml")
PARENT_LOST = os.path.join(SIM_PROFILES, "h100-mig-parent-lost.toml")
# h100-mig.toml's MIG devices: GPU 0 (1g.10gb, GPU instance 8), GPU 1 (3g.40gb, GPU instance 2)
ON_GPU0 = "MIG-1d9e4b72-6c0a-5f13-b8d4-9a0b1c2d3e02"
ON_GPU1 = "MIG-c7a0e316-3d8f-5b62-a4c5-7d8e9f0a1b12"
XID79 = "NVRM: Xid (PCI:{pci}): 79, pid=1, name=python, GPU has fallen off the bus."
XID48 = "NVRM: Xid (PCI:{pci}): 48, pid=1, name=python, An uncorrectable double bit error (DBE) has been detected."


def probe(tmp_path, path, tier="prolog"):
    cfg = make_config(hardware=hardware_for("H100"))
    return run_checks(cfg, "n1", tier, sources=sim(tmp_path, path))


# -- the simulator and the probe -------------------------------------------------------------------
def test_the_probe_reads_each_gpus_mig_devices_and_their_parent_from_nvml(tmp_path):
    gpus = probe(tmp_path, MIG).facts.nvml.gpus
    assert [g.mig_mode for g in gpus] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert [len(g.mig_devices) for g in gpus[:3]] == [4, 2, 1] and gpus[3].mig_devices is None
    assert [(d["gpu_instance"], d["compute_instance"]) for d in gpus[1].mig_devices] == [(1, 0), (2, 0)]
    for gpu in gpus[:3]:
        assert {d["parent_uuid"] for d in gpu.mig_devices} == {gpu.uuid}
        assert all(d["uuid"].startswith("MIG-") and gpu.uuid[4:] not in d["uuid"] for d in gpu.mig_devices)
    assert all("mig" not in g.unsupported and "mig" not in g.errors for g in gpus)


def test_the_simulator_answers_pynvmls_mig_calls_as_a_driver_does(tmp_path):
    import pynvml

    sources = sim(tmp_path, MIG)
    nvml = sources.nvml
    nvml.nvmlInit()
    try:
        parent = nvml.nvmlDeviceGetHandleByIndex(2)
        assert nvml.nvmlDeviceGetMigMode(parent) == [1, 1]
        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
        assert nvml.nvmlDeviceIsMigDeviceHandle(mig) and not nvml.nvmlDeviceIsMigDeviceHandle(parent)
        assert nvml.nvmlDeviceGetUUID(mig) == "MIG-3b8c5a27-0f6e-5d14-92a3-4b5c6d7e8f21"
        assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == \
            nvml.nvmlDeviceGetUUID(parent)
        assert (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig)) == (0, 0)
        with pytest.raises(pynvml.NVMLError_NotFound):
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
        whole = nvml.nvmlDeviceGetHandleByIndex(5)
        assert nvml.nvmlDeviceGetMigMode(whole) == [0, 0]
    finally:
        nvml.nvmlShutdown()


def test_a_gpu_without_mig_makes_the_fact_unsupported_never_a_finding(tmp_path):
    profile = tmp_path / "no-mig.toml"
    profile.write_text(f'base = "{os.path.join(SIM_PROFILES, "h100-healthy.toml")}"\n'
                       '[overrides]\n"gpu.0.not_supported" = ["retired_pages", "mig"]\n[expect]\nfindings = []\n')
    report = probe(tmp_path, str(profile), "health")
    gpu = report.facts.nvml.gpus[0]
    assert gpu.mig_mode is None and "mig" in gpu.unsupported and gpu.driver_missing == {}
    assert report.findings == []


@pytest.mark.parametrize("driver", ["470.256.02", "535.183.01", "580.65.06"])
def test_every_modelled_driver_branch_serves_mig(tmp_path, driver):
    profile = tmp_path / "mig-branch.toml"
    profile.write_text(f'base = "{MIG}"\n[node]\ndriver_version = "{driver}"\n[expect]\nfindings = []\n')
    gpu = probe(tmp_path, str(profile)).facts.nvml.gpus[1]
    assert [d["uuid"] for d in gpu.mig_devices][-1] == ON_GPU1 and "mig" not in gpu.driver_missing


# -- golden: the healthy MIG node passes every tier, the faulty one fails with its finding ----------
@pytest.mark.parametrize("tier", ["prolog", "health", "deep"])
def test_h100_mig_passes_every_tier(tmp_path, tier):
    cfg = make_config(hardware=hardware_for("H100"), perftest={"server_wait_s": 0.1, "duration_s": 1},
                      tiers={"deep": [cid for cid in CHECKS if cid != "dcgm.diag"]})
    report = run_checks(cfg, "n1", tier, sources=sim(tmp_path, MIG))
    assert (report.status, report.findings) == ("ok", []), [f"{f.check}: {f.message}" for f in report.findings]


def test_a_lost_parent_fails_with_exactly_its_finding_on_that_gpu(tmp_path):
    report = probe(tmp_path, PARENT_LOST)
    assert [(f.check, f.gpu, f.action) for f in report.findings] == [("gpu.lost", 1, "drain")]
    assert load_profile(PARENT_LOST)["expect"]["findings"] == ["gpu.lost", "kernel.xid"]


# -- the mapping (pure) ----------------------------------------------------------------------------
def gpu(index, uuid, devices=None, state="ok", mig_mode=1):
    return GpuFacts(index=index, uuid=uuid, state=state, mig_mode=mig_mode, mig_devices=devices)


def test_mig_uuids_come_from_cuda_visible_devices_in_order():
    assert mig_uuids("MIG-b,MIG-a, MIG-b", None) == ["MIG-b", "MIG-a"]
    assert mig_uuids("0,1", "2,3") == [] and mig_uuids(None, "") == []


def test_a_mig_device_maps_to_the_parent_nvml_names_never_to_what_its_uuid_seems_to_say():
    """R450's MIG-GPU-<uuid>/<gi>/<ci> names a GPU; R470+ MIG UUIDs are opaque. Either way the
    parent is what NVML said (parent_uuid): here the UUID's text names GPU 0, NVML says GPU 1."""
    misleading = "MIG-GPU-aaaaaaaa-0000-0000-0000-000000000000/7/0"
    gpus = [gpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", []),
            gpu(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000",
                [{"uuid": misleading, "gpu_instance": 7, "compute_instance": 0,
                  "parent_uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000"},
                 {"uuid": "MIG-0f0f0f0f-1111-5222-8333-444444444444", "gpu_instance": 8, "compute_instance": 0,
                  "parent_uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000"}])]
    parents, instances, how = mig_to_parents([misleading, "MIG-0f0f0f0f-1111-5222-8333-444444444444"], gpus)
    assert (parents, how) == ([1], "mig")
    assert [(i["gpu"], i["gpu_uuid"], i["gpu_instance"]) for i in instances] == \
        [(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", 7), (1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", 8)]


def test_a_mig_device_on_a_parent_nvml_cannot_read_is_judged_on_that_parent():
    gpus = [gpu(0, "GPU-a", [{"uuid": "MIG-x", "gpu_instance": 7, "compute_instance": 0, "parent_uuid": "GPU-a"}]),
            gpu(1, "GPU-b", None, state="lost", mig_mode=None), gpu(2, "GPU-c", None, mig_mode=0)]
    assert mig_to_parents(["MIG-gone"], gpus)[::2] == ([1], "mig, unreadable")
    assert mig_to_parents(["MIG-x"], gpus)[0] == [0]
    # nothing unread, no GPU has it: every GPU is judged, and the mapping says why
    parents, _, how = mig_to_parents(["MIG-gone"], gpus[::2])
    assert parents == [0, 2] and how.startswith("mig, unknown")


# -- the hooks on a simulated MIG node --------------------------------------------------------------
@pytest.fixture
def node(tmp_path, isolated_env):
    shutil.copytree(SIM_PROFILES, tmp_path / "sim")
    config = tmp_path / "config.toml"
    config.write_text(
        '[paths]\nstate_dir = "state"\n[gpu]\nbackend = "sim"\nprobe_timeout_s = 2.0\n'
        '[sim]\nprofile = "sim/h100-mig.toml"\n'
        '[[nodes]]\nmatch = "gpu[1-3]"\ngpus = 8\ngpu_model = "H100"\nnvlinks_per_gpu = 18\n'
        '[records]\ndelivery = "inline"\n[slurm]\nbin_dir = "/nonexistent-slurm"\n')
    env = {"SLURM_GPU_HOOKS_CONFIG": str(config), "SLURMD_NODENAME": "gpu1", "SLURM_JOB_ID": "7",
           "SLURM_JOB_GPUS": "4", "CUDA_VISIBLE_DEVICES": ON_GPU1, "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    for key, value in env.items():
        isolated_env.setenv(key, value)
    return {"config": str(config), "state": str(tmp_path / "state"), "env": isolated_env}


def inject(node, *args):
    from tests.conftest import run_cli

    result = run_cli(["sim", "inject", "--config", node["config"], "gpu1", *args])
    assert result.exit_code == 0, result.stderr


def last_run(node):
    with open(os.path.join(node["state"], "hook-runs", "gpu1.jsonl")) as handle:
        return [json.loads(line) for line in handle][-1]


def kernel_pci(bus_id):
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(rest.split('.')[0], 16):02x}"


def test_the_prolog_judges_the_parent_of_the_jobs_mig_device(node):
    assert prolog.main([]) == 0
    entry = last_run(node)
    assert entry["job_gpus"] == [1] and entry["mapping"] == "mig"
    assert [(m["uuid"], m["gpu"], m["gpu_instance"], m["compute_instance"]) for m in entry["job_mig_devices"]] == \
        [(ON_GPU1, 1, 2, 0)]
    baseline = store.read_baseline(node["state"], "7", "gpu1")
    assert baseline["gpus"] == [1] and baseline["mig_devices"][0]["gpu_uuid"] == \
        "GPU-2f7c1e4a-0001-4c1d-9e2b-8a6f3d0c0001"


def test_a_job_given_an_instance_on_a_lost_parent_is_refused(node, capsys):
    inject(node, "gpu.1.state=lost")
    assert prolog.main([]) == 1
    entry = last_run(node)
    assert entry["result"] == "bad-node" and entry["mapping"] == "mig, unreadable"
    assert any("gpu.lost" in f for f in entry["findings"])
    assert "gpu-hooks: v1 gpu.lost gpu1" in capsys.readouterr().err


def test_an_instance_on_another_parent_is_not_refused_for_the_lost_one(node):
    inject(node, "gpu.1.state=lost")
    node["env"].setenv("CUDA_VISIBLE_DEVICES", ON_GPU0)
    assert prolog.main([]) == 0
    assert last_run(node)["job_gpus"] == [0]


def test_gres_indices_on_a_mig_node_without_mig_uuids_judge_every_gpu(node):
    """SLURM_JOB_GPUS indexes Slurm's list of MIG devices, not the nvidiaN files: without the
    MIG devices' UUIDs the prolog cannot tell which GPU is the job's, so it judges them all."""
    node["env"].delenv("CUDA_VISIBLE_DEVICES")
    inject(node, "gpu.6.state=lost")
    assert prolog.main([]) == 1
    entry = last_run(node)
    assert entry["job_gpus"] == list(range(8)) and entry["mapping"].startswith("all GPUs (a MIG node")


def test_the_record_names_gpu_and_instance_and_counts_an_xid_on_the_parent(node):
    assert prolog.main([]) == 0
    bus_id = load_profile(MIG)["gpu"][1]["pci_bus_id"]
    inject(node, "gpu.1.state=lost", "--log", XID79.format(pci=kernel_pci(bus_id)))
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "1:0")
    epilog.main([])
    record = store.read_record(node["state"], "7", "gpu1")
    assert record["gpus"] == [1]
    assert [(m["uuid"], m["gpu"], m["gpu_instance"], m["compute_instance"]) for m in record["mig_devices"]] == \
        [(ON_GPU1, 1, 2, 0)]
    assert record["class"] == "GPU_LOST" and record["cause"]["gpu"] == 1
    assert any(e["kind"] == "xid" and e["code"] == 79 and e.get("gpu") == 1 for e in record["evidence"]), json.dumps(record)


def test_an_xid_on_another_parent_is_not_the_instances(node):
    assert prolog.main([]) == 0
    bus_id = load_profile(MIG)["gpu"][0]["pci_bus_id"]
    inject(node, "--log", XID48.format(pci=kernel_pci(bus_id)))
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "0:0")
    epilog.main([])
    record = store.read_record(node["state"], "7", "gpu1")
    assert not any(e["kind"] == "xid" for e in record["evidence"]) and record["mig_devices"][0]["gpu"] == 1


# -- dcgmi diag is skipped on a MIG GPU -------------------------------------------------------------
def test_diag_targets_leave_out_mig_gpus():
    gpus = [gpu(0, "a", [], mig_mode=1), gpu(1, "b", None, mig_mode=0), gpu(2, "c", None, mig_mode=None)]
    assert diag_targets(gpus, None) == ([1, 2], [0])
    assert diag_targets(gpus, [0]) == ([], [0])
    assert diag_targets(gpus[1:], None) == (None, []) and diag_targets(gpus[1:], [2]) == ([2], [])


def fake_dcgmi(tmp_path):
    args = tmp_path / "dcgmi-args"
    script = tmp_path / "dcgmi"
    script.write_text(f'#!/bin/sh\necho "$@" > {args}\n'
                      'echo \'{"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": '
                      '[{"name": "software", "results": [{"entity_group": "GPU", "entity_id": 3, '
                      '"status": "Pass"}]}]}]}}\'\n')
    script.chmod(0o755)
    return str(script), args


def deep_with_dcgm(tmp_path, gpus=None):
    dcgmi, args = fake_dcgmi(tmp_path)
    cfg = make_config(hardware=hardware_for("H100"), dcgm={"dcgmi": dcgmi}, tiers={"deep": ["dcgm.diag"]})
    return run_checks(cfg, "n1", "deep", gpus=gpus, sources=sim(tmp_path / "sim", MIG)), args


def test_dcgmi_diag_runs_only_on_the_gpus_not_in_mig_mode(tmp_path):
    report, args = deep_with_dcgm(tmp_path)
    assert args.read_text().split() == ["diag", "-r", "1", "-j", "-i", "3,4,5,6,7"]
    assert report.facts.dcgm.skipped_gpus == [0, 1, 2] and "MIG" in report.facts.dcgm.message
    assert report.findings == []


def test_dcgmi_diag_on_mig_gpus_only_is_skipped_said_and_never_a_failure(tmp_path):
    report, args = deep_with_dcgm(tmp_path, gpus=[1])
    assert not args.exists()
    dcgm = report.facts.dcgm
    assert (dcgm.status, dcgm.skipped_gpus) == ("skipped", [1]) and "GPU 1: MIG mode is on" in dcgm.message
    assert report.findings == [] and report.status == "ok"
    assert dcgm_diag(default_input(dcgm=DcgmFacts(status="skipped", message="x", skipped_gpus=[0]))) == []


# -- the docs say what the code does ---------------------------------------------------------------
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


def read_doc(name):
    with open(os.path.join(DOCS, name), encoding="utf-8") as handle:
        return handle.read()


def test_checks_md_names_every_mig_call_the_probe_makes_and_the_dcgm_skip_message():
    from healthcheck import driver_support
    from healthcheck.checks.dcgm import skip_message

    text = read_doc("checks.md")
    table = text[text.index("## Driver support"):text.index("## Tiers")]
    mig_calls = [name for name, entry in driver_support.functions().items() if entry.fact == "mig"]
    assert len(mig_calls) == 7 and all(f"`{name}`" in table for name in mig_calls)
    assert all(driver_support.functions()[name].since == driver_support.BRANCHES[0] for name in mig_calls)
    assert skip_message([0, 1]).split(" (")[0] in text


def test_job_classes_md_names_the_mig_mapping_labels_and_the_record_key(node):
    text = read_doc("job-classes.md")
    assert prolog.main([]) == 0
    entry = last_run(node)
    assert f"mapping `{entry['mapping']}`" in text and "`mig, unreadable`" in text and "`mig, unknown ...`" in text
    assert "`all GPUs (a MIG node; ...)`" in text
    assert set(entry["job_mig_devices"][0]) == {"uuid", "gpu", "gpu_uuid", "gpu_instance", "compute_instance"}
    assert "`{uuid, gpu, gpu_uuid, gpu_instance, compute_instance}`" in text and "`mig_devices`" in text


XID13_TAGGED = "NVRM: Xid (PCI:{pci} GPU-I:{gi:02d} GPU-CI:00): 13, pid=1, name=python, Graphics Exception: ESR 0x1"


@pytest.mark.parametrize("gi,counted", [(2, True), (1, False)])
def test_an_xid_tagged_with_a_gpu_instance_counts_only_for_the_job_on_that_instance(node, gi, counted):
    """The job ran on GPU 1's GPU instance 2: an Xid the kernel tagged GPU-I 2 is its own, one
    tagged GPU-I 1 is the neighbour's on the same parent (an untagged one, the parent's, counts:
    test_the_record_names_gpu_and_instance_and_counts_an_xid_on_the_parent)."""
    assert prolog.main([]) == 0
    bus_id = load_profile(MIG)["gpu"][1]["pci_bus_id"]
    inject(node, "--log", XID13_TAGGED.format(pci=kernel_pci(bus_id), gi=gi))
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "1:0")
    epilog.main([])
    record = store.read_record(node["state"], "7", "gpu1")
    xids = [e for e in record["evidence"] if e["kind"] == "xid"]
    assert ([(e["code"], e.get("gpu")) for e in xids] == [(13, 1)]) == counted and (xids == []) != counted


def test_without_a_baseline_a_mig_jobs_gres_indices_are_not_taken_for_gpus(node):
    """No prolog ran (no baseline): SLURM_JOB_GPUS=4 indexes Slurm's MIG devices, not GPU 4, so the
    epilog does not take it for GPU 4: the job's GPUs are unknown (every Xid of its time counts)."""
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    node["env"].setenv("SLURM_JOB_EXIT_CODE2", "0:0")
    epilog.main([])
    record = store.read_record(node["state"], "7", "gpu1")
    assert record["gpus"] is None and record["gres"] == [4] and record["baseline"] is False
    node["env"].delenv("CUDA_VISIBLE_DEVICES")       # a job without MIG devices: GRES as before
    epilog.main([])
    assert store.read_record(node["state"], "7", "gpu1")["gpus"] == [4]


# -- MIG devices a site lists in gres.conf (Slurm 22.05: GRES indices only) ---------------------------
MIG_FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "slurm", "mig-22.05")
# h100-mig.toml's MIG devices in gres.conf's order: GPU 0's four (GPU instances 7-10), GPU 1's two
# (1, 2), GPU 2's one (0): GRES indices 0-6.
LISTED = [(0, 7), (0, 8), (0, 9), (0, 10), (1, 1), (1, 2), (2, 0)]


def captured_env(name):
    with open(os.path.join(MIG_FIXTURES, name), encoding="utf-8") as handle:
        return dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)


def test_gres_conf_as_measured_gives_one_index_per_multiplefiles_line_in_order():
    from slurm_hooks.gpumap import gres_mig_files, mig_devices_of

    with open(os.path.join(MIG_FIXTURES, "gres.conf"), encoding="utf-8") as handle:
        text = handle.read()
    listed = gres_mig_files(text, "mig1")
    assert [mig_devices_of(files) for files in listed] == [(0, 21), (0, 22), (0, 23), (0, 24), (1, 30)]
    assert gres_mig_files(text, "gpu1") == []
    # a whole GPU by File= is an index of its own; devices gres.conf does not name: nothing
    assert mig_devices_of(gres_mig_files(text + "NodeName=mig1 Name=gpu File=/dev/nvidia2\n", "mig1")[5]) == (2, None)
    assert gres_mig_files(text + "NodeName=mig1 Name=gpu Type=h100 Count=2\n", "mig1") == []
    assert gres_mig_files("NodeName=mig1 Name=gpu File=/dev/nvidia[0-7]\n", "mig1") == []     # no MIG device
    assert gres_mig_files(text, "mig1", ["3g.40gb"]) == []         # a type Gres= does not name
    assert gres_mig_files("Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap3 # x\n"
                          "Name=mps Count=100\n", "any")[0] == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap3"]


@pytest.mark.parametrize("variant, expected", [
    # measured on 22.05 (tests/fixtures/slurm/mig-22.05/order/): index -> (GPU minor, capability minor)
    ("v2", [(0, 66), (0, 75), (0, 84), (0, 93), (1, 147), (1, 156), (2, 273)] + [(g, None) for g in range(3, 8)]),
    ("v4", [(5, 93), (5, 102), (5, 111), (5, 120), (6, 156), (6, 147), (7, 273)] + [(g, None) for g in range(5)]),
    ("v5", [(g, None) for g in range(3, 8)] + [(2, 273), (1, 147), (1, 156), (0, 66), (0, 75), (0, 84), (0, 93)]),
])
def test_gres_indices_follow_slurm_confs_types_then_gres_confs_lines_as_measured(variant, expected):
    """v2: whole GPUs' File= line first in gres.conf; v4: whole GPUs on the low device numbers and
    capabilities out of numeric order; v5: slurm.conf's Gres= types reversed."""
    from slurm_hooks.gpumap import gres_gpu_types, gres_mig_files, mig_devices_of

    order = os.path.join(MIG_FIXTURES, "order")
    with open(os.path.join(order, f"gres.conf.{variant}"), encoding="utf-8") as handle:
        gres_conf = handle.read()
    with open(os.path.join(order, f"slurm.conf.{variant}"), encoding="utf-8") as handle:
        types = gres_gpu_types(handle.read(), "mig1")
    assert [mig_devices_of(files) for files in gres_mig_files(gres_conf, "mig1", types)] == expected


def test_slurm_confs_gres_types_for_a_node():
    from slurm_hooks.gpumap import gres_gpu_types

    conf = ("NodeName=DEFAULT CPUs=8 Gres=gpu:a100:8\nNodeName=n[1-2] State=UNKNOWN\n"
            "NodeName=m1 Gres=gpu:3g.40gb:2(S:0-1),gpu:h100:5,mps:100\nNodeName=u1 Gres=gpu:4\n")
    assert gres_gpu_types(conf, "n2") == ["a100"]                # the DEFAULT before it
    assert gres_gpu_types(conf, "m1") == ["3g.40gb", "h100"]
    assert gres_gpu_types(conf, "u1") == []                      # untyped: gres.conf's order
    assert gres_gpu_types(conf, "x9") is None                    # not in this file: not known
    assert gres_gpu_types("NodeName=m1 CPUs=8\n", "m1") is None


def test_the_drivers_mig_minors_name_gpu_and_instance_by_capability():
    from slurm_hooks.gpumap import mig_cap_minors

    text = "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\ngpu3/gi12/access 408\nnoise\n"
    assert mig_cap_minors(text) == {3: (0, 0, None), 4: (0, 0, 0), 408: (3, 12, None)}


def test_gres_indices_name_the_instance_and_its_parent_through_nvml():
    from slurm_hooks.gpumap import mig_from_gres

    gpus = [GpuFacts(index=0, uuid="GPU-a", minor_number=4, mig_mode=1, mig_devices=[
                {"uuid": "MIG-x", "gpu_instance": 7, "compute_instance": 0},
                {"uuid": "MIG-y", "gpu_instance": 8, "compute_instance": 0}]),
            GpuFacts(index=1, uuid="GPU-b", minor_number=None, state="lost")]
    caps = {21: (4, 8, None), 30: (5, 1, None)}
    found = mig_from_gres([0, 1, 7], [(4, 21), (5, 30)], caps, gpus)
    assert [(f["gres_index"], f["uuid"], f["gpu"], f["gpu_instance"], f["compute_instance"]) for f in found] == [
        (0, "MIG-y", 0, 8, 0),          # capability 21 is GPU minor 4's instance 8: NVML's GPU 0
        (1, None, 1, 1, None),          # minor 5 is no readable GPU's: the one NVML cannot read, lost
        (7, None, None, None, None)]    # an index gres.conf does not list


@pytest.fixture
def listed_node(node, tmp_path):
    """The simulated MIG node with its MIG devices in gres.conf beside slurm.conf, and the
    prolog's environment as Slurm 22.05 gives it for `--gres=gpu:1g.10gb:2` (captured)."""
    from healthcheck.sim.node import mig_cap_minor

    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=lab\nNodeName=DEFAULT CPUs=8\n"
                                    "NodeName=gpu[1-3] Gres=gpu:mig:7,gpu:h100:5 State=UNKNOWN\n")
    (etc / "gres.conf").write_text("".join(
        f"NodeName=gpu[1-3] Name=gpu Type=mig MultipleFiles=/dev/nvidia{gpu},"
        f"/dev/nvidia-caps/nvidia-cap{mig_cap_minor(gpu, gi)}\n" for gpu, gi in LISTED)
        + "NodeName=gpu[1-3] Name=gpu Type=h100 File=/dev/nvidia[3-7]\n")
    captured = captured_env("prolog-1g.10gb-x2.env")
    for key in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "SLURM_SCRIPT_CONTEXT"):
        node["env"].setenv(key, captured[key])
    node["env"].setenv("SLURM_CONF", str(etc / "slurm.conf"))
    return node


def test_the_prolog_names_the_mig_devices_gres_conf_lists_and_still_judges_every_gpu(listed_node):
    assert prolog.main([]) == 0
    entry = last_run(listed_node)
    assert entry["job_gpus"] == list(range(8)) and entry["mapping"].endswith("by GRES index from gres.conf)")
    assert [(m["gres_index"], m["uuid"], m["gpu"], m["gpu_instance"], m["compute_instance"])
            for m in entry["job_mig_devices"]] == [(1, ON_GPU0, 0, 8, 0),
                                                   (2, "MIG-f4c2a913-7e5b-5a28-9c6d-0e1f2a3b4c03", 0, 9, 0)]


def test_a_lost_gpu_the_indices_leave_out_still_refuses_the_job(listed_node):
    """Slurm 22.05 gives the Prolog only the last MIG type's indices of a job asking for two (the
    captured `--gres=gpu:1g.10gb:1,gpu:3g.40gb:1`: "4", of 2 and 4): the 1g.10gb instance's parent
    is left out, so every GPU is judged, and its loss refuses the job."""
    captured = captured_env("prolog-1g.10gb+3g.40gb.env")
    assert captured["SLURM_JOB_GPUS"] == captured["CUDA_VISIBLE_DEVICES"] == "4"
    listed_node["env"].setenv("SLURM_JOB_GPUS", captured["SLURM_JOB_GPUS"])
    listed_node["env"].setenv("CUDA_VISIBLE_DEVICES", captured["CUDA_VISIBLE_DEVICES"])
    inject(listed_node, "gpu.0.state=lost")
    assert prolog.main([]) == 1
    entry = last_run(listed_node)
    assert entry["result"] == "bad-node" and any("gpu.lost" in f for f in entry["findings"])
    assert [(m["gres_index"], m["gpu"], m["gpu_instance"]) for m in entry["job_mig_devices"]] == [(4, 1, 1)]


def test_an_instance_on_the_lost_parent_names_that_gpu(listed_node):
    """A lost GPU has no minor number in NVML: the one GPU NVML cannot read is the parent (the
    helper's run on Slurm 22.05 named none before)."""
    inject(listed_node, "gpu.1.state=lost")
    listed_node["env"].setenv("SLURM_JOB_GPUS", "4")
    assert prolog.main([]) == 1
    (device,) = last_run(listed_node)["job_mig_devices"]
    assert (device["gpu"], device["gpu_instance"], device["uuid"]) == (1, 1, None)


def test_the_record_names_the_gres_conf_listed_instances(listed_node):
    assert prolog.main([]) == 0
    listed_node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    listed_node["env"].setenv("SLURM_JOB_EXIT_CODE2", "0:0")
    epilog.main([])
    record = store.read_record(listed_node["state"], "7", "gpu1")
    assert [(m["gpu"], m["gpu_instance"]) for m in record["mig_devices"]] == [(0, 8), (0, 9)]
    assert record["class"] == "COMPLETED"


def test_a_gres_conf_the_naming_trips_on_still_judges_every_gpu(listed_node, monkeypatch, capsys):
    """Naming the MIG devices is for the record: a bug there costs the names, never the check."""
    import slurm_hooks.gpumap as gpumap

    def broken(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(gpumap, "mig_from_gres", broken)
    inject(listed_node, "gpu.6.state=lost")
    assert prolog.main([]) == 1
    entry = last_run(listed_node)
    assert entry["result"] == "bad-node" and "job_mig_devices" not in entry
    assert "not named from gres.conf: RuntimeError: boom" in capsys.readouterr().err
