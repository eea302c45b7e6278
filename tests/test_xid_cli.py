"""``slurm-gpu xid scan | explain``: the JSON contract, terminal-safe text, one-line errors."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time

import pytest

from healthcheck.kernellog.api import read_new_events
from healthcheck.sim.node import SimNode

from .conftest import ROOT


def run_cli(args, env=None):
    """``slurm-gpu ARGS`` in-process with stdout and stderr apart (click 8.1, the last release for
    Python 3.9, mixes them unless told not to; 8.2 always separates them and has no such option)."""
    from click.testing import CliRunner

    from slurm_hooks.cli import main

    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    merged = dict(os.environ)
    merged.pop("SLURM_GPU_HOOKS_CONFIG", None)
    merged.update(env or {})
    return runner.invoke(main, list(args), env=merged, catch_exceptions=False)

CONTRACT = {"kind", "code", "pci", "gpu_instance", "pid", "process", "message", "action", "mnemonic"}
LOG = (
    "Feb 23 16:24:18 gpu001 kernel: [ 8812.332101] NVRM: GPU at PCI:0000:5d:00: GPU-2f7c1e4a-0003-4c1d-9e2b-8a6f3d0c0003\n"
    "Feb 23 16:24:18 gpu001 kernel: [ 8812.332117] NVRM: Xid (PCI:0000:5d:00): 79, pid=4242, name=python, GPU has fallen off the bus.\n"
    "Feb 23 16:24:18 gpu001 kernel: [ 8812.332120] NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.\n"
    "Feb 23 16:30:00 gpu001 kernel: NVRM: Xid (PCI:0000:18:00 GPU-I:01 GPU-CI:02): 13, pid=77, name=train, Graphics Exception\n"
    "Feb 23 16:30:01 gpu001 kernel: nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up\n"
    "Feb 23 16:31:00 gpu001 systemd[1]: Started Session 7 of user alice.\n"
)


@pytest.fixture
def log_file(tmp_path):
    path = tmp_path / "kern.log"
    path.write_text(LOG)
    os.utime(path, (time.mktime((2025, 6, 1, 0, 0, 0, 0, 0, -1)),) * 2)    # syslog years are 2025's
    return str(path)


def test_scan_json_is_one_object_per_event_with_the_contract_keys(log_file, isolated_env):
    done = run_cli(["xid", "scan", log_file, "--json"])
    assert done.exit_code == 0, done.output
    objects = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(obj["kind"], obj["code"]) for obj in objects] == [("xid", 79), ("fallen_off_bus", 79), ("xid", 13),
                                                              ("sxid", 20034)]
    for obj in objects:
        assert CONTRACT <= set(obj)
        assert isinstance(obj["code"], int) and obj["pci"] == obj["pci"].lower() and len(obj["pci"]) == 10
        assert obj["action"] in ("ignore", "job", "reset_gpu", "reboot", "contact_support")
    xid79, fallen, xid13, sxid = objects
    assert (xid79["pid"], xid79["process"], xid79["gpu_instance"], xid79["action"], xid79["mnemonic"]) == (
        4242, "python", None, "reboot", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
    assert xid79["message"] == "GPU has fallen off the bus." and xid79["uuid"] == "GPU-2f7c1e4a-0003-4c1d-9e2b-8a6f3d0c0003"
    assert (fallen["code"], fallen["pci"], fallen["pid"]) == (79, "0000:5d:00", None)
    assert (xid13["gpu_instance"], xid13["compute_instance"], xid13["action"]) == (1, 2, "job")
    assert (sxid["pci"], sxid["mnemonic"], sxid["action"], sxid["severity"]) == ("0000:c2:00", None, "reboot", "Fatal")


def test_scan_text_is_one_line_per_event(log_file, isolated_env):
    done = run_cli(["xid", "scan", log_file])
    assert done.exit_code == 0
    lines = done.stdout.splitlines()
    assert len(lines) == 4
    assert " xid 79 0000:5d:00 " in lines[0] and "action=reboot" in lines[0] and "pid=4242" in lines[0]


def test_scan_since_keeps_the_later_events(log_file, isolated_env):
    done = run_cli(["xid", "scan", log_file, "--json", "--since", "2025-02-23T16:29:00"])
    assert [json.loads(line)["code"] for line in done.stdout.splitlines()] == [13, 20034]


def test_scan_reads_gzip_and_stdin(tmp_path, isolated_env):
    rotated = tmp_path / "kern.log.2.gz"
    rotated.write_bytes(gzip.compress(LOG.encode()))
    done = run_cli(["xid", "scan", str(rotated), "--json"])
    assert done.exit_code == 0 and len(done.stdout.splitlines()) == 4
    piped = subprocess.run([sys.executable, "-c", "from slurm_hooks.cli import main; main()", "xid", "scan", "-"],
                           input=LOG.encode(), capture_output=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=ROOT, SLURM_GPU_HOOKS_CONFIG=""))
    assert piped.returncode == 0, piped.stderr
    assert len(piped.stdout.decode().splitlines()) == 4


def test_damaged_gzip_reports_what_it_read_and_fails(tmp_path, isolated_env):
    rotated = tmp_path / "kern.log.1.gz"
    rotated.write_bytes(gzip.compress((LOG * 200).encode())[:-40])
    done = run_cli(["xid", "scan", str(rotated)])
    assert done.exit_code != 0 and "damaged gzip" in done.stderr and "Traceback" not in done.stderr


def test_log_text_is_made_terminal_safe(tmp_path, isolated_env):
    evil = tmp_path / "evil.log"
    evil.write_bytes(b"NVRM: Xid (PCI:0000:18:00): 31, pid=1, name=\x1b]0;owned\x07, MMU Fault \x1b[2J\xe2\x80\xae gone\r\n")
    text = run_cli(["xid", "scan", str(evil)]).stdout
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text and "\r" not in text
    assert "\\x1b]0;owned\\x07" in text and "\\u202e" in text
    as_json = run_cli(["xid", "scan", str(evil), "--json"]).stdout
    assert "\x1b" not in as_json and json.loads(as_json)["process"] == "\x1b]0;owned\x07"


@pytest.mark.parametrize("args,fragment", [
    (["xid", "scan", "/nonexistent/kern.log"], "cannot read /nonexistent/kern.log"),
    (["xid", "scan", "/"], "not a regular file"),
    (["xid", "scan", "--since", "yesterday-ish", "/dev/null"], "--since 'yesterday-ish': not a time"),
    (["xid", "explain", "seventy-nine"], "is not an Xid code"),
])
def test_bad_input_is_one_line_on_stderr_and_a_non_zero_exit(args, fragment, isolated_env):
    done = run_cli(args)
    assert done.exit_code != 0
    assert fragment in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("code,expected", [
    ("79", ["ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "reboot"]),
    ("48", ["ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", "reset_gpu"]),
    ("31", ["RESTART_APP", "job"]),
    ("43", ["IGNORE", "ignore"]),
    ("999", ["not in NVIDIA's Xid catalog", "contact_support"]),
    ("154", ["recovery action", "2: reboot"]),
    ("145", ["decode table", "RLW_REMAP"]),
    ("13", ["escalation:", "5 occurrences"]),
    ("sxid:20034", ["SXid 20034", "Fatal", "reboot"]),
])
def test_explain_prints_the_catalog_entry_and_our_action(code, expected, isolated_env):
    done = run_cli(["xid", "explain", code])
    assert done.exit_code == 0, done.output
    for fragment in expected:
        assert fragment in done.stdout, (fragment, done.stdout)


def test_explain_shows_a_config_override(tmp_path, isolated_env):
    config = tmp_path / "config.toml"
    config.write_text('[xid.actions]\n"31" = "reset_gpu"\n')
    done = run_cli(["xid", "explain", "31", "--config", str(config)])
    assert "config override:      reset_gpu" in done.stdout


def test_scan_without_path_reads_the_nodes_log_and_leaves_the_cursor(tmp_path, sim_config, isolated_env):
    done = run_cli(["xid", "scan", "--config", sim_config, "--node", "gpu2", "--json"])
    assert done.exit_code == 0, done.output
    assert [json.loads(line)["code"] for line in done.stdout.splitlines()] == [79]
    # The health check still sees the event: scan neither used nor moved its cursor.
    node = SimNode(str(tmp_path / "state"), "gpu2")
    result = read_new_events(node.kernel_log_path, str(tmp_path / "state"), "gpu2")
    assert [event.code for event in result.events] == [79]
