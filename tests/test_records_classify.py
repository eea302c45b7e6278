"""The job classification as a pure function: Slurm's view at epilog time (slurm-lab-facts.md
section 5, measured on 22.05.8) plus evidence -> class, with the documented precedence."""
import pytest

from healthcheck.records.classes import CLASSES, HARDWARE_CLASSES
from healthcheck.records.classify import (SlurmView, classify, evidence_class, job_class, reclassify, rules,
                                          slurm_ending)

# What the Epilog saw for each measured ending: scontrol fields + exit variables.
EPILOG_VIEWS = {
    "exit 0": ({"JobState": "COMPLETING", "Reason": "None", "ExitCode": "0:0", "PreemptTime": "None",
                "Restarts": "0", "EndTime": "2026-11-30T05:00:00"}, {"SLURM_JOB_EXIT_CODE2": "0:0"}),
    "exit 3": ({"JobState": "COMPLETING", "Reason": "NonZeroExitCode", "ExitCode": "3:0", "PreemptTime": "None"},
               {"SLURM_JOB_EXIT_CODE2": "3:0", "SLURM_JOB_EXIT_CODE": "768"}),
    "kill -9 self": ({"JobState": "COMPLETING", "Reason": "JobLaunchFailure", "ExitCode": "0:9"},
                     {"SLURM_JOB_EXIT_CODE2": "0:9"}),
    "srun step exit 5": ({"JobState": "COMPLETING", "Reason": "None", "ExitCode": "0:0"},
                         {"SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_JOB_DERIVED_EC": "1280"}),
    "scancel": ({"JobState": "COMPLETING", "Reason": "None", "ExitCode": "0:15", "PreemptTime": "None"},
                {"SLURM_JOB_EXIT_CODE2": "0:0"}),
    "timeout": ({"JobState": "COMPLETING", "Reason": "TimeLimit", "ExitCode": "0:15"},
                {"SLURM_JOB_EXIT_CODE2": "0:0"}),
    "preempted": ({"JobState": "COMPLETING", "Reason": "None", "ExitCode": "0:15",
                   "PreemptTime": "2026-11-30T05:01:02"}, {"SLURM_JOB_EXIT_CODE2": "0:0"}),
    "preempted+requeued": ({"JobState": "COMPLETING", "Reason": "None", "ExitCode": "0:15", "Requeue": "1",
                            "Restarts": "1", "EndTime": "Unknown"},
                           {"SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_JOB_RESTART_COUNT": "1"}),
    "node down": ({"JobState": "NODE_FAIL", "Reason": "NodeDown", "ExitCode": "0:15"},
                  {"SLURM_JOB_EXIT_CODE2": "0:0"}),
    "slurmd killed (ctld)": ({"JobState": "COMPLETING", "Reason": "NodeDown", "ExitCode": "0:0"},
                             {"SLURM_JOB_EXIT_CODE2": "0:0"}),
    "oom": ({"JobState": "OUT_OF_MEMORY", "Reason": "OutOfMemory", "ExitCode": "0:125"},
            {"SLURM_JOB_EXIT_CODE2": "0:125"}),
    "restarted job completes": ({"JobState": "COMPLETING", "Reason": "None", "ExitCode": "0:0", "Restarts": "1",
                                 "EndTime": "2026-11-30T05:09:00"}, {"SLURM_JOB_EXIT_CODE2": "0:0"}),
}

EXPECTED = {"exit 0": ("COMPLETED", None, None), "exit 3": ("FAILED", 3, None), "kill -9 self": ("FAILED", None, 9),
            "srun step exit 5": ("COMPLETED", None, None), "scancel": ("CANCELLED", None, 15),
            "timeout": ("TIMEOUT", None, None), "preempted": ("PREEMPTED", None, None),
            "preempted+requeued": ("REQUEUED", None, None), "node down": ("NODE_FAIL", None, None),
            "slurmd killed (ctld)": ("NODE_FAIL", None, None), "oom": ("OUT_OF_MEMORY", None, None),
            "restarted job completes": ("COMPLETED", None, None)}


@pytest.mark.parametrize("name", sorted(EPILOG_VIEWS))
def test_each_measured_ending_gets_its_class(name):
    fields, env = EPILOG_VIEWS[name]
    ending = slurm_ending(SlurmView.from_scontrol(fields, env))
    cls, code, signal = EXPECTED[name]
    assert ending.cls == cls
    if code is not None:
        assert ending.exit == code
    if signal is not None:
        assert ending.signal == signal


@pytest.mark.parametrize("state,exit_code,cls", [
    ("COMPLETED", "0:0", "COMPLETED"), ("FAILED", "3:0", "FAILED"), ("CANCELLED by 0", "0:0", "CANCELLED"),
    ("TIMEOUT", "0:0", "TIMEOUT"), ("PREEMPTED", "0:0", "PREEMPTED"), ("NODE_FAIL", "0:0", "NODE_FAIL"),
    ("OUT_OF_MEMORY", "0:125", "OUT_OF_MEMORY"), ("REQUEUED", "0:0", "REQUEUED"), ("DEADLINE", "0:0", "TIMEOUT")])
