"""``slurm-gpu job``: one job's class per node from accounting entries, records and live Slurm."""
import json

from healthcheck.records import admin_comment as ac
from healthcheck.records import store
from slurm_hooks.jobview import assemble

from .conftest import builtin_settings, run_cli

JS = "js1:h4sabc"


def stored(*entries):
    return ac.as_stored_by_sacctmgr(ac.merge(JS, list(entries)))


def test_three_node_job_with_a_lost_gpu_on_one_node():
    row = {"JobID": "42", "State": "FAILED", "ExitCode": "1:0", "NodeList": "gpu[1-3]",
           "AdminComment": stored({"node": "*", "class": "FAILED", "exit": 1},
                                  {"node": "gpu1", "class": "GPU_LOST", "gpu": 3, "xid": 79})}
    view = assemble("42", row, [], None, ["gpu1", "gpu2", "gpu3"])
    assert view["class"] == "GPU_LOST" and view["sources"] == ["accounting"]
    assert view["nodes"]["gpu1"] == {"class": "GPU_LOST", "evidence": {"gpu": 3, "xid": 79}, "from": "accounting"}
    assert view["nodes"]["gpu2"]["class"] == "FAILED" and view["nodes"]["gpu2"]["from"] == "job-level"
    assert set(view) >= {"job_id", "class", "nodes", "sources"}


def test_records_alone_and_sacct_alone():
    record = {"job_id": "7", "node": "gpu2", "class": "NVLINK", "cause": {"kind": "finding", "check": "nvlink.down",
                                                                          "gpu": 0}, "evidence": []}
    view = assemble("7", None, [record], None, ["gpu2"])
    assert view["class"] == "NVLINK" and view["sources"] == ["records"]
    assert view["nodes"]["gpu2"]["evidence"]["check"] == "nvlink.down"
    view = assemble("8", {"JobID": "8", "State": "CANCELLED by 0", "ExitCode": "0:0", "AdminComment": ""},
                    [], None, ["gpu1"])
    assert view["class"] == "CANCELLED" and view["nodes"]["gpu1"]["class"] == "CANCELLED"


def test_cli_shows_a_job_from_records_and_fails_cleanly_on_bad_input(sim_config, tmp_path):
    state = str(tmp_path / "state")
    store.write_record(state, {"job_id": "9", "node": "gpu1", "class": "GPU_ECC", "evidence": [],
                               "cause": {"kind": "xid", "code": 48, "gpu": 2}})
    with open(sim_config, "a") as handle:
        handle.write('[slurm]\nbin_dir = "/nonexistent-slurm"\n')
    result = run_cli(["job", "9", "--json", "--config", sim_config])
    assert result.exit_code == 0, result.stderr
    view = json.loads(result.stdout)
    assert view["class"] == "GPU_ECC" and view["nodes"]["gpu1"]["evidence"]["xid"] == 48
    text = run_cli(["job", "9", "--config", sim_config])
    assert "job 9: GPU_ECC" in text.stdout and "gpu1" in text.stdout
    missing = run_cli(["job", "10", "--config", sim_config])
    assert missing.exit_code == 1 and missing.stderr.startswith("slurm-gpu: job 10:") and "Traceback" not in missing.stderr
    bad = run_cli(["job", "1;2", "--config", sim_config])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1


# -- every job shape: array tasks, heterogeneous components, requeued runs ---------------------------

ARRAY_ROWS = [  # what `sacct -X -j 524` lists for `sbatch --array=1-3` (the last task keeps the raw id 524)
    {"JobID": "524_1", "JobIDRaw": "525", "State": "COMPLETED", "ExitCode": "0:0", "NodeList": "gpu1",
     "AdminComment": stored({"node": "*", "class": "COMPLETED"})},
    {"JobID": "524_2", "JobIDRaw": "526", "State": "FAILED", "ExitCode": "3:0", "NodeList": "gpu2",
     "AdminComment": stored({"node": "*", "class": "FAILED", "exit": 3})},
    {"JobID": "524_3", "JobIDRaw": "524", "State": "COMPLETED", "ExitCode": "0:0", "NodeList": "gpu3",
     "AdminComment": ""},
    {"JobID": "1234+0", "JobIDRaw": "1234", "State": "COMPLETED", "ExitCode": "0:0", "NodeList": "gpu1",
     "AdminComment": ""},
    {"JobID": "1234+1", "JobIDRaw": "1235", "State": "FAILED", "ExitCode": "1:0", "NodeList": "gpu2",
     "AdminComment": stored({"node": "*", "class": "FAILED", "exit": 1})},
]


def test_the_delivery_finds_an_array_task_or_het_component_by_its_raw_id():
    from .fake_backend import FakeBackend
    from healthcheck.slurm.job_accounting import SlurmAccounting, row_of

    backend = FakeBackend()
    backend.accounting_rows = ARRAY_ROWS
    read = SlurmAccounting(backend).get_admin_comments(["526", "524", "1235", "999"])
    assert ac.parse(read["526"])[0]["class"] == "FAILED"      # the hooks' SLURM_JOB_ID
    assert read["524"] == ""                                   # task 3, not the array
    assert ac.parse(read["1235"])[0]["exit"] == 1
    assert read["999"] is None
    assert row_of(ARRAY_ROWS, "524_2")["JobIDRaw"] == "526" and row_of(ARRAY_ROWS, "1234+1")["JobIDRaw"] == "1235"


