"""slurm-gpu-taskprolog: the NCCL variables a task gets, derived from the node's PCI/NUMA
topology and IB ports (rendered by the simulator in real sysfs and /proc formats), never
overriding the task's own, printing nothing on any problem."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from healthcheck.config.settings import NcclSettings
from healthcheck.facts import IbPortFacts
from healthcheck.taskenv.nccl_env import MARK, Plan, chosen_ports, derive, digest, gid_index, plan, task_gpus, usable_ports
from healthcheck.sim.node import SimNode
from healthcheck.plain import replace
from healthcheck.taskenv.topology import GpuPlace, HcaPlace, PciPlace, closest, gpu_places, hca_places, parse_minor

from .conftest import SIM_PROFILES

BIN = os.path.dirname(sys.executable)
INFORMATION = """Model: \t\t NVIDIA H100 80GB HBM3
IRQ:   \t\t 318
GPU UUID: \t GPU-2f7c1e4a-0000-4c1d-9e2b-8a6f3d0c0000
Video BIOS: \t 96.00.74.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t 0000:18:00.0
Device Minor: \t 3
GPU Excluded:\t No
"""


def test_device_minor_from_the_drivers_information_file():
    assert parse_minor(INFORMATION) == 3
    assert parse_minor("Model: x\n") is None and parse_minor("Device Minor: \t x\n") is None


def place(*path, numa=None):
    return PciPlace(address=path[-1], path=tuple(path), numa_node=numa)


def test_same_switch_beats_same_numa_beats_nothing():
    gpu = place("pci0000:00", "pex0", "0000:18:00.0", numa=0)
    hcas = [HcaPlace("mlx5_0", place("pci0000:00", "pex0", "0000:19:00.0", numa=0)),
            HcaPlace("mlx5_1", place("pci0000:00", "pex1", "0000:29:00.0", numa=0)),
            HcaPlace("mlx5_4", place("pci0000:80", "pex4", "0000:99:00.0", numa=1))]
    assert [h.hca for h in closest(gpu, hcas)] == ["mlx5_0"]
    assert [h.hca for h in closest(gpu, hcas[1:])] == ["mlx5_1"]
    assert [h.hca for h in closest(gpu, hcas[2:])] == ["mlx5_4"]


def port(hca, state=4, layer="InfiniBand", gids=None, number=1):
    return IbPortFacts(hca=hca, port=number, state=state, link_layer=layer, gid_types=gids or {})


def test_task_gpus_step_first_then_job():
    assert task_gpus({"SLURM_STEP_GPUS": "3,4", "SLURM_JOB_GPUS": "0,1,3,4"}) == [3, 4]
    assert task_gpus({"SLURM_JOB_GPUS": "5"}) == [5]
    assert task_gpus({}) is None and task_gpus({"SLURM_JOB_GPUS": "gpu:2"}) is None


def test_only_active_expected_ports_are_usable():
    ports = [port("mlx5_1"), port("mlx5_0", state=1), port("mlx5_2")]
    assert [p.hca for p in usable_ports(ports, None)] == ["mlx5_1", "mlx5_2"]
    assert [p.hca for p in usable_ports(ports, ["mlx5_0:1", "mlx5_2:1"])] == ["mlx5_2"]


def test_roce_gid_index_configured_else_lowest_common_v2():
    a = port("mlx5_0", layer="Ethernet", gids={0: "IB/RoCE v1", 1: "RoCE v2", 3: "RoCE v2"})
    b = port("mlx5_1", layer="Ethernet", gids={3: "RoCE v2"})
    assert gid_index([a, b], None) == 3 and gid_index([a], None) == 1 and gid_index([a, b], 5) == 5
    assert gid_index([port("mlx5_0")], 3) is None


def test_a_task_without_placed_gpus_gets_every_usable_port():
    ports = [port("mlx5_0"), port("mlx5_1")]
    assert chosen_ports(None, {}, {}, ports) == ports
    assert chosen_ports([7], {}, {}, ports) == ports


def test_derive_never_exports_what_the_user_set_and_refuses_line_breaks():
    gpus = {0: GpuPlace(0, place("pci0000:00", "pex0", "0000:18:00.0", numa=0))}
    hcas = {"mlx5_0": HcaPlace("mlx5_0", place("pci0000:00", "pex0", "0000:19:00.0", numa=0), {"ib0": "up"}),
            "mlx5_1": HcaPlace("mlx5_1", place("pci0000:00", "pex1", "0000:29:00.0", numa=0), {"ib1": "up"})}
    ports = [port("mlx5_0"), port("mlx5_1")]
    env = {"SLURM_JOB_GPUS": "0"}
    settings = NcclSettings(socket_ifname="", env={"NCCL_IB_TIMEOUT": "22"})
    mark = f"NCCL_IB_HCA:{digest('=mlx5_0:1')},NCCL_SOCKET_IFNAME:{digest('=ib0')},NCCL_IB_TIMEOUT:{digest('22')}"
    assert derive(env, ports, gpus, hcas, {}, settings) == Plan(exports=[
        ("NCCL_IB_HCA", "=mlx5_0:1"), ("NCCL_SOCKET_IFNAME", "=ib0"), ("NCCL_IB_TIMEOUT", "22"), (MARK, mark)])
    mine = dict(env, NCCL_IB_HCA="mlx5_1", NCCL_IB_TIMEOUT="5")
    assert derive(mine, ports, gpus, hcas, {}, replace(settings, socket_ifname="^lo")) == Plan(exports=[
        ("NCCL_SOCKET_IFNAME", "^lo"), (MARK, f"NCCL_SOCKET_IFNAME:{digest('^lo')}")])
    with pytest.raises(ValueError):
        derive(env, ports, gpus, hcas, {}, NcclSettings(socket_ifname="", env={"NCCL_X": "a\nexport LD_PRELOAD=/tmp/x"}))


def test_what_a_task_inherited_from_our_export_is_derived_again_what_the_user_changed_stays():
    # The batch script's TaskProlog exported these; srun passed them on to this step's task.
    inherited = {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME": "=ib0,ib1", "NCCL_IB_GID_INDEX": "3",
                 "NCCL_IB_TIMEOUT": "22"}
    env = dict(inherited, **{MARK: ",".join(f"{k}:{digest(v)}" for k, v in inherited.items())})
    now = [("NCCL_IB_HCA", "=mlx5_0:1"), ("NCCL_SOCKET_IFNAME", "=ib0"), ("NCCL_IB_TIMEOUT", "22")]
    done = plan(env, now)
    # mlx5_1 went down: both derived values change; the GID index is no longer ours to give; the
    # unchanged fixed setting is not printed again.
    assert done.exports[:2] == now[:2] and done.unsets == ["NCCL_IB_GID_INDEX"]
    assert done.exports[2] == (MARK, ",".join(f"{k}:{digest(v)}" for k, v in now))
    # The user replaced NCCL_IB_HCA in the batch script after our export: theirs, kept.
    users = dict(env, NCCL_IB_HCA="=mlx5_7:1")
    done = plan(users, now)
    assert "NCCL_IB_HCA" not in dict(done.exports) and "NCCL_IB_HCA" not in done.unsets
    assert dict(done.exports)["NCCL_SOCKET_IFNAME"] == "=ib0"
    # Nothing left to give: every inherited value of ours and the record go.
    assert plan(env, []) == Plan(exports=[], unsets=sorted(inherited) + [MARK])
    # The same values again: nothing to print.
    same = list(inherited.items())
    assert plan(env, same) == Plan()


def test_a_record_that_does_not_match_claims_nothing():
    env = {"NCCL_IB_HCA": "=mlx5_3:1", MARK: "NCCL_IB_HCA:00000000,garbage,:x,NCCL_NOT_SET:" + digest("")}
    assert plan(env, [("NCCL_IB_HCA", "=mlx5_0:1")]) == Plan(unsets=[MARK])


# -- the simulator renders real formats; the console script end to end ------------------------------------------
def config(tmp_path, nccl_env=True, extra=""):
    path = tmp_path / "config.toml"
    path.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n[gpu]\nbackend = "sim"\n'
                    f'[sim]\nprofile = "{SIM_PROFILES}/h100-healthy.toml"\n'
                    f'[[nodes]]\nmatch = "n1"\nnccl_env = {str(nccl_env).lower()}\n'
                    '[nccl]\nenv = { NCCL_IB_TIMEOUT = "22" }\n' + extra)
    SimNode(str(tmp_path / "state"), "n1", os.path.join(SIM_PROFILES, "h100-healthy.toml")).ensure()
    return str(path)


def taskprolog(cfg, **env):
    full = {"SLURM_GPU_HOOKS_CONFIG": cfg, "SLURMD_NODENAME": "n1", **env}
    return subprocess.run([os.path.join(BIN, "slurm-gpu-taskprolog")], capture_output=True, text=True, env=full,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_sim_topology_reads_like_a_dgx(tmp_path):
    config(tmp_path)
    root = tmp_path / "state" / "sim" / "n1"
    gpus = gpu_places(str(root / "sys"), str(root / "proc"))
    hcas = hca_places(str(root / "sys"))
    assert sorted(gpus) == list(range(8)) and gpus[5].place.address == "0000:ab:00.0"
    assert gpus[5].place.numa_node == 1 and gpus[5].place.path[-2] == "pex5"
    assert sorted(hcas) == [f"mlx5_{i}" for i in range(8)] and hcas["mlx5_5"].netdevs == {"ib5": "up"}
    assert [h.hca for h in closest(gpus[5].place, list(hcas.values()))] == ["mlx5_5"]


def test_console_script_exports_the_closest_ports_and_keeps_the_users(tmp_path):
    cfg = config(tmp_path)
    done = taskprolog(cfg, SLURM_JOB_GPUS="0,5")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines()[:3] == ["export NCCL_IB_HCA==mlx5_0:1,mlx5_5:1",
                                            "export NCCL_SOCKET_IFNAME==ib0,ib5", "export NCCL_IB_TIMEOUT=22"]
    assert done.stdout.splitlines()[3].startswith(f"export {MARK}=NCCL_IB_HCA:") and len(done.stdout.splitlines()) == 4
    done = taskprolog(cfg, SLURM_JOB_GPUS="0,5", NCCL_IB_HCA="=mlx5_3", NCCL_IB_TIMEOUT="19")
    assert done.stdout.splitlines()[0] == "export NCCL_SOCKET_IFNAME==ib0,ib5"
    assert applied({}, done.stdout)[MARK] == f"NCCL_SOCKET_IFNAME:{digest('=ib0,ib5')}"


def applied(env, stdout):
    """The task's environment after Slurm applied the TaskProlog's lines."""
    out = dict(env)
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "export":
            name, _, value = rest.partition("=")
            out[name] = value
        elif word == "unset":
            out.pop(rest, None)
    return out


def test_a_port_set_down_during_the_job_leaves_the_next_steps_tasks(tmp_path):
    """Seen in the lab: the batch script's task got mlx5_0,mlx5_1; mlx5_1 went down; the next
    srun step's task inherited the batch environment and kept mlx5_1 (taken for the user's)."""
    cfg = config(tmp_path)
    batch = applied({"SLURM_JOB_GPUS": "0,1"}, taskprolog(cfg, SLURM_JOB_GPUS="0,1").stdout)
    assert batch["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    SimNode(str(tmp_path / "state"), "n1").inject([("ib.mlx5_1:1.state", "1: DOWN")])
    step = {k: v for k, v in batch.items() if k != "SLURM_GPU_HOOKS_CONFIG"}
    step["SLURM_STEP_GPUS"] = "0,1"
    task = applied(step, taskprolog(cfg, **step).stdout)
    assert task["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_2:1,mlx5_3:1"      # GPU 1's NUMA neighbours stand in
    assert task["NCCL_SOCKET_IFNAME"] == "=ib0,ib2,ib3" and task["NCCL_IB_TIMEOUT"] == "22"
    # The user's own choice in the batch script, after our export, stays.
    mine = dict(step, NCCL_IB_HCA="=mlx5_7:1")
    assert applied(mine, taskprolog(cfg, **mine).stdout)["NCCL_IB_HCA"] == "=mlx5_7:1"


def test_a_port_set_down_is_left_out(tmp_path):
    cfg = config(tmp_path)
    SimNode(str(tmp_path / "state"), "n1").inject([("ib.mlx5_5:1.state", "1: DOWN")])
    lines = taskprolog(cfg, SLURM_STEP_GPUS="5").stdout.splitlines()
    # GPU 5's own HCA is down: the ACTIVE HCAs on its NUMA node instead.
    assert lines[0] == "export NCCL_IB_HCA==mlx5_4:1,mlx5_6:1,mlx5_7:1"


def test_nodes_that_did_not_opt_in_and_broken_nodes_print_nothing(tmp_path):
    assert taskprolog(config(tmp_path, nccl_env=False), SLURM_JOB_GPUS="0").stdout == ""
    cfg = config(tmp_path)
    done = taskprolog(cfg, SLURMD_NODENAME="n2", SLURM_JOB_GPUS="0")     # no [[nodes]] entry
    assert (done.returncode, done.stdout) == (0, "")
    bad = tmp_path / "bad.toml"
    bad.write_text('[nccl]\nenv = { "NCCL X" = "1" }\n')
    done = taskprolog(str(bad), SLURM_JOB_GPUS="0")
    assert done.returncode == 0 and done.stdout == "" and len(done.stderr.splitlines()) == 1


def test_a_task_start_loads_no_cli_no_nvml_and_starts_no_process(tmp_path):
    probe = ("import sys\n"
             "from slurm_hooks import taskprolog\n"
             "assert taskprolog.main([]) == 0\n"
             "print(sorted(m for m in ('click', 'jinja2', 'pynvml', 'subprocess', 'ctypes') if m in sys.modules),"
             " file=sys.stderr)\n")
    env = {"SLURM_GPU_HOOKS_CONFIG": config(tmp_path), "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "0"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "export NCCL_IB_HCA==mlx5_0:1" in done.stdout and done.stderr.strip() == "[]"
