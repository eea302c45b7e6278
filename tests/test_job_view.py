"""``slurm-gpu job``: one job's class per node from accounting entries, records and live Slurm."""
import json

from healthcheck.records import admin_comment as ac
from healthcheck.records import store
from slurm_hooks.jobview import assemble

from .conftest import run_cli

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