def test_sacct_final_states(state, exit_code, cls):
    assert slurm_ending(SlurmView.from_sacct({"State": state, "ExitCode": exit_code})).cls == cls


def test_sacct_failed_keeps_exit_code():
    ending = slurm_ending(SlurmView.from_sacct({"State": "FAILED", "ExitCode": "3:0"}))
    assert (ending.cls, ending.exit, ending.signal) == ("FAILED", 3, None)


XID79 = {"kind": "xid", "code": 79, "gpu": 3, "action": "reboot"}
FALLEN = {"kind": "xid", "code": 79, "event": "fallen_off_bus", "gpu": 1, "action": "reboot"}
XID13 = {"kind": "xid", "code": 13, "gpu": 3, "action": "job"}
XID43 = {"kind": "xid", "code": 43, "gpu": 3, "action": "ignore"}
XID31 = {"kind": "xid", "code": 31, "gpu": 0, "action": "job"}
XID48 = {"kind": "xid", "code": 48, "gpu": 2, "action": "reset_gpu"}
XID74 = {"kind": "xid", "code": 74, "gpu": 0, "action": "reset_gpu"}
XID_OTHER = {"kind": "xid", "code": 62, "gpu": 5, "action": "reset_gpu"}
IB_DOWN = {"kind": "finding", "check": "ib.port", "status": "fail", "action": "drain", "port": "mlx5_3:1"}
NVLINK_DOWN = {"kind": "finding", "check": "nvlink.down", "status": "fail", "action": "drain", "gpu": 0}
TEMP_WARN = {"kind": "finding", "check": "gpu.temperature", "status": "warn", "action": "warn", "gpu": 0}
DBE_GROWTH = {"kind": "counter", "name": "ecc.volatile_uncorrected", "gpu": 2, "delta": 1}
REPLAY_GROWTH = {"kind": "counter", "name": "nvlink.replay", "gpu": 2, "delta": 40}


def view(name):
    fields, env = EPILOG_VIEWS[name]
    return SlurmView.from_scontrol(fields, env)


def test_failed_job_whose_gpu_fell_off_the_bus_is_gpu_lost_not_an_application_failure():
    result = classify(view("exit 3"), [XID13, XID79])
    assert result.cls == "GPU_LOST" and result.slurm.cls == "FAILED"
    assert result.entry_keys() == {"class": "GPU_LOST", "gpu": 3, "xid": 79, "exit": 3}


def test_application_level_xids_are_evidence_not_a_cause():
    for xid in (XID13, XID31, XID43):
        assert evidence_class(xid) is None
    result = classify(view("exit 3"), [XID13, XID31, XID43])
    assert result.cls == "FAILED" and result.cause is None and len(result.evidence) == 3


@pytest.mark.parametrize("evidence,cls", [
    ([XID48], "GPU_ECC"), ([DBE_GROWTH], "GPU_ECC"), ([XID74], "NVLINK"), ([NVLINK_DOWN], "NVLINK"),
    ([IB_DOWN], "INFINIBAND"), ([XID_OTHER], "GPU_XID"), ([FALLEN], "GPU_LOST"),
    ([{"kind": "xid", "code": 12028, "event": "sxid", "action": "reset_gpu"}], "NVLINK"),
    ([{"kind": "finding", "check": "gpu.lost", "status": "fail", "action": "drain", "gpu": 4}], "GPU_LOST")])
def test_each_hardware_cause(evidence, cls):
    assert classify(view("exit 3"), evidence).cls == cls


def test_precedence_among_hardware_causes_follows_the_data():
    everything = [XID_OTHER, IB_DOWN, NVLINK_DOWN, XID48, XID79]
    order = rules()["hardware_precedence"]
    assert order[0] == "GPU_LOST" and order[-1] == "GPU_XID"
    seen = []
    while everything:
        seen.append(classify(view("exit 3"), everything).cls)
        everything = everything[:-1]
    assert seen == ["GPU_LOST", "GPU_ECC", "NVLINK", "INFINIBAND", "GPU_XID"]


def test_warnings_and_ordinary_counter_growth_are_not_causes():
    result = classify(view("exit 0"), [TEMP_WARN, REPLAY_GROWTH])
    assert result.cls == "COMPLETED" and result.cause is None


@pytest.mark.parametrize("name", ["scancel", "timeout", "node down", "preempted+requeued", "kill -9 self"])
def test_hardware_replaces_endings_it_can_explain(name):
    assert classify(view(name), [XID79]).cls == "GPU_LOST"


@pytest.mark.parametrize("name,cls", [("exit 0", "COMPLETED"), ("preempted", "PREEMPTED")])
def test_completed_and_preempted_keep_their_class_and_the_evidence(name, cls):
    result = classify(view(name), [XID79])
    assert result.cls == cls and result.evidence == [XID79]


def test_reclassify_for_late_evidence():
    assert reclassify("FAILED", [XID79]) == ("GPU_LOST", XID79)
    assert reclassify("COMPLETED", [XID79]) == ("COMPLETED", None)
    assert reclassify("FAILED", [XID13]) == ("FAILED", None)


