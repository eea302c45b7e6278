"""Every shipped simulator profile raises exactly the findings it promises; growth faults
show on the second of two runs; the runner composes tiers, job GPUs and deadlines."""
from __future__ import annotations

import glob
import os
import stat
import time

import pytest

from healthcheck.checklist import CHECKS, FINDING_IDS
from healthcheck.runner import run_checks
from healthcheck.sim.node import SimNode
from healthcheck.sim.profile import load_profile

from .checks_support import ALL_SIM_CHECKS, HARDWARE, PERFTEST_CHECKS, hardware_for, make_config, sim
from .conftest import SIM_PROFILES

PROFILES = sorted(glob.glob(os.path.join(SIM_PROFILES, "*.toml")))
GROWTH_CHECKS = {cid for cid, spec in CHECKS.items() if spec.samples}


def expected_ids(profile):
    return sorted(profile["expect"]["findings"])


def run_profile(tmp_path, path, tier="health", hardware=True, **kwargs):
    profile = load_profile(path)
    checks = ALL_SIM_CHECKS + [cid for cid in PERFTEST_CHECKS if cid in profile.get("expect", {}).get("findings", [])]
    cfg = make_config(hardware=hardware_for(profile["gpu"][0]["name"]) if hardware else None,
                      tiers={"health": checks}, perftest={"server_wait_s": 0.1, "duration_s": 1})
    return profile, run_checks(cfg, "n1", tier, sources=sim(tmp_path, path), **kwargs)


@pytest.mark.parametrize("path", PROFILES, ids=os.path.basename)
def test_profile_gives_exactly_its_expected_findings(tmp_path, path):
    profile, report = run_profile(tmp_path, path)
    assert sorted({f.check for f in report.findings}) == expected_ids(profile), \
        [f"{f.check}: {f.message}" for f in report.findings]
    assert set(expected_ids(profile)) <= FINDING_IDS


def test_every_fault_the_checks_detect_has_a_profile():
    promised = {cid for path in PROFILES for cid in load_profile(path)["expect"]["findings"]}
    static = set(CHECKS) - GROWTH_CHECKS - {"gpu.model", "dcgm.diag"}
    assert static | {"probe.timeout"} <= promised


@pytest.mark.parametrize("name", ["h100-healthy.toml", "a100-healthy.toml", "pcie-l40s-healthy.toml",
                                  "v100-healthy.toml"])
def test_healthy_profiles_are_quiet_without_any_expectation(tmp_path, name):
    _, report = run_profile(tmp_path, os.path.join(SIM_PROFILES, name), hardware=False)
    assert report.findings == [] and report.status == "ok" and report.exit_code == 0


@pytest.mark.parametrize("name,checks", [("h100-ecc-dbe.toml", {"gpu.ecc.uncorrectable", "kernel.xid"}),
                                         ("h100-xid79-gpu-lost.toml", {"gpu.lost", "kernel.xid"}),
                                         ("h100-nvlink-down.toml", {"nvlink.down"}),
                                         ("h100-fabric-manager-down.toml", {"nvlink.fabric"})])
def test_health_facts_are_judged_without_expectation(tmp_path, name, checks):
    _, report = run_profile(tmp_path, os.path.join(SIM_PROFILES, name), hardware=False)
    assert {f.check for f in report.findings} == checks


def test_ib_port_faults_name_the_one_bad_port(tmp_path):
    _, report = run_profile(tmp_path, os.path.join(SIM_PROFILES, "h100-ib-port-down.toml"))
    [finding] = report.findings
    assert (finding.hca, finding.port, finding.status, finding.action) == ("mlx5_2", 1, "fail", "drain")


def test_prolog_judges_only_the_jobs_gpus(tmp_path):
    path = os.path.join(SIM_PROFILES, "h100-stray-process.toml")
    cfg = make_config(hardware=HARDWARE["H100"])
    on_job = run_checks(cfg, "n1", "prolog", gpus=[0, 1], sources=sim(tmp_path / "a", path))
    assert [(f.check, f.gpu) for f in on_job.findings] == [("gpu.processes", 0)]
    assert on_job.status == "fail" and on_job.action == "drain"
    elsewhere = run_checks(cfg, "n1", "prolog", gpus=[4], sources=sim(tmp_path / "b", path))
    assert elsewhere.findings == [] and elsewhere.status == "ok"
    health = run_checks(cfg, "n1", "health", sources=sim(tmp_path / "c", path))
    assert health.findings == [], "compute processes are normal while jobs run"