def test_a_het_leaders_entry_is_written_to_the_leaders_row_alone():
    """`sacctmgr modify job where jobid=<leader>` changes every component's row (measured on 22.05,
    24.11 and 26.05); `<leader>+0` the leader's only. So does the raw id of the array task that keeps
    the array's id (measured on 22.05 and 24.11); `<array>_<task>` that task's only. Other
    components and array tasks: their raw id."""
    from healthcheck.records import outbox
    from .fake_backend import FakeBackend
    from healthcheck.slurm.job_accounting import SlurmAccounting

    backend = FakeBackend()
    backend.accounting_rows = [dict(row) for row in ARRAY_ROWS]
    accounting = SlurmAccounting(backend)
    settings = builtin_settings(outbox.DeliverySettings, verify_delay_s=0, jitter_s=0, attempts=1)
    for job in ("1234", "1235", "526", "524"):
        outbox.write_entries(accounting, job, [{"node": "*", "class": "NODE_FAIL"}], settings, sleep=lambda s: None)
    written = [call[1] for call in backend.calls if call[0] == "set_admin_comment"]
    assert written == ["1234+0", "1235", "526", "524_3"]


def test_slurm_gpu_job_shows_an_array_task_by_its_shown_id_and_by_its_raw_id(tmp_path):
    from .fake_backend import FakeBackend
    from slurm_hooks.jobview import gather

    class Config:
        state_dir = str(tmp_path)
    store.write_record(Config.state_dir, {"job_id": "526", "node": "gpu2", "class": "GPU_LOST", "evidence": [],
                                          "cause": {"kind": "xid", "code": 79, "gpu": 1}})
    backend = FakeBackend()
    backend.accounting_rows = ARRAY_ROWS
    for asked in ("524_2", "526"):
        view = gather(Config, asked, backend)
        assert (view["job_id"], view["shown_job_id"], view["raw_job_id"]) == (asked, "524_2", "526")
        assert view["class"] == "GPU_LOST" and view["nodes"]["gpu2"]["evidence"]["xid"] == 79
        assert view["state"] == "FAILED" and view["sources"] == ["accounting", "records"]
    view = gather(Config, "1234+1", backend)
    assert view["raw_job_id"] == "1235" and view["class"] == "FAILED"


def test_a_requeued_job_is_shown_by_its_last_run_with_the_earlier_ones_kept():
    row = {"JobID": "77", "State": "COMPLETED", "ExitCode": "0:0", "NodeList": "gpu2",
           "AdminComment": stored({"node": "*", "class": "PREEMPTED"}, {"node": "*", "class": "COMPLETED", "run": 1})}
    view = assemble("77", row, [], None, ["gpu2"])
    assert view["class"] == "COMPLETED" and view["nodes"]["gpu2"]["class"] == "COMPLETED"
    assert [e["class"] for e in view["earlier_runs"]] == ["PREEMPTED"]


def test_cli_accepts_the_ids_sacct_shows_and_refuses_others(sim_config):
    with open(sim_config, "a") as handle:
        handle.write('[slurm]\nbin_dir = "/nonexistent-slurm"\n')
    for shown in ("524_7", "1234+1"):
        result = run_cli(["job", shown, "--config", sim_config])
        assert result.exit_code == 1 and "Traceback" not in result.stderr      # unknown here, but an id
    for bad in ("524_", "1234+1+2", "+1", "524_7;x"):
        result = run_cli(["job", bad, "--config", sim_config])
        assert result.exit_code == 2 and "is not a Slurm job id" in result.stderr


def test_a_delivery_round_reads_every_queued_job_with_one_sacct(tmp_path):
    from healthcheck.records import outbox
    from .fake_backend import AccountedBackend
    from healthcheck.slurm.job_accounting import SlurmAccounting

    backend = AccountedBackend()
    backend.accounting_rows = [{"JobID": f"600_{t}", "JobIDRaw": str(600 + t), "AdminComment": ""} for t in range(1, 11)]
    for t in range(1, 11):
        record = {"job_id": str(600 + t), "node": "*", "class": "COMPLETED"}
        store.write_record(str(tmp_path), record)
        outbox.queue_record(str(tmp_path), record)
    settings = builtin_settings(outbox.DeliverySettings, verify_delay_s=0, jitter_s=0)
    report = outbox.deliver_pending(str(tmp_path), SlurmAccounting(backend), settings, sleep=lambda s: None)
    assert sorted(report.delivered) == [str(600 + t) for t in range(1, 11)]
    reads = [call for call in backend.calls if call[0] == "accounting"]
    assert len(reads) == 2, reads                     # one read, then one read-back, for all ten
    assert len([call for call in backend.calls if call[0] == "set_admin_comment"]) == 10


def test_a_node_list_that_names_no_node_falls_back_to_the_other_view(tmp_path):
    """sacct's "None assigned" (a job still pending when the database took it) and scontrol's
    "(null)" name no node: the other view's list is used, and the job is shown on its nodes."""
    from healthcheck.slurm.backend import JobInfo, assigned_nodes
    from slurm_hooks.jobview import gather
    from .fake_backend import FakeBackend

    assert [assigned_nodes(v) for v in ("(null)", "None assigned", "", None, "gpu[1-2]")] == ["", "", "", "", "gpu[1-2]"]

    class Config:
        state_dir = str(tmp_path)

        @staticmethod
        def section(name):
            return {"accounting": False}
    backend = FakeBackend(jobs=[JobInfo("88", {"JobId": "88", "JobState": "NODE_FAIL", "NodeList": "gpu3"})])
    backend.accounting_rows = [{"JobID": "88", "JobIDRaw": "88", "State": "NODE_FAIL", "ExitCode": "0:0",
                                "NodeList": "None assigned", "AdminComment": ""}]
    view = gather(Config, "88", backend)
    assert list(view["nodes"]) == ["gpu3"] and view["class"] == "NODE_FAIL"
