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

from .checks_support import (ALL_SIM_CHECKS, ANSWER_TIMEOUT_S, HANG_TIMEOUT_S, HARDWARE, LONE_HANG_TIMEOUT_S,
                             PERFTEST_CHECKS, hardware_for, make_config, sim)
from .conftest import SIM_PROFILES

PROFILES = sorted(glob.glob(os.path.join(SIM_PROFILES, "*.toml")))
GROWTH_CHECKS = {cid for cid, spec in CHECKS.items() if spec.samples}


def expected_ids(profile):
    return sorted(profile["expect"]["findings"])


def run_profile(tmp_path, path, tier="health", hardware=True, **kwargs):
    profile = load_profile(path)
    checks = ALL_SIM_CHECKS + [cid for cid in PERFTEST_CHECKS if cid in profile.get("expect", {}).get("findings", [])]
    hangs = "probe.timeout" in profile.get("expect", {}).get("findings", [])
    cfg = make_config(hardware=hardware_for(profile["gpu"][0]["name"]) if hardware else None,
                      timeout_s=HANG_TIMEOUT_S if hangs else ANSWER_TIMEOUT_S,
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
    deadline, margin = LONE_HANG_TIMEOUT_S if name == "h100-gpu-hang.toml" else HANG_TIMEOUT_S, 3.0
    cfg = make_config(hardware=HARDWARE["H100"], timeout_s=deadline)
    sources = sim(tmp_path, os.path.join(SIM_PROFILES, name))
    started = time.monotonic()
    report = run_checks(cfg, "n1", "health", sources=sources)
    assert time.monotonic() - started < deadline + margin
    assert report.status == "error" and report.exit_code == 3
    assert [f.check for f in report.findings] == ["probe.timeout"]
    assert report.findings[0].message.endswith(f"did not answer within {deadline:g} s") or \
        report.findings[0].message == f"GPU 5 did not answer NVML within {deadline:g} s while 7 other GPU(s) did"
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


# -- B200 and GB200 NVL72 (fabric info v3, recovery actions 5-7) ---------------------------------------
NEW_FABRIC_HEALTHY = ["b200-healthy.toml", "gb200-nvl72-healthy.toml", "gb200-fabric-mask-0xaa.toml"]


@pytest.mark.parametrize("tier", ["prolog", "health", "deep"])
@pytest.mark.parametrize("name", NEW_FABRIC_HEALTHY)
def test_healthy_b200_and_gb200_pass_every_tier(tmp_path, name, tier):
    path = os.path.join(SIM_PROFILES, name)
    cfg = make_config(hardware=hardware_for(load_profile(path)["gpu"][0]["name"]),
                      perftest={"server_wait_s": 0.1, "duration_s": 1},
                      tiers={"deep": [cid for cid in CHECKS if cid != "dcgm.diag"]})
    report = run_checks(cfg, "n1", tier, sources=sim(tmp_path, path))
    assert (report.status, report.findings) == ("ok", []), [f"{f.check}: {f.message}" for f in report.findings]
    assert "nvlink.fabric_health" in cfg.tier(tier)


@pytest.mark.parametrize("name,gpus", [("gb200-fabric-limited-capacity.toml", [2]),
                                       ("gb200-fabric-unhealthy.toml", [0]),
                                       ("gb200-fabric-degraded-bw.toml", [1]),
                                       ("gb200-fabric-route-recovery.toml", [1]),
                                       ("gb200-fabric-route-unhealthy.toml", [1]),
                                       ("gb200-fabric-access-timeout-recovery.toml", [1]),
                                       ("gb200-fabric-incorrect-configuration.toml", [3])])
def test_a_gb200_tray_with_an_unhealthy_fabric_fails_the_prolog_on_that_gpu_only(tmp_path, name, gpus):
    path = os.path.join(SIM_PROFILES, name)
    cfg = make_config(hardware=HARDWARE["GB200"])
    report = run_checks(cfg, "n1", "prolog", sources=sim(tmp_path, path))
    assert [(f.check, f.gpu, f.status, f.action) for f in report.findings] == \
        [("nvlink.fabric_health", gpu, "fail", "drain") for gpu in gpus]
    assert report.status == "fail" and report.action == "drain" and report.exit_code != 0


def test_the_fabric_health_finding_says_what_the_driver_reported(tmp_path):
    cfg = make_config(hardware=HARDWARE["GB200"])
    limited = run_checks(cfg, "n1", "prolog", sources=sim(tmp_path / "a",
                                                           os.path.join(SIM_PROFILES, "gb200-fabric-limited-capacity.toml")))
    [finding] = limited.findings
    assert "health summary limited capacity" in finding.message
    assert finding.evidence["health_summary"] == "limited capacity"
    assert finding.evidence["cluster_uuid"] == "6b1d3c2e-9f4a-4e1b-8c7d-2a5f0e9b7c31" and finding.evidence["clique_id"] == 32766
    wrong = run_checks(cfg, "n1", "prolog", sources=sim(tmp_path / "b",
                                                         os.path.join(SIM_PROFILES, "gb200-fabric-incorrect-configuration.toml")))
    [finding] = wrong.findings
    assert "incorrect configuration: insufficient NVLinks" in finding.message and finding.evidence["health_mask"] == "0x5aa"


def test_fabric_health_is_not_judged_where_the_driver_is_older_than_r570(tmp_path):
    """R550/R560 refuse fabric info v3 (NVML_ERROR_ARGUMENT_VERSION_MISMATCH): the probe reads the
    fabric with v2, the health stays unknown, and nothing is judged (not a failure)."""
    path = os.path.join(SIM_PROFILES, "gb200-fabric-limited-capacity.toml")
    node = SimNode(str(tmp_path), "n1", path)
    node.ensure()
    node.inject([("node.driver_version", "560.35.03")])
    cfg = make_config(hardware=HARDWARE["GB200"])
    from healthcheck.sources import sim_sources

    report = run_checks(cfg, "n1", "prolog", sources=sim_sources("n1", str(tmp_path), path))
    assert (report.status, report.findings) == ("ok", [])
    gpu = report.facts.nvml.gpus[2]
    assert (gpu.fabric_state, gpu.fabric_health_summary, gpu.fabric_health_mask) == (3, None, None)
    assert "fabric_health" in gpu.unsupported and gpu.driver_missing == {"fabric_health": "nvmlGpuFabricInfo_v3"}
    assert gpu.fabric_clique_id == 32766          # the domain is still known (every version has it)
    required = make_config(hardware=dict(HARDWARE["GB200"], nvml_required=["fabric_health"]))
    demanded = run_checks(required, "n1", "prolog", sources=sim_sources("n1", str(tmp_path), path))
    assert {(f.check, f.status) for f in demanded.findings} == {("gpu.nvml", "fail")}


# -- IMEX: judged only in a multi-node NVLink domain, and only where the site says the tool owns it ------
def _sim_injected(tmp_path, name, assignments):
    from healthcheck.sources import sim_sources

    path = os.path.join(SIM_PROFILES, name)
    node = SimNode(str(tmp_path), "n1", path)
    node.ensure()
    if assignments:
        node.inject(assignments)
    return sim_sources("n1", str(tmp_path), path)


@pytest.mark.parametrize("daemon", ["UNAVAILABLE", "WAITING_FOR_PEERS", "SHUTTING_DOWN", "READY", ""])
def test_an_h100_node_with_no_imex_domain_never_gets_an_imex_finding(tmp_path, daemon):
    """Whatever IMEX reports on a single HGX box (no cluster UUID, no clique, no channel), even
    with imex_owned = true: no domain, no finding (DCGM#308's false drains). "": not installed."""
    cfg = make_config(hardware=dict(HARDWARE["H100"], imex_owned=True))
    sources = _sim_injected(tmp_path, "h100-healthy.toml", [("node.imex_daemon", daemon)])
    for tier in ("prolog", "health"):
        report = run_checks(cfg, "n1", tier, sources=sources)
        assert not [f for f in report.findings if f.check.startswith("imex.")], report.findings
        assert report.findings == [] and report.status == "ok"
        assert report.facts.imex.daemon == (daemon or None)   # IMEX was asked: the domain decides


def test_imex_channels_alone_put_a_node_in_a_domain(tmp_path):
    """A node whose GPUs report no cluster UUID but that has IMEX channels is in a domain: its
    IMEX is judged where the tool owns it."""
    cfg = make_config(hardware=dict(HARDWARE["H100"], imex_owned=True))
    sources = _sim_injected(tmp_path, "h100-healthy.toml", [("node.imex_channels", [0]),
                                                              ("node.imex_daemon", "UNAVAILABLE")])
    report = run_checks(cfg, "n1", "prolog", sources=sources)
    assert [(f.check, f.status) for f in report.findings] == [("imex.domain", "fail")]


@pytest.mark.parametrize("name,said", [("gb200-imex-down.toml", "the IMEX daemon is UNAVAILABLE, not READY"),
                                       ("gb200-imex-no-channel.toml", "no IMEX channel")])
def test_a_gb200_tray_whose_imex_is_down_fails_the_prolog_where_the_tool_owns_imex(tmp_path, name, said):
    path = os.path.join(SIM_PROFILES, name)
    owned = run_checks(make_config(hardware=HARDWARE["GB200"]), "n1", "prolog", sources=sim(tmp_path / "a", path))
    [finding] = owned.findings
    assert (finding.check, finding.status, finding.action, finding.gpu) == ("imex.domain", "fail", "drain", None)
    assert said in finding.message
    assert finding.evidence["domain"] == [{"cluster_uuid": "6b1d3c2e-9f4a-4e1b-8c7d-2a5f0e9b7c31", "clique_id": 32766}]
    # imex_owned absent (the default): IMEX is someone else's, not even asked
    theirs = dict(HARDWARE["GB200"])
    del theirs["imex_owned"]
    report = run_checks(make_config(hardware=theirs), "n1", "prolog", sources=sim(tmp_path / "b", path))
    assert (report.status, report.findings, report.facts.imex) == ("ok", [], None)


def test_an_imex_tool_that_does_not_answer_is_an_error_that_drains_nothing(tmp_path):
    path = os.path.join(SIM_PROFILES, "gb200-nvl72-healthy.toml")
    sources = sim(tmp_path, path)
    ctl = os.path.join(sources.programs_dir, "nvidia-imex-ctl")
    with open(ctl, "w") as handle:
        handle.write("#!/bin/sh\necho 'connection refused' >&2\nexit 1\n")
    report = run_checks(make_config(hardware=HARDWARE["GB200"]), "n1", "prolog", sources=sources)
    [finding] = report.findings
    assert (finding.check, finding.status, finding.action) == ("imex.domain", "error", "none")
    assert "connection refused" in finding.message
