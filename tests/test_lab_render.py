"""The lab's generated configuration, without starting anything."""
from __future__ import annotations

import os
import re
import stat
import subprocess

import pytest

from healthcheck.config import Config
from slurm_hooks.lab import paths as P
from slurm_hooks.lab import render
from slurm_hooks.lab.paths import LabPaths

LAB = LabPaths("/var/tmp/lab-under-test")


def options(**overrides) -> render.RenderOptions:
    values = dict(host="vm", bin_dir="/opt/venv/bin", python="/opt/venv/bin/python3", cgroup=False)
    values.update(overrides)
    return render.RenderOptions(**values)


def conf_lines(text: str):
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def conf_dict(text: str):
    out = {}
    for line in conf_lines(text):
        key, _, value = line.partition("=")
        out.setdefault(key, value)
    return out


def test_slurm_conf_installs_every_hook_and_the_lab_settings():
    conf = conf_dict(render.slurm_conf(LAB, options()))
    assert conf["Prolog"] == LAB.hook("prolog")
    assert conf["Epilog"] == LAB.hook("epilog")
    assert conf["EpilogSlurmctld"] == LAB.hook("epilog-slurmctld")
    assert conf["HealthCheckProgram"] == LAB.hook("healthcheck")
    assert conf["TaskProlog"] == LAB.hook("taskprolog")
    assert conf["PrologFlags"] == "Alloc"
    assert int(conf["HealthCheckInterval"]) <= 15
    assert conf["SlurmctldHost"] == "vm(127.0.0.1)"
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert conf["AccountingStorageTRES"] == "gres/gpu"
    for key, value in {"ReturnToService": "1", "JobRequeue": "0", "KillWait": "2", "OverTimeLimit": "0",
                       "SlurmdTimeout": "10", "SlurmdParameters": "config_overrides", "MinJobAge": "600",
                       "PreemptType": "preempt/partition_prio", "GresTypes": "gpu"}.items():
        assert conf[key] == value, key
    # bench/scale's baseline (`lab up --hooks-off`): the same cluster with no hook named
    off = conf_dict(render.slurm_conf(LAB, options(hooks=False)))
    hooks = {"Prolog", "Epilog", "EpilogSlurmctld", "HealthCheckProgram", "HealthCheckInterval", "TaskProlog"}
    assert not hooks & set(off) and {k: v for k, v in conf.items() if k not in hooks | {"HealthCheckNodeState"}} == off
    # the lab's own munged, for the cluster and for slurmdbd connections alike
    assert conf["AuthInfo"] == f"socket={LAB.munge_socket}"
    assert conf["AccountingStoragePass"] == LAB.munge_socket
    # every state, log and pid path stays inside the lab directory
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile",
                "SlurmctldLogFile", "SlurmdLogFile"):
        assert conf[key].startswith(LAB.root + "/"), key


def test_three_nodes_with_eight_gpus_and_distinct_ports():
    text = render.slurm_conf(LAB, options())
    nodes = [line for line in conf_lines(text) if line.startswith("NodeName=")]
    assert [re.search(r"NodeName=(\S+)", n).group(1) for n in nodes] == ["gpu1", "gpu2", "gpu3"]
    ports = [re.search(r"Port=(\d+)", n).group(1) for n in nodes]
    assert len(set(ports)) == 3
    assert all("Gres=gpu:8" in n and "CPUs=8" in n for n in nodes)
    gres = conf_lines(render.gres_conf(LAB, options()))
    assert gres == [f"NodeName={n} Name=gpu File={LAB.fake_gpu_dir(n)}/nvidia[0-7]" for n in P.NODES]


def test_n_nodes_each_with_its_port_gres_and_profile():
    """`lab up --nodes 256`: gpu1..gpu256, one slurmd port each, every node bound to the healthy
    H100 profile and matched by the hooks config's [[nodes]]."""
    nodes = P.node_names(P.MAX_NODES)
    text = render.slurm_conf(LAB, options(nodes=nodes))
    lines = [line for line in conf_lines(text) if line.startswith("NodeName=")]
    assert [re.search(r"NodeName=(\S+)", n).group(1) for n in lines] == [f"gpu{i}" for i in range(1, 257)]
    ports = [int(re.search(r"Port=(\d+)", n).group(1)) for n in lines]
    assert ports == list(range(P.SLURMD_FIRST_PORT, P.SLURMD_FIRST_PORT + 256))
    assert "Nodes=gpu[1-256]" in text
    assert render.health_interval_for(3) == render.HEALTH_CHECK_INTERVAL and render.health_interval_for(256) == 256
    assert len(conf_lines(render.gres_conf(LAB, options(nodes=nodes)))) == 256
    from healthcheck.safeio import tomlio

    config = Config.from_document(tomlio.loads(render.hooks_config(LAB, options(nodes=nodes))),
                                  os.path.join(LAB.etc, "slurm-gpu-hooks.toml"))
    for node in ("gpu1", "gpu128", "gpu256"):
        assert config.sim_profile_path(node) == os.path.join(LAB.sim_profiles, "h100-healthy.toml")
        assert config.expected_hardware(node)["gpus"] == 8