def test_job_class_over_entries():
    assert job_class([{"node": "*", "class": "FAILED"}, {"node": "gpu1", "class": "GPU_LOST", "gpu": 3}]) == "GPU_LOST"
    assert job_class([{"node": "*", "class": "COMPLETED"}]) == "COMPLETED"
    # sacctmgr lowercases what it stores: classes are read case-insensitively
    assert job_class([{"node": "*", "class": "failed"}, {"node": "gpu2", "class": "nvlink"}]) == "NVLINK"
    assert job_class([{"node": "gpu1", "class": "COMPLETED"}, {"node": "gpu2", "class": "NODE_FAIL"}]) == "NODE_FAIL"
    assert job_class([]) == "UNKNOWN"


def test_rules_name_only_known_classes():
    table = rules()
    named = set(table["hardware_precedence"]) | set(table["xid_classes"].values()) | \
        set(table["check_classes"].values()) | set(table["counter_classes"].values()) | set(table["kind_classes"].values())
    assert named <= set(HARDWARE_CLASSES)
    assert set(table["slurm_severity"]) <= set(CLASSES)


# -- GPU_OOM: an application cause (issue 16) ------------------------------------------------------

GPU_OOM = {"kind": "gpu_oom", "source": "job_output", "stream": "stderr", "signature": "pytorch",
           "line": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB."}


def test_a_failed_job_with_a_gpu_oom_message_is_gpu_oom():
    result = classify(view("exit 3"), [XID13, GPU_OOM])
    assert result.cls == "GPU_OOM" and result.slurm.cls == "FAILED" and result.cause == GPU_OOM
    assert result.entry_keys() == {"class": "GPU_OOM", "oom": "pytorch", "exit": 3}


def test_host_oom_stays_out_of_memory_even_with_a_gpu_oom_message():
    assert classify(view("oom"), [GPU_OOM]).cls == "OUT_OF_MEMORY"


@pytest.mark.parametrize("hardware,cls", [(XID79, "GPU_LOST"), (XID48, "GPU_ECC"), (IB_DOWN, "INFINIBAND"),
                                          (XID_OTHER, "GPU_XID")])
def test_every_hardware_cause_is_stronger_than_gpu_oom(hardware, cls):
    assert classify(view("exit 3"), [GPU_OOM, hardware]).cls == cls
    assert classify(view("exit 3"), [hardware, GPU_OOM]).cls == cls


@pytest.mark.parametrize("name,cls", [("exit 0", "COMPLETED"), ("scancel", "CANCELLED"), ("timeout", "TIMEOUT"),
                                      ("preempted", "PREEMPTED"), ("node down", "NODE_FAIL")])
def test_gpu_oom_replaces_only_a_plain_failed(name, cls):
    result = classify(view(name), [GPU_OOM])
    assert result.cls == cls and result.cause is None and result.evidence == [GPU_OOM]


def test_the_precedence_of_gpu_oom_is_data():
    table = rules()
    assert table["application_precedence"] == ["GPU_OOM"] and table["application_overrides"] == ["FAILED"]
    assert table["evidence_classes"] == {"gpu_oom": "GPU_OOM"}
    assert "GPU_OOM" in CLASSES and "GPU_OOM" not in HARDWARE_CLASSES


def test_application_could_replace_only_what_the_table_says():
    from healthcheck.records.classify import application_could_replace

    assert application_could_replace("FAILED")
    assert not any(application_could_replace(c) for c in ("OUT_OF_MEMORY", "COMPLETED", "GPU_LOST", "CANCELLED"))


def test_reclassify_keeps_gpu_oom_below_late_hardware_evidence():
    assert reclassify("FAILED", [GPU_OOM]) == ("GPU_OOM", GPU_OOM)
    assert reclassify("FAILED", [GPU_OOM, XID79]) == ("GPU_LOST", XID79)
    assert reclassify("OUT_OF_MEMORY", [GPU_OOM]) == ("OUT_OF_MEMORY", None)


def test_job_class_with_a_gpu_oom_node_entry():
    # EpilogSlurmctld reads no output: its job-level FAILED gives way to a node's GPU_OOM ...
    assert job_class([{"node": "*", "class": "FAILED"}, {"node": "gpu1", "class": "GPU_OOM"}]) == "GPU_OOM"
    assert job_class([{"node": "*", "class": "failed"}, {"node": "gpu1", "class": "gpu_oom"}]) == "GPU_OOM"
    assert job_class([{"node": "gpu1", "class": "GPU_OOM"}, {"node": "gpu2", "class": "FAILED"}]) == "GPU_OOM"
    # ... but not host OOM, and every hardware class beats it
    assert job_class([{"node": "*", "class": "OUT_OF_MEMORY"}, {"node": "gpu1", "class": "GPU_OOM"}]) == "OUT_OF_MEMORY"
    assert job_class([{"node": "gpu1", "class": "GPU_OOM"}, {"node": "gpu2", "class": "GPU_LOST"}]) == "GPU_LOST"
