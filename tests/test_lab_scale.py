"""bench/scale's readings (slurm_hooks/lab/scale.py), on a real sdiag capture and this process's /proc."""
from __future__ import annotations

import os

from slurm_hooks.lab import scale

HERE = os.path.dirname(os.path.abspath(__file__))


def test_sdiag_tables_by_type_and_by_user_from_a_real_capture():
    with open(os.path.join(HERE, "data", "sdiag", "sdiag-24.11.txt"), encoding="utf-8") as handle:
        tables = scale.parse_sdiag(handle.read())
    assert tables["by_type"] == {"REQUEST_COMPLETE_PROLOG": 200, "REQUEST_COMPLETE_BATCH_SCRIPT": 200,
                                 "REQUEST_STATS_INFO": 2, "MESSAGE_EPILOG_COMPLETE": 2,
                                 "REQUEST_SUBMIT_BATCH_JOB": 1, "MESSAGE_NODE_REGISTRATION_STATUS": 1}
    assert tables["by_user"] == {"root": 406}
    # the scheduler's statistics above the tables (counts, cycles) are not RPCs
    assert "Jobs submitted" not in tables["by_type"] and scale.hook_rpcs(tables["by_type"]) == 0


def test_hook_rpcs_counts_only_what_a_hook_can_send():
    by_type = {"REQUEST_JOB_INFO_SINGLE": 200, "REQUEST_FED_INFO": 3, "REQUEST_COMPLETE_PROLOG": 200,
               "REQUEST_UPDATE_NODE": 2}
    assert scale.hook_rpcs(by_type) == 205
    assert scale.minus({"a": 5, "b": 1}, {"a": 2, "c": 4}) == {"a": 3, "b": 1, "c": -4}


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (scale.percentile(values, 0.5), scale.percentile(values, 0.99)) == (50.0, 99.0)
    assert scale.percentile([], 0.5) is None and scale.percentile([3.0], 0.99) == 3.0


def test_proc_readings_of_a_live_process():
    pid = os.getpid()
    cpu, status = scale.cpu_seconds(pid), scale.status(pid)
    assert cpu["self"] > 0 and cpu["children"] >= 0
    assert status["VmHWM"] >= status["VmRSS"] > 0 and status["switches"] > 0 and status["fds"] >= 3
    before = {"x": {"self": 1.0, "children": 2.0}}
    after = {"x": {"self": 1.5, "children": 2.25}}
    assert scale.cpu_between(before, after, ["x"]) == 0.5 and scale.cpu_between(before, after, ["x"], "children") == 0.25
    assert scale.cpu_seconds(2 ** 22 + 7) == {}         # gone: nothing, no exception


def test_slurmdbd_tables_read_alike_and_writes_are_job_modifications():
    with open(os.path.join(HERE, "data", "sdiag", "sacctmgr-show-stats-24.11.txt"), encoding="utf-8") as handle:
        tables = scale.parse_sdiag(handle.read())
    assert tables["by_type"]["DBD_JOB_START"] >= 200 and tables["by_type"]["DBD_GET_JOBS_COND"] >= 1
    assert "Internal DBD rollup last ran" not in str(tables) and set(tables["by_user"]) == {"root"}
    assert scale.dbd_writes({"DBD_MODIFY_JOB": 7, "DBD_JOB_START": 9}) == 7
    assert scale.dbd_writes(tables["by_type"]) == 0          # no record delivered in that window


def test_a_host_with_the_old_pid_max_is_refused_above_64_nodes():
    # 256 nodes on pid_max 32,768: slurmctld, then slurmdbd, died at pthread_create here.
    problem = scale.pid_room_problem(32768, 256)
    assert problem and "kernel.pid_max is 32768" in problem and "sysctl -w kernel.pid_max=4194304" in problem
    assert "\n" not in problem
    assert scale.pid_room_problem(32768, 64) is None            # 64 nodes ran with it
    assert scale.pid_room_problem(4194304, 256) is None


def test_docs_scale_names_every_key_bench_scale_writes():
    import re

    root = os.path.dirname(HERE)
    with open(os.path.join(root, "bench", "scale"), encoding="utf-8") as handle:
        source = handle.read()
    keys = set(re.findall(r'out\["([a-z0-9_]+)"\]', source))
    keys |= {f"burst_{k}" for k in re.findall(r'"(squeue_p50_s|squeue_p99_s|sinfo_p50_s|sinfo_p99_s)"', source)}
    assert {"burst_hook_rpcs_per_job", "burst_record_lag_s", "watcher_wakeups_per_s", "storm"} <= keys
    with open(os.path.join(root, "docs", "scale.md"), encoding="utf-8") as handle:
        doc = handle.read()
    assert [key for key in sorted(keys) if f"`{key}`" not in doc] == []