def test_the_lab_reads_its_node_count_and_falls_back_to_three(tmp_path):
    lab = LabPaths(str(tmp_path))
    assert lab.nodes() == P.NODES == ("gpu1", "gpu2", "gpu3")          # nothing recorded
    os.makedirs(lab.etc)
    for text, expected in (("8\n", P.node_names(8)), ("256", P.node_names(256)), ("0", P.NODES),
                           ("257", P.NODES), ("many", P.NODES)):
        with open(lab.nodes_file, "w", encoding="ascii") as handle:
            handle.write(text)
        assert lab.nodes() == expected, text
    assert P.slurmd_port("gpu1") == P.SLURMD_FIRST_PORT and P.slurmd_port("gpu256") == P.SLURMD_FIRST_PORT + 255


def test_resizing_a_lab_that_is_not_there_records_the_count(tmp_path):
    from slurm_hooks.lab import cluster

    lab = LabPaths(str(tmp_path / "lab"))
    assert cluster.resize(lab, 16, print) == 3                             # from the default
    assert lab.nodes() == P.node_names(16)
    assert cluster.resize(lab, 16, print) is None
    with pytest.raises(Exception, match="1 to 256"):
        cluster.resize(lab, 300, print)


def test_two_partitions_with_different_priority_tiers():
    parts = [line for line in conf_lines(render.slurm_conf(LAB, options())) if line.startswith("PartitionName=")]
    tiers = {re.search(r"PartitionName=(\S+)", p).group(1): int(re.search(r"PriorityTier=(\d+)", p).group(1))
             for p in parts}
    assert set(tiers) == {"low", "high"} and tiers["high"] > tiers["low"]
    assert all("Nodes=gpu[1-3]" in p for p in parts)


def test_memory_cgroups_only_when_asked():
    plain = conf_dict(render.slurm_conf(LAB, options(cgroup=False)))
    assert plain["TaskPlugin"] == "task/none"
    assert LAB.cgroup_conf not in render.all_files(LAB, options(cgroup=False), "pw1")
    with_cgroup = conf_dict(render.slurm_conf(LAB, options(cgroup=True)))
    assert with_cgroup["TaskPlugin"] == "task/cgroup"
    cgroup = conf_dict(render.all_files(LAB, options(cgroup=True), "pw1")[LAB.cgroup_conf][0])
    assert cgroup["ConstrainRAMSpace"] == "yes"
    assert cgroup["ConstrainDevices"] == "no"  # the hooks must see absolute GPU indices


def test_slurmdbd_conf_is_private_and_uses_the_lab_database():
    files = render.all_files(LAB, options(), "abc123")
    text, mode = files[LAB.slurmdbd_conf]
    assert mode == 0o600
    conf = conf_dict(text)
    assert conf["StoragePort"] == str(P.MARIADB_PORT)
    assert conf["StoragePass"] == "abc123"
    assert conf["PidFile"].startswith(LAB.root)
    with pytest.raises(ValueError):
        render.slurmdbd_conf(LAB, "bad'pass")


def test_lab_dir_with_spaces_is_refused():
    with pytest.raises(ValueError):
        render.slurm_conf(LabPaths("/tmp/with space"), options())


def test_hooks_config_is_valid_and_binds_each_node_to_a_profile():
    text = render.hooks_config(LAB, options())
    from healthcheck.safeio import tomlio

    doc = tomlio.loads(text)
    config = Config.from_document(doc, os.path.join(LAB.etc, "slurm-gpu-hooks.toml"))
    assert config.backend == "sim"
    assert config.state_dir == LAB.state
    for node in P.NODES:
        assert config.sim_profile_path(node) == os.path.join(LAB.sim_profiles, "h100-healthy.toml")
        expected = config.expected_hardware(node)
        assert expected["gpus"] == 8 and expected["gpu_model"] == "H100"
        assert expected["nvlinks_per_gpu"] == 18 and expected["nvswitch_fabric"] is True
        assert expected["ib_ports"] == [f"mlx5_{i}:1" for i in range(8)]
        assert expected["ib_rate_gbps"] == 400
    assert config.section("drain")["reason_prefix"] == "gpu-hooks:"


def test_the_lab_copies_the_shipped_profiles(tmp_path):
    from healthcheck.config import shipped
    from slurm_hooks.lab.cluster import copy_sim_profiles
    from slurm_hooks.lab.paths import LabPaths

    lab = LabPaths(str(tmp_path))
    os.makedirs(lab.sim_profiles)
    copy_sim_profiles(lab)
    copied = sorted(name[:-5] for name in os.listdir(lab.sim_profiles))
    assert "h100-healthy" in copied and copied == shipped.shipped_names()


