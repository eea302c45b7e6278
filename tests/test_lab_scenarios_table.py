"""The scenario table, the runner's parsing and the job payload, without a cluster."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from slurm_hooks.lab import LabError
from slurm_hooks.lab import scenarios as S
from slurm_hooks.lab.slurmcli import FINAL_STATES, is_final, parse_oneliner

REQUIRED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"}


def test_shipped_table_covers_every_ending():
    table = S.load_table()
    states = {s.expect_state for s in table}
    assert REQUIRED <= states
    assert all(any(s.expect_state.startswith(f) for f in FINAL_STATES) for s in table)
    assert table[0].name == "timeout"  # the slowest one starts first
    assert any(s.expect.get("requeued") for s in table)
    assert any(len(s.nodes) == 3 for s in table)
    faults = [s for s in table if s.kind == "fault"]
    injected = " ".join(" ".join(s.inject) for s in faults)
    assert "state=lost" in injected and "ecc.volatile_uncorrected" in injected
    assert "nvlink.down" in injected and "ib.mlx5_" in injected
    assert any(": 79," in line for s in faults for line in s.log)
    assert any(": 48," in line for s in faults for line in s.log)


def test_table_errors_are_one_line(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text('[[scenario]]\nname = "x"\ntitle = "t"\nkind = "bogus"\nnodes = ["gpu1"]\n'
                   'payload = ["sleep", "1"]\nexpect = { state = "COMPLETED" }\n')
    with pytest.raises(LabError) as err:
        S.load_table(str(bad))
    assert "kind" in str(err.value) and "\n" not in str(err.value)
    bad.write_text('[[scenario]]\nname = "x"\ntitle = "t"\nkind = "fault"\nnodes = ["gpu1"]\n'
                   'payload = ["train"]\nexpect = { state = "FAILED" }\n')
    with pytest.raises(LabError, match="injects nothing"):
        S.load_table(str(bad))


def test_state_prefix_match():
    assert S.state_matches("CANCELLED by 0", "CANCELLED")
    assert S.state_matches("COMPLETED", "COMPLETED")
    assert not S.state_matches("CANCELLED by 0", "COMPLETED")
    assert not S.state_matches("FAILED", "FAIL")
    assert is_final("CANCELLED by 0") and not is_final("RUNNING") and not is_final("PENDING")


def test_parse_scontrol_oneliner():
    line = ("JobId=5 JobName=lab-x UserId=root(0) JobState=PENDING Reason=BeginTime Dependency=(null) "
            "Requeue=1 Restarts=1 Comment=two words here ExitCode=0:0")
    info = parse_oneliner(line)
    assert info["JobState"] == "PENDING" and info["Restarts"] == "1"
    assert info["Comment"] == "two words here" and info["ExitCode"] == "0:0"


def test_format_results_shows_every_job():
    ok = S.JobResult("completed", "job", "COMPLETED", job_id="7", state="COMPLETED", exit_code="0:0",
                     hooks=["prolog@gpu1"])
    bad = S.JobResult("failed", "job", "FAILED", job_id="8", state="COMPLETED", problems=["wrong"])
    skipped = S.JobResult("out-of-memory", "job", "OUT_OF_MEMORY", produced=False, note="not produced: why")
    text = "\n".join(S.format_results([ok, bad, skipped]))
    assert "completed" in text and "hooks ran: prolog@gpu1" in text
    assert "FAILED" in text and "! wrong" in text
    assert "NOT PRODUCED" in text and "not produced: why" in text
    assert ok.as_dict()["ok"] is True and bad.as_dict()["ok"] is False


# -- the payload on a simulated node ------------------------------------------------------------
def _sim_config(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n[gpu]\nbackend = "sim"\n'
                    '[sim]\nprofile = "h100-healthy"\n')
    return str(path)


def _start_train(config_path, gpus="3"):
    env = dict(os.environ, SLURMD_NODENAME="gpu1", SLURM_JOB_GPUS=gpus)
    proc = subprocess.Popen([sys.executable, "-m", "slurm_hooks.lab.payload", "train", "--seconds", "30",
                             "--config", config_path], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("lab-payload: ready"), line + proc.stderr.read()
    assert "gpus=" + gpus in line
    return proc


@pytest.mark.parametrize("assignment, message", [
    (("gpu.3.state", "lost"), "unspecified launch failure"),
    (("gpu.3.ecc.volatile_uncorrected", 1), "uncorrectable ECC error"),
    (("gpu.3.nvlink.down", [4, 5]), "NVLink [4, 5]"),
    (("ib.mlx5_3:1.state", "1: DOWN"), "NET/IB"),
])
def test_train_payload_dies_like_cuda_when_its_hardware_breaks(tmp_path, assignment, message):
    from healthcheck.config import Config
    from healthcheck.sim.node import SimNode

    config_path = _sim_config(tmp_path)
    proc = _start_train(config_path)
    config = Config.load(config_path)
    SimNode(config.state_dir, "gpu1", config.sim_profile_path("gpu1")).inject([assignment])
    try:
        rc = proc.wait(timeout=20)
    finally:
        proc.kill()
    assert rc == 1
    assert message in proc.stderr.read()


def test_train_payload_ignores_other_gpus(tmp_path):
    from healthcheck.config import Config
    from healthcheck.sim.node import SimNode

    config_path = _sim_config(tmp_path)
    proc = _start_train(config_path, gpus="3")
    config = Config.load(config_path)
    SimNode(config.state_dir, "gpu1", config.sim_profile_path("gpu1")).inject([("gpu.5.state", "lost")])
    time.sleep(2)
    assert proc.poll() is None
    proc.kill()
    proc.wait(timeout=10)


def test_sleep_payload_is_short_after_a_requeue():
    env = dict(os.environ, SLURM_RESTART_COUNT="1")
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "slurm_hooks.lab.payload", "sleep", "60",
                             "--restarted-seconds", "0.2"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and time.monotonic() - began < 20


def test_exit_payload_exits_with_its_code():
    result = subprocess.run([sys.executable, "-m", "slurm_hooks.lab.payload", "exit", "3"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 3


_ROW = ('[[scenario]]\nname = "x"\ntitle = "t"\nkind = "simple"\nnodes = ["gpu1"]\n'
        'payload = ["exit", "3"]\nexpect = {{ state = "FAILED"{extra} }}\n')


def test_expected_class_column_is_optional_and_checked_against_the_class_names():
    assert S.parse_table(_ROW.format(extra=""))[0].expect_class is None
    row = S.parse_table(_ROW.format(extra=', class = "GPU_LOST"'))[0]
    assert row.expect_class == "GPU_LOST"
    with pytest.raises(LabError, match="class"):
        S.parse_table(_ROW.format(extra=', class = "GPU_GONE"'))


def test_report_checks_the_recorded_class_when_the_table_names_one():
    """The job's class over all its entries: a node's hardware class wins over the job-level
    entry (EpilogSlurmctld sees only Slurm's FAILED), as sacctmgr stores them (lower case)."""
    from healthcheck.records.admin_comment import as_stored_by_sacctmgr, encode

    scenario = S.parse_table(_ROW.format(extra=', class = "GPU_LOST", drain = false'))[0]
    comment = as_stored_by_sacctmgr("JS1:abc " + encode({"node": "gpu1", "class": "GPU_LOST"}) + " "
                                    + encode({"node": "*", "class": "FAILED"}))
    good = S.JobResult("x", "job", "FAILED", job_id="9", state="FAILED", admin_comment=comment)
    assert good.recorded_class == "GPU_LOST" and good.as_dict()["class"] == "GPU_LOST"
    assert S.problems_of(scenario, good, "gpu-hooks:") == []
    job_level_only = S.JobResult("x", "job", "FAILED", job_id="9", state="FAILED",
                                 admin_comment=encode({"node": "*", "class": "FAILED"}))
    assert job_level_only.recorded_class == "FAILED"
    assert "recorded class is 'FAILED', expected 'GPU_LOST'" in S.problems_of(scenario, job_level_only, "gpu-hooks:")[0]
    nothing = S.JobResult("x", "job", "FAILED", job_id="9", state="FAILED", admin_comment="JS1:abc")
    assert nothing.recorded_class is None
    assert "recorded class is None" in S.problems_of(scenario, nothing, "gpu-hooks:")[0]
    drained = S.JobResult("x", "job", "FAILED", job_id="9", state="FAILED", admin_comment=comment,
                          drained={"gpu1": "gpu-hooks: v1 xid gpu3 xid:79; lost"})
    assert S.problems_of(scenario, drained, "gpu-hooks:")[0].startswith("drained unexpectedly")
    foreign = S.JobResult("x", "job", "FAILED", job_id="9", state="FAILED", admin_comment=comment,
                          drained={"gpu1": "admin: memory test"})
    assert S.problems_of(scenario, foreign, "gpu-hooks:") == []
    without = S.parse_table(_ROW.format(extra=""))[0]
    assert S.problems_of(without, nothing, "gpu-hooks:") == []


def test_report_checks_state_exit_code_and_requeue():
    scenario = S.parse_table(_ROW.format(extra=', exit_code = "3:0", requeued = true'))[0]
    result = S.JobResult("x", "job", "FAILED", job_id="9", state="COMPLETED", exit_code="0:0",
                         history=["COMPLETED"])
    problems = S.problems_of(scenario, result, "gpu-hooks:")
    assert len(problems) == 3
    assert "State is 'COMPLETED'" in problems[0] and "ExitCode" in problems[1] and "preempted" in problems[2]
    preemptor = S.JobResult("x", "preemptor", "COMPLETED", job_id="10", state="COMPLETED")
    assert S.problems_of(scenario, preemptor, "gpu-hooks:") == []


def test_every_kind_has_a_driver():
    from slurm_hooks.lab.scenarios.drivers import DRIVERS

    assert set(DRIVERS) == set(S.KINDS)


def test_the_table_holds_every_job_shape_and_checks_each_task_and_component():
    table = {s.name: s for s in S.load_table()}
    assert table["array"].kind == "array" and table["array"].array_tasks == (1, 2, 3, 4)
    assert table["array"].expect_class == "COMPLETED"
    assert table["hetjob"].kind == "hetjob" and len(table["hetjob"].components) == 2
    assert table["steps"].srun and table["steps"].steps == 3 and "--nodes=2" in table["steps"].sbatch
    assert "--no-requeue" in table["node-fail"].sbatch and table["node-fail"].expect_class == "NODE_FAIL"
    # every task is checked as the job is: a task whose entry never came is a problem
    task = S.JobResult("array", "task 524_3", "COMPLETED", job_id="524_3", state="COMPLETED", exit_code="0:0",
                       admin_comment="")
    assert "recorded class is None" in S.problems_of(table["array"], task, "gpu-hooks:")[0]


@pytest.mark.parametrize("extra, message", [
    ('kind = "array"\n', "goes with kind"),
    ('kind = "simple"\narray = "1-4"\n', "goes with kind"),
    ('kind = "array"\narray = "1-x"\n', "task range"),
    ('kind = "hetjob"\ncomponents = [["-w", "gpu1"]]\n', "two `components`"),
])
def test_array_and_hetjob_rows_are_checked(tmp_path, extra, message):
    bad = tmp_path / "t.toml"
    bad.write_text('[[scenario]]\nname = "x"\ntitle = "t"\n' + extra + 'nodes = ["gpu1"]\n'
                   'payload = ["sleep", "1"]\nexpect = { state = "COMPLETED" }\n')
    with pytest.raises(LabError, match=message):
        S.load_table(str(bad))


def test_steps_run_one_srun_after_the_other_and_stop_at_a_failing_one(tmp_path):
    from slurm_hooks.lab.paths import LabPaths
    from slurm_hooks.lab.scenarios.session import LabSession

    steps = {s.name: s for s in S.load_table()}["steps"]
    script = LabSession(LabPaths(str(tmp_path)), print, 10).script(steps, steps.payload)
    lines = script.splitlines()
    assert lines[0] == "set -e" and len(lines) == 4 and all(line.startswith("/usr/bin/srun ") for line in lines[1:])
