"""Argument building and output parsing of the CLI backend, against stand-in binaries.

These prove only what is sent and how answers are read; that the hooks work is proven in
the lab against a real Slurm (tests/lab)."""
from __future__ import annotations

import json
import os
import stat

import pytest

from healthcheck.config import Config
from healthcheck.slurm import CliBackend, SlurmError, backend_from_config
from healthcheck.slurm.cli_backend import FIELD_SEPARATOR, parse_scontrol_record

RECORDER = """#!{python}
import json, os, sys
with open({log!r}, "a") as handle:
    handle.write(json.dumps({{"argv": sys.argv, "conf": os.environ.get("SLURM_CONF")}}) + "\\n")
sys.stdout.write(os.environ.get("FAKE_OUT", ""))
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


@pytest.fixture
def fake_bin(tmp_path):
    import sys

    log = tmp_path / "calls.jsonl"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("scontrol", "sacct", "sacctmgr"):
        path = bindir / name
        path.write_text(RECORDER.format(python=sys.executable, log=str(log)))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def calls():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return str(bindir), calls


def test_drain_passes_the_reason_as_one_argument(fake_bin):
    bindir, calls = fake_bin
    CliBackend(bin_dir=bindir, slurm_conf="/lab/slurm.conf").drain("gpu1", "gpu-hooks: GPU 3 lost; x=$(rm -rf /)")
    call = calls()[0]
    assert call["argv"][1:] == ["update", "nodename=gpu1", "state=drain", "reason=gpu-hooks: GPU 3 lost; x=$(rm -rf /)"]
    assert call["conf"] == "/lab/slurm.conf"


def test_admin_comment_goes_through_sacctmgr(fake_bin):
    bindir, calls = fake_bin
    CliBackend(bin_dir=bindir).set_admin_comment("42", "cause=GPU_XID_79")
    assert calls()[0]["argv"][1:] == ["-i", "modify", "job", "where", "jobid=42", "set", "AdminComment=cause=GPU_XID_79"]


def test_node_reason_and_user_are_split(fake_bin, monkeypatch):
    bindir, _ = fake_bin
    monkeypatch.setenv("FAKE_OUT", "NodeName=gpu2 Arch=x86_64 State=IDLE+DRAIN Weight=1 "
                                   "Reason=gpu-hooks: GPU 3 lost [root@2026-11-30T05:20:00]\n")
    node = CliBackend(bin_dir=bindir).node("gpu2")
    assert (node.name, node.reason, node.reason_user, node.drained) == ("gpu2", "gpu-hooks: GPU 3 lost", "root", True)


def test_accounting_splits_on_the_unit_separator(fake_bin, monkeypatch):
    bindir, calls = fake_bin
    monkeypatch.setenv("FAKE_OUT", FIELD_SEPARATOR.join(["7", "CANCELLED by 0", "a|b comment"]) + "\n")
    rows = CliBackend(bin_dir=bindir).accounting(["7"], ["JobID", "State", "AdminComment"])
    assert rows == [{"JobID": "7", "State": "CANCELLED by 0", "AdminComment": "a|b comment"}]
    assert "-j" in calls()[0]["argv"] and "7" in calls()[0]["argv"]


def test_failure_is_one_line_slurm_error(fake_bin, monkeypatch):
    bindir, _ = fake_bin
    monkeypatch.setenv("FAKE_RC", "1")
    with pytest.raises(SlurmError, match="scontrol update"):
        CliBackend(bin_dir=bindir).resume("gpu1")


def test_missing_binary_is_reported_with_where_it_looked(tmp_path):
    with pytest.raises(SlurmError, match="scontrol not found in"):
        CliBackend(bin_dir=str(tmp_path)).node("gpu1")


def test_scontrol_values_with_spaces():
    fields = parse_scontrol_record("JobId=5 JobName=train x JobState=COMPLETING Reason=TimeLimit "
                                   "Dependency=(null) Command=/a b/c.sh WorkDir=/tmp")
    assert fields["JobName"] == "train x" and fields["Command"] == "/a b/c.sh"
    assert fields["Reason"] == "TimeLimit"


def test_backend_from_config_uses_the_slurm_section():
    config = Config.from_document({"slurm": {"bin_dir": "/opt/s/bin", "conf": "/lab/slurm.conf", "timeout_s": 3}}, "c.toml")
    backend = backend_from_config(config)
    assert (backend.bin_dir, backend.env["SLURM_CONF"], backend.timeout_s) == ("/opt/s/bin", "/lab/slurm.conf", 3.0)