def test_wrappers_set_config_paths_and_never_path(tmp_path):
    """Slurm runs HealthCheckProgram with SLURMD_NODENAME and nothing else."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for script in sorted({spec[1] for spec in render.HOOKS.values() if spec[1]}):
        target = fake_bin / script
        target.write_text("#!/bin/sh\necho \"$0\"; echo \"SLURM_CONF=$SLURM_CONF\"; "
                          "echo \"CONFIG=$SLURM_GPU_HOOKS_CONFIG\"; echo \"PATH=${PATH-unset}\"\n")
        target.chmod(0o755)
    lab = LabPaths(str(tmp_path / "lab"))
    opts = options(bin_dir=str(fake_bin))
    for hook in (hook for hook, spec in render.HOOKS.items() if spec[1]):
        text = render.hook_wrapper(lab, hook, opts)
        assert "PATH=" not in text
        wrapper = tmp_path / hook
        wrapper.write_text(text)
        wrapper.chmod(0o755)
        out = subprocess.run(["/usr/bin/env", "-i", "SLURMD_NODENAME=gpu1", str(wrapper)],
                             capture_output=True, text=True, timeout=10).stdout.splitlines()
        assert out[0] == str(fake_bin / render.HOOKS[hook][1])
        assert out[1] == f"SLURM_CONF={lab.slurm_conf}"
        assert out[2] == f"CONFIG={lab.hooks_config}"


def test_the_reboot_program_names_its_lab_and_refuses_to_run_outside_a_slurmd(tmp_path):
    """RebootProgram gets no arguments and no node name from slurmd: the wrapper names the lab,
    the program finds its node from the slurmd above it, and without one says so (exit 1)."""
    import sys

    lab = LabPaths(str(tmp_path / "lab"))
    text = render.hook_wrapper(lab, "reboot", options(bin_dir=str(tmp_path), python=sys.executable))
    assert "PATH=" not in text and f"SLURM_GPU_LAB_DIR={lab.root}" in text
    assert "-m slurm_hooks.lab.reboot" in text
    wrapper = tmp_path / "reboot"
    wrapper.write_text(text)
    wrapper.chmod(0o755)
    done = subprocess.run(["/usr/bin/env", "-i", str(wrapper)], capture_output=True, text=True, timeout=60,
                          cwd=str(tmp_path))
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "slurm-gpu lab RebootProgram: no slurmd above this process names its node"], done.stderr
    assert "RebootProgram=" + lab.hook("reboot") in render.slurm_conf(lab, options())


def test_wrapper_falls_back_to_the_module_without_console_scripts(tmp_path):
    opts = options(bin_dir=str(tmp_path), python="/usr/bin/python3")
    assert render.hook_command("healthcheck", opts) == ["/usr/bin/python3", "-I", "-m", "healthcheck.healthcheck"]
    assert render.hook_command("epilog-slurmctld", opts)[-1] == "slurm_hooks.epilog"


def test_all_files_modes():
    files = render.all_files(LAB, options(), "pw")
    for hook in render.HOOKS:
        assert files[LAB.hook(hook)][1] == 0o755
    assert files[LAB.slurm_conf][1] == 0o644
    assert not any(mode & stat.S_IWOTH for _text, mode in files.values())


def test_cgroup_probe_reports_why_not(tmp_path):
    assert "no cgroup v1 memory controller" in render.cgroup_v1_memory(str(tmp_path))


def test_the_taskprolog_wrapper_lets_the_task_run_when_its_user_cannot_start_the_hook(tmp_path):
    """Slurm runs the TaskProlog as the job's user; a hook that user cannot execute must not
    fail the task (exit 126 from the wrapper would)."""
    unrunnable = tmp_path / "bin"
    unrunnable.mkdir()
    script = unrunnable / render.HOOKS["taskprolog"][1]
    script.write_text("#!/nonexistent/python\n")
    script.chmod(0o755)
    wrapper = tmp_path / "taskprolog"
    wrapper.write_text(render.hook_wrapper(LabPaths(str(tmp_path / "lab")), "taskprolog",
                                           options(bin_dir=str(unrunnable))))
    wrapper.chmod(0o755)
    done = subprocess.run(["/usr/bin/env", "-i", str(wrapper)], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0 and done.stdout == "" and done.stderr
    # every other hook still execs (its exit status is Slurm's signal)
    assert render.hook_wrapper(LAB, "epilog", options()).rstrip().splitlines()[-1].startswith("exec ")


def test_gb200_trays_get_four_gpus_their_profile_and_their_own_group():
    """`lab up --gb200 2`: gpu2 and gpu3 are GB200 NVL72 trays; gpu1 stays the H100 node."""
    from dataclasses import replace

    from healthcheck.safeio import tomlio

    opts = replace(options(), gb200=("gpu2", "gpu3"))
    nodes = {re.search(r"NodeName=(\S+)", line).group(1): line
             for line in conf_lines(render.slurm_conf(LAB, opts)) if line.startswith("NodeName=")}
    assert "Gres=gpu:8 " in nodes["gpu1"] and "Gres=gpu:4 " in nodes["gpu2"] and "Gres=gpu:4 " in nodes["gpu3"]
    gres = conf_lines(render.gres_conf(LAB, opts))
    assert gres[0].endswith("gpu1/nvidia[0-7]") and gres[2].endswith("gpu3/nvidia[0-3]")
    config = Config.from_document(tomlio.loads(render.hooks_config(LAB, opts)),
                                  os.path.join(LAB.etc, "slurm-gpu-hooks.toml"))
    assert config.sim_profile_path("gpu1") == os.path.join(LAB.sim_profiles, "h100-healthy.toml")
    assert config.sim_profile_path("gpu3") == os.path.join(LAB.sim_profiles, "gb200-nvl72-healthy.toml")
    assert config.expected_hardware("gpu1")["gpus"] == 8
    tray = config.expected_hardware("gpu2")
    assert tray["gpus"] == 4 and tray["gpu_model"] == "GB200" and tray["imex_owned"] is True
    assert tray["ib_ports"] == [f"mlx5_{i}:1" for i in range(4)]


def test_the_lab_reads_its_gb200_trays_as_its_last_nodes(tmp_path):
    lab = LabPaths(str(tmp_path))
    os.makedirs(lab.etc)
    assert lab.gb200_nodes() == () and lab.gpus("gpu3") == 8                   # nothing recorded
    with open(lab.gb200_file, "w") as handle:
        handle.write("2\n")
    assert lab.gb200_nodes() == ("gpu2", "gpu3") and lab.gpus("gpu3") == 4 and lab.gpus("gpu1") == 8
    with open(lab.gb200_file, "w") as handle:
        handle.write("3\n")                                                     # never every node
    assert lab.gb200_nodes() == ()


def test_a_mig_node_lists_each_mig_device_as_a_typed_gres_the_prolog_can_name():
    """`lab up --mig 1`: gpu3 is h100-mig's node; gres.conf lists its MIG devices by hand (the
    GPU's and the capability's device files), which is what the prolog names them from."""
    from dataclasses import replace

    from healthcheck.safeio import tomlio
    from healthcheck.sim.node import mig_cap_minor
    from slurm_hooks.gpumap import gres_gpu_types, gres_mig_files, mig_devices_of

    opts = replace(options(), mig=("gpu3",))
    nodes = {re.search(r"NodeName=(\S+)", line).group(1): line
             for line in conf_lines(render.slurm_conf(LAB, opts)) if line.startswith("NodeName=")}
    assert "Gres=gpu:8 " in nodes["gpu1"]
    assert "Gres=gpu:1g.10gb:4,gpu:3g.40gb:2,gpu:7g.80gb:1,gpu:h100:5 " in nodes["gpu3"]
    text = render.gres_conf(LAB, opts)
    listed = gres_mig_files(text, "gpu3", gres_gpu_types(render.slurm_conf(LAB, opts), "gpu3"))
    assert [mig_devices_of(files) for files in listed] == [
        (0, mig_cap_minor(0, gi)) for gi in (7, 8, 9, 10)] + [(1, mig_cap_minor(1, 1)), (1, mig_cap_minor(1, 2)),
                                                            (2, mig_cap_minor(2, 0))] + [(g, None) for g in range(3, 8)]
    assert gres_mig_files(text, "gpu1") == []                   # whole GPUs by File=
    config = Config.from_document(tomlio.loads(render.hooks_config(LAB, opts)),
                                  os.path.join(LAB.etc, "slurm-gpu-hooks.toml"))
    assert config.sim_profile_path("gpu3") == os.path.join(LAB.sim_profiles, "h100-mig.toml")
    assert config.expected_hardware("gpu3")["gpus"] == 8


def test_the_lab_reads_its_mig_nodes_as_its_last_h100_nodes(tmp_path):
    lab = LabPaths(str(tmp_path))
    os.makedirs(lab.etc)
    assert lab.mig_nodes() == ()
    with open(lab.mig_file, "w") as handle:
        handle.write("1\n")
    assert lab.mig_nodes() == ("gpu3",)
    with open(lab.gb200_file, "w") as handle:
        handle.write("1\n")
    assert lab.mig_nodes() == ("gpu2",)                         # before the GB200 tray
    with open(lab.mig_file, "w") as handle:
        handle.write("2\n")                                     # never every H100 node
    assert lab.mig_nodes() == ()
