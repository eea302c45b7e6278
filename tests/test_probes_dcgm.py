"""``dcgmi diag -j``: both JSON layouts, a fake dcgmi on disk, and its deadline."""
from __future__ import annotations

import json
import os
import time

import pytest

from healthcheck.checks.dcgm import dcgm_diag
from healthcheck.probes.dcgm_diag import parse_diag, probe_dcgm

from .checks_support import default_input

# DCGM 4.x: results per entity, warnings as objects, versions under "metadata".
DIAG_4X = {
    "DCGM Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": [
            {"name": "software", "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0,
                                               "status": "Pass"}], "test_summary": {"status": "Pass"}}]},
        {"category": "Hardware", "tests": [
            {"name": "memory", "results": [
                {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
                {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Fail",
                 "warnings": [{"warning": "GPU 1 had uncorrectable memory errors", "error_id": 95,
                               "error_category": 2, "error_severity": 2}]}],
             "test_summary": {"status": "Fail"}}]}]},
    "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1,
                       "entities": [{"entity_id": 0, "device_id": "2330"}, {"entity_id": 1, "device_id": "2330"}]}],
    "metadata": {"version": "4.2.3", "Driver Version Detected": "550.90.07"},
}

# DCGM 3.x: "DCGM GPU Diagnostic", gpu_ids as strings, null for tests not run, a warning
# line printed before the JSON, and warnings as plain strings.
DIAG_3X = 'WARNING: something on stdout first\n' + json.dumps({
    "DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": [
            {"name": "Denylist", "results": [{"gpu_ids": "0,1,2,3", "status": "PASS"}]}, None,
            {"name": "Environmental Variables", "results": [{"gpu_ids": "0,1,2,3", "status": "WARN",
                                                              "warnings": ["CUDA_VISIBLE_DEVICES is set"]}]}]},
        {"category": "Integration", "tests": [
            {"name": "PCIe", "results": [{"gpu_id": "2", "status": "FAIL", "warnings": ["bandwidth low"]},
                                         {"gpu_id": "3", "status": "SKIP"}]}]}],
        "version": "3.3.5"}})


def test_parses_the_4x_layout():
    version, results, runtime_error = parse_diag(json.dumps(DIAG_4X))
    assert version == "4.2.3" and runtime_error is None
    failed = [r for r in results if r.status == "fail"]
    assert [(r.category, r.test, r.gpus) for r in failed] == [("Hardware", "memory", [1])]
    assert failed[0].warnings == ["GPU 1 had uncorrectable memory errors (error id 95)"]


def test_parses_the_3x_layout_and_counts_a_warning_as_a_failure():
    version, results, _ = parse_diag(DIAG_3X)
    assert version == "3.3.5"
    assert [(r.test, r.status, r.gpus) for r in results] == [
        ("Denylist", "pass", [0, 1, 2, 3]), ("Environmental Variables", "fail", [0, 1, 2, 3]),
        ("PCIe", "fail", [2]), ("PCIe", "skip", [3])]


@pytest.mark.parametrize("text", ["", "Error: unable to connect to host engine", "[1, 2]", '{"x": 1}',
                                  '{"DCGM Diagnostic": {"test_categories": "nonsense"}}'])
def test_output_without_results_is_rejected(text):
    with pytest.raises(ValueError):
        parse_diag(text)


def fake_dcgmi(tmp_path, body: str) -> str:
    path = tmp_path / "dcgmi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_probe_runs_dcgmi_with_an_argument_list(tmp_path):
    out = tmp_path / "diag.json"
    out.write_text(json.dumps(DIAG_4X))
    args = tmp_path / "args"
    dcgmi = fake_dcgmi(tmp_path, f'echo "$@" > {args}\ncat {out}\nexit 226\n')
    facts = probe_dcgm(dcgmi, 2, timeout_s=10, gpus=[1, 0])
    assert args.read_text().strip() == "diag -r 2 -j -i 0,1"
    assert facts.status == "ok" and facts.exit_code == 226 and facts.version == "4.2.3"
    [finding] = dcgm_diag(default_input(dcgm=facts))
    assert finding.gpu == 1 and finding.status == "fail" and "memory" in finding.message


def test_probe_kills_a_dcgmi_that_overruns_its_deadline(tmp_path):
    dcgmi = fake_dcgmi(tmp_path, "sleep 30 &\nsleep 30\n")
    started = time.monotonic()
    facts = probe_dcgm(dcgmi, 1, timeout_s=0.5)
    assert time.monotonic() - started < 3
    assert facts.status == "timeout" and "0.5 s" in facts.message


def test_probe_reports_garbage_and_missing_dcgmi(tmp_path):
    facts = probe_dcgm(fake_dcgmi(tmp_path, 'echo "Error: host engine not running" >&2\nexit 1\n'), 1, 10)
    assert facts.status == "error" and "host engine not running" in facts.message
    assert probe_dcgm(str(tmp_path / "nowhere" / "dcgmi"), 1, 10).status == "not_installed"
    assert probe_dcgm("dcgmi-that-does-not-exist", 1, 10).status == "not_installed"
