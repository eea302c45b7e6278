"""ib.bandwidth: perftest's ib_write_bw output parsed from real-format text, the loopback probe
run through stand-in programs, the pure check, and the simulator's stand-in on a whole node."""
from __future__ import annotations

import os

import pytest

from healthcheck.checks.ib_bandwidth import ib_bandwidth
from healthcheck.config.settings import PerftestSettings
from healthcheck.facts import IbBandwidthFacts, IbBandwidthResult, IbPortFacts
from healthcheck.probes import perftest
from healthcheck.runner import run_checks
from healthcheck.plain import replace
from healthcheck.sim.node import SimNode

from .checks_support import HARDWARE, default_input, make_config, sim

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "perftest")
SETTINGS = PerftestSettings(ib_write_bw="ib_write_bw", duration_s=1, message_bytes=1048576, qps=2, timeout_s=10.0,
                            server_wait_s=0.0, base_port=18515)


def fixture(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        return handle.read()


# -- parsing ---------------------------------------------------------------------------------------------------
def test_gbits_output_in_duration_mode():
    assert perftest.parse_bw(fixture("write_bw_ndr_gbits_duration.txt")) == ("Gb/sec", 1048576, 0.0, 386.41)


def test_mbytes_output_is_mebibytes_per_second():
    unit, size, peak, avg = perftest.parse_bw(fixture("write_bw_hdr_mbytes.txt"))
    assert (unit, size, avg) == ("MB/sec", 65536, 23470.52)
    # perftest's MB is 2**20 bytes: 23470.52 MiB/s is 196.88 Gb/s on an HDR (200 Gb/s) link.
    assert round(perftest.to_gbps(avg, unit), 2) == 196.88


def test_all_sizes_output_gives_the_largest_message_row():
    assert perftest.parse_bw(fixture("write_bw_roce_all_sizes.txt")) == ("Gb/sec", 8388608, 97.85, 97.79)


@pytest.mark.parametrize("text", [fixture("write_bw_no_server.txt"), "",
                                  " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"])
def test_output_without_a_result_row_is_an_error(text):
    with pytest.raises(perftest.PerftestOutputError):
        perftest.parse_bw(text)


# -- the probe -------------------------------------------------------------------------------------------------
def port(hca, state=4, rate=400.0, layer="InfiniBand", gids=None):
    return IbPortFacts(hca=hca, port=1, state=state, rate_gbps=rate, link_layer=layer, gid_types=gids or {})


def test_pairs_form_a_ring_over_active_ports_and_one_port_writes_to_itself():
    pairs = perftest.plan_pairs([port("mlx5_2"), port("mlx5_0"), port("mlx5_1", state=1)])
    assert [(c.hca, s.hca) for c, s in pairs] == [("mlx5_0", "mlx5_2"), ("mlx5_2", "mlx5_0")]
    [(client, server)] = perftest.plan_pairs([port("mlx5_0")])
    assert client is server
    assert perftest.plan_pairs([port("mlx5_0", state=1)]) == []


def test_roce_ports_get_a_roce_v2_gid_index_and_ib_ports_none():
    roce = port("mlx5_0", layer="Ethernet", gids={0: "IB/RoCE v1", 1: "RoCE v2", 3: "RoCE v2"})
    assert perftest.gid_index(roce, None) == 1
    assert perftest.gid_index(roce, 3) == 3
    assert perftest.gid_index(port("mlx5_0"), 3) is None
    argv = perftest.build_argv("/bin/ib_write_bw", roce, SETTINGS, 18516, 3, "127.0.0.1")
    assert argv == ["/bin/ib_write_bw", "-d", "mlx5_0", "-i", "1", "-p", "18516", "-D", "1", "-s", "1048576",
                    "-q", "2", "-F", "--report_gbits", "-x", "3", "127.0.0.1"]


def fake_program(tmp_path, body):
    """An ib_write_bw that records its arguments and prints a fixture (client) or nothing (server)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    path = bindir / "ib_write_bw"
    path.write_text("#!/bin/sh\n" f"echo \"$@\" >> {tmp_path}/calls\n" + body)
    path.chmod(0o755)
    return str(bindir)


def test_probe_runs_a_server_and_a_client_per_pair(tmp_path):
    out = os.path.join(FIXTURES, "write_bw_ndr_gbits_duration.txt")
    bindir = fake_program(tmp_path, f'case "$*" in *127.0.0.1) cat {out};; esac\n')
    facts = perftest.probe_ib_bandwidth([port("mlx5_0"), port("mlx5_1")], SETTINGS, programs_dir=bindir)
    assert facts.status == "ok" and facts.program == os.path.join(bindir, "ib_write_bw")
    assert [(r.client, r.server, r.status, r.bw_avg_gbps, r.rate_gbps) for r in facts.results] == [
        ("mlx5_0:1", "mlx5_1:1", "ok", 386.41, 400.0), ("mlx5_1:1", "mlx5_0:1", "ok", 386.41, 400.0)]
    calls = sorted((tmp_path / "calls").read_text().splitlines())
    assert len(calls) == 4
    assert "-d mlx5_0 -i 1 -p 18515 -D 1 -s 1048576 -q 2 -F --report_gbits 127.0.0.1" in calls   # client 0
    assert "-d mlx5_1 -i 1 -p 18515 -D 1 -s 1048576 -q 2 -F --report_gbits" in calls             # its server


def test_a_failing_client_is_an_error_with_perftests_last_line(tmp_path):
    out = os.path.join(FIXTURES, "write_bw_no_server.txt")
    bindir = fake_program(tmp_path, f"cat {out} >&2\nexit 1\n")
    [result] = perftest.probe_ib_bandwidth([port("mlx5_0")], SETTINGS, programs_dir=bindir).results
    assert result.status == "error" and "exited 1" in result.message and "socket connection" in result.message


def test_a_hanging_run_times_out(tmp_path):
    bindir = fake_program(tmp_path, "sleep 30\n")
    settings = replace(SETTINGS, timeout_s=1.0)
    [result] = perftest.probe_ib_bandwidth([port("mlx5_0")], settings, programs_dir=bindir).results
    assert result.status == "timeout" and "1 s" in result.message


def test_perftest_not_installed_is_unsupported(tmp_path):
    facts = perftest.probe_ib_bandwidth([port("mlx5_0")], SETTINGS, programs_dir=str(tmp_path))
    assert facts.status == "unsupported" and facts.results == []
    assert "not installed" in facts.message
    assert ib_bandwidth(default_input(ib_bandwidth=facts)) == []
    settings = replace(SETTINGS, ib_write_bw=str(tmp_path / "nowhere" / "ib_write_bw"))
    assert perftest.probe_ib_bandwidth([port("mlx5_0")], settings).status == "unsupported"


# -- the check -------------------------------------------------------------------------------------------------
def result(client, avg, rate=400.0, server=None, status="ok", message=""):
    return IbBandwidthResult(client=client, server=server or client, rate_gbps=rate, bw_avg_gbps=avg,
                             status=status, message=message, message_bytes=1048576, unit="Gb/sec")


def test_a_slow_port_fails_naming_the_hca_and_measured_vs_expected():
    facts = IbBandwidthFacts(results=[result("mlx5_0:1", 386.4, server="mlx5_1:1"),
                                      result("mlx5_1:1", 150.0, server="mlx5_0:1")])
    [finding] = ib_bandwidth(default_input(ib_bandwidth=facts))
    assert (finding.check, finding.status, finding.action, finding.hca, finding.port) == \
        ("ib.bandwidth", "fail", "drain", "mlx5_1", 1)
    assert "150 Gb/s measured, at least 320 Gb/s expected (80% of 400 Gb/s)" in finding.message
    assert finding.evidence["measured_gbps"] == 150.0 and finding.evidence["expected_gbps"] == 320.0


def test_the_threshold_is_config():
    facts = IbBandwidthFacts(results=[result("mlx5_0:1", 300.0)])
    assert ib_bandwidth(default_input(ib_bandwidth=facts))        # 300 < 80% of 400
    inp = default_input(ib_bandwidth=facts)
    inp.thresholds = dict(inp.thresholds, ib_bandwidth_min_pct=70)
    assert ib_bandwidth(inp) == []


def test_a_run_that_could_not_start_warns_and_a_hang_fails():
    facts = IbBandwidthFacts(results=[result("mlx5_0:1", None, status="error", message="exited 1: no device"),
                                      result("mlx5_1:1", None, status="timeout", message="did not finish")])
    error, hang = ib_bandwidth(default_input(ib_bandwidth=facts))
    assert (error.status, error.action, error.hca) == ("error", "warn", "mlx5_0")
    assert (hang.status, hang.action, hang.hca) == ("fail", "drain", "mlx5_1")


# -- the simulator's stand-in ----------------------------------------------------------------------------------
def deep(tmp_path, profile, node="n1", **hardware):
    cfg = make_config(node=node, hardware=dict(HARDWARE["H100"], **hardware), tiers={"deep": ["ib.bandwidth"]},
                      perftest={"server_wait_s": 0.1, "duration_s": 1})
    return run_checks(cfg, node, "deep", sources=sim(tmp_path, profile, node))


def test_stand_in_on_a_healthy_node_measures_every_port_and_finds_nothing(tmp_path):
    report = deep(tmp_path, "h100-healthy.toml")
    assert report.findings == []
    results = report.facts.ib_bandwidth.results
    assert len(results) == 8 and {r.bw_avg_gbps for r in results} == {384.0}     # 96% of NDR


def test_stand_in_degraded_port_and_down_port_and_no_perftest(tmp_path):
    report = deep(tmp_path, "h100-ib-bandwidth-degraded.toml")
    [finding] = report.findings
    assert (finding.hca, finding.evidence["measured_gbps"], finding.evidence["expected_gbps"]) == \
        ("mlx5_5", 131.2, 320.0)
    node = SimNode(str(tmp_path), "n1")
    node.inject([("ib.mlx5_5:1.state", "1: DOWN")])
    report = deep(tmp_path, "h100-ib-bandwidth-degraded.toml")
    assert {f.check for f in report.findings} == set()     # ib.port judges the down port; no pair uses it
    assert len(report.facts.ib_bandwidth.results) == 7
    node.inject([("node.perftest", False)])
    report = deep(tmp_path, "h100-ib-bandwidth-degraded.toml")
    assert report.findings == [] and report.facts.ib_bandwidth.status == "unsupported"
