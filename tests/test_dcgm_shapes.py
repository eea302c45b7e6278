"""DCGM 4 failure shapes: a failure only in a test's summary or only in dcgmi's exit code fails
the run; configuration warnings written as "Fail" are warnings; "warning" and "warnings"."""
from __future__ import annotations

import json

from healthcheck.checks.dcgm import dcgm_diag
from healthcheck.facts import GpuFacts, NvmlFacts
from healthcheck.probes.dcgm_diag import parse_diag, probe_dcgm

from .checks_support import default_input


def gpu_result(entity, status="Pass", **extra):
    return dict({"entity_group": "GPU", "entity_group_id": 1, "entity_id": entity, "status": status}, **extra)


def diag(*tests, version="4.2.3"):
    return json.dumps({"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": list(tests)}]},
                       "metadata": {"version": version}})


PERSISTENCE = [{"warning": "Persistence mode for GPU 0 is disabled. Enable persistence mode by running "
                           "\"nvidia-smi -i <gpuId> -pm 1 \" as root.", "error_id": 29,
                "error_category": 8, "error_severity": 5}]
SUMMARY_ONLY = diag({"name": "nvlink_status", "results": [gpu_result(0), gpu_result(1)],
                     "test_summary": {"status": "Fail", "warnings": [
                         {"warning": "The fabricmanager is not initialized", "error_id": 108,
                          "error_category": 12, "error_severity": 2}]}})
CONFIG_ONLY = diag({"name": "software", "results": [gpu_result(0, "Fail", warnings=PERSISTENCE),
                                                   gpu_result(1, "Fail", warnings=PERSISTENCE)],
                    "test_summary": {"status": "Fail"}})
ALL_PASS = diag({"name": "software", "results": [gpu_result(0), gpu_result(1)], "test_summary": {"status": "Pass"}})


def nvml():
    return NvmlFacts(gpus=[GpuFacts(index=0, pci_bus_id="00000000:18:00.0"),
                           GpuFacts(index=1, pci_bus_id="00000000:2A:00.0")], device_count=2)


def fake_dcgmi(tmp_path, output: str, code: int) -> str:
    out = tmp_path / "diag.json"
    out.write_text(output)
    path = tmp_path / "dcgmi"
    path.write_text(f"#!/bin/sh\ncat {out}\nexit {code}\n")
    path.chmod(0o755)
    return str(path)


def judged(tmp_path, output, code):
    facts = probe_dcgm(fake_dcgmi(tmp_path, output, code), 1, timeout_s=10)
    assert facts.status == "ok", facts.message
    return dcgm_diag(default_input(dcgm=facts, nvml=nvml()))


def test_a_failure_only_in_the_test_summary_fails_the_node(tmp_path):
    [finding] = judged(tmp_path, SUMMARY_ONLY, 226)
    assert (finding.gpu, finding.status, finding.action) == (None, "fail", "drain")
    assert "node failed nvlink_status: The fabricmanager is not initialized" in finding.message


def test_a_summary_does_not_repeat_a_failure_an_entity_already_carries():
    text = diag({"name": "memory", "results": [gpu_result(0), gpu_result(1, "Fail", warnings=[
        {"warning": "GPU 1 had uncorrectable memory errors", "error_id": 95}])], "test_summary": {"status": "Fail"}})
    _, results, _ = parse_diag(text)
    assert [(r.test, r.status, r.gpus) for r in results if r.status == "fail"] == [("memory", "fail", [1])]


def test_a_failure_only_in_the_exit_code_fails_the_run(tmp_path):
    [finding] = judged(tmp_path, ALL_PASS, 226)
    assert (finding.gpu, finding.status, finding.action) == (None, "fail", "drain")
    assert "exited 226" in finding.message and finding.evidence["exit_code"] == 226
    assert judged(tmp_path, ALL_PASS, 0) == []


def test_persistence_mode_written_as_fail_is_a_warning(tmp_path):
    findings = judged(tmp_path, CONFIG_ONLY, 226)
    assert [(f.gpu, f.status, f.action) for f in findings] == [(0, "warn", "warn"), (1, "warn", "warn")]
    assert "warned in software: Persistence mode for GPU 0 is disabled" in findings[0].message


def test_a_real_failure_beside_a_configuration_warning_still_fails(tmp_path):
    text = diag({"name": "software", "results": [gpu_result(0, "Fail", warnings=PERSISTENCE), gpu_result(1)]},
                {"name": "memory", "results": [gpu_result(0, "Fail", warnings=[
                    {"warning": "GPU 0 had uncorrectable memory errors", "error_id": 95}])]})
    [finding] = judged(tmp_path, text, 226)
    assert (finding.gpu, finding.status, finding.action) == (0, "fail", "drain")
    assert "failed software, memory: GPU 0 had uncorrectable memory errors" in finding.message


def test_warning_and_warnings_keys_are_both_read():
    text = diag({"name": "pcie", "results": [
        gpu_result(0, "Fail", warning={"warning": "PCIe replay rate too high", "error_id": 98}),
        gpu_result(1, "Fail", warnings=[{"warning": "PCIe bandwidth low", "error_id": 30}])]})
    _, results, _ = parse_diag(text)
    assert [(r.gpus, r.warnings, r.error_ids) for r in results] == [
        ([0], ["PCIe replay rate too high (error id 98)"], [98]), ([1], ["PCIe bandwidth low (error id 30)"], [30])]