@pytest.mark.parametrize("name", ["h100-nvml-hang.toml", "h100-gpu-hang.toml"])
def test_a_hang_is_an_error_finding_within_the_deadline(tmp_path, name):
    deadline, margin = 1.0, 3.0
    cfg = make_config(hardware=HARDWARE["H100"], timeout_s=deadline)
    sources = sim(tmp_path, os.path.join(SIM_PROFILES, name))
    started = time.monotonic()
    report = run_checks(cfg, "n1", "health", sources=sources)
    assert time.monotonic() - started < deadline + margin
    assert report.status == "error" and report.exit_code == 3
    assert [f.check for f in report.findings] == ["probe.timeout"]
    assert report.findings[0].message.endswith("did not answer within 1 s") or \
        report.findings[0].message == "GPU 5 did not answer NVML within 1 s while 7 other GPU(s) did"
    # the driver as a whole (ambiguous) or one GPU while its siblings answered (a broken GPU)
    assert report.findings[0].evidence.get("answered_gpus") == (7 if name == "h100-gpu-hang.toml" else None)


def test_growth_faults_show_on_the_second_run(tmp_path):
    state = tmp_path / "state"
    cfg = make_config(hardware=HARDWARE["H100"], state_dir=str(state))
    path = os.path.join(SIM_PROFILES, "h100-healthy.toml")
    first = run_checks(cfg, "n1", "health", sources=sim(state, path), now=1_000_000.0, commit=True)
    assert first.findings == []
    history = state / "counters" / "n1.json"
    assert stat.S_IMODE(os.stat(history).st_mode) == 0o640

    SimNode(str(state), "n1").inject([
        ("gpu.3.ecc.volatile_corrected", 4000),            # > 1000 per day
        ("gpu.1.nvlink.errors.7.replay", 500),             # > 100 per hour
        ("gpu.1.nvlink.errors.7.recovery", 2),             # within 5 per hour
        ("ib.mlx5_6:1.counters.symbol_error", 40),         # > 10 per hour
        ("ib.mlx5_1:1.counters.port_rcv_errors", 3),       # within 10 per hour
    ])
    second = run_checks(cfg, "n1", "health", sources=sim(state, path), now=1_000_600.0, commit=True)
    found = sorted((f.check, f.gpu, f.hca) for f in second.findings)
    assert found == [("gpu.ecc.correctable_rate", 3, None), ("ib.counters", None, "mlx5_6"),
                     ("nvlink.errors", 1, None)]
    nvlink_finding = next(f for f in second.findings if f.check == "nvlink.errors")
    assert nvlink_finding.evidence["over"] == [{"link": 7, "counter": "replay", "growth": 500.0, "limit": 100.0}]

    # Nothing new an hour later: the errors are old news within the NVLink and IB windows' end.
    third = run_checks(cfg, "n1", "health", sources=sim(state, path), now=1_000_600.0 + 7200, commit=True)
    assert {f.check for f in third.findings} == {"gpu.ecc.correctable_rate"}   # still within its day


def test_report_json_has_the_contract_keys(tmp_path):
    _, report = run_profile(tmp_path, os.path.join(SIM_PROFILES, "h100-xid79-gpu-lost.toml"))
    doc = report.to_json()
    assert set(doc) == {"node", "status", "findings", "duration_ms"}
    assert {"check", "status", "action", "message", "gpu", "pci_bus_id", "hca", "port",
            "evidence"} <= set(doc["findings"][0])
    assert isinstance(doc["duration_ms"], int)


def test_a_broken_check_is_reported_and_the_rest_still_run(tmp_path, monkeypatch):
    from healthcheck.checks import gpu_count

    def broken(inp):
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(gpu_count, "gpu_count", broken)
    _, report = run_profile(tmp_path, os.path.join(SIM_PROFILES, "h100-xid79-gpu-lost.toml"))
    assert sorted((f.check, f.action) for f in report.findings) == [("check.error", "none"), ("gpu.lost", "drain"),
                                                                     ("kernel.xid", "drain")]


def test_kernel_events_are_judged_once_per_consumer(tmp_path):
    """The health check judges only new Xid lines; another tier keeps its own cursor."""
    state = tmp_path / "state"
    path = os.path.join(SIM_PROFILES, "h100-healthy.toml")
    cfg = make_config(hardware=hardware_for("H100"), tiers={"health": ["kernel.xid"], "deep": ["kernel.xid"]})
    assert run_checks(cfg, "n1", "health", sources=sim(state, path), commit=True).findings == []
    SimNode(str(state), "n1").inject([], ["[ 9000.000001] NVRM: Xid (PCI:0000:9a:00): 79, pid=77, name=python, "
                                          "GPU has fallen off the bus."])
    [first] = run_checks(cfg, "n1", "health", sources=sim(state, path), commit=True).findings
    assert (first.check, first.gpu, first.evidence["code"]) == ("kernel.xid", 4, 79)
    assert run_checks(cfg, "n1", "health", sources=sim(state, path), commit=True).findings == []
    [deep] = run_checks(cfg, "n1", "deep", sources=sim(state, path), commit=True).findings
    assert deep.evidence["code"] == 79
    [admin] = run_checks(cfg, "n1", "health", sources=sim(state, path), consumer="cli", commit=True).findings
    assert admin.evidence["code"] == 79
    assert run_checks(cfg, "n1", "health", sources=sim(state, path), commit=True).findings == []
