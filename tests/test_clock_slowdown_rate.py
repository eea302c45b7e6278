"""Clock event reasons: the noise/slowdown split is data; a slowdown seen once warns
(gpu.clock_events), seen in too many runs within a window drains (gpu.clock_events.rate);
noise is never a finding, on any driver branch."""
from __future__ import annotations

import pytest

from healthcheck.checks.gpu_thermal import clock_events, clock_slowdown_rate, clock_slowdown_samples
from healthcheck.driver_support import clock_event_reasons, slowdown_reasons
from healthcheck.facts import GpuFacts, NvmlFacts
from healthcheck.runner import run_checks
from healthcheck.sim.node import SimNode

from .checks_support import HARDWARE, default_input, make_config, sim

CLOCK_CHECKS = ["gpu.nvml", "gpu.clock_events", "gpu.clock_events.rate"]
NOISE = 0x1 | 0x2 | 0x4 | 0x10 | 0x20 | 0x100
T0 = 2_000_000.0


def test_the_table_splits_nvmls_bits_into_noise_and_slowdown():
    table = {reason.bit: reason for reason in clock_event_reasons()}
    assert {bit for bit, r in table.items() if r.kind == "slowdown"} == {0x8, 0x40, 0x80}
    assert {bit for bit, r in table.items() if r.kind == "noise"} == {0x1, 0x2, 0x4, 0x10, 0x20, 0x100}
    assert table[0x80].constant == "nvmlClocksEventReasonHwPowerBrakeSlowdown"
    # Azure's drain mask 0xE8 holds SW thermal (0x20): noise here.
    assert [r.name for r in slowdown_reasons(0xE8)] == ["HW slowdown", "HW thermal slowdown", "HW power brake"]
    assert slowdown_reasons(NOISE | 0x200) == ()          # a bit the table does not know is noise


def _gpu(reasons):
    return GpuFacts(index=0, uuid="GPU-0", pci_bus_id="00000000:18:00.0", clock_event_reasons=reasons)


def _runs(masks, spacing_s=300.0):
    """Judge one GPU over runs ``spacing_s`` apart, keeping the history as the runner does."""
    from healthcheck.counters.growth_rate import add_samples

    history, out = {}, []
    for n, mask in enumerate(masks):
        inp = default_input(nvml=NvmlFacts(gpus=[_gpu(mask)]), history={k: [list(s) for s in v]
                                                                         for k, v in history.items()},
                            now=T0 + n * spacing_s)
        out.append((clock_events(inp), clock_slowdown_rate(inp)))
        history = add_samples(history, clock_slowdown_samples(inp), inp.now)
    return out


def test_noise_is_never_a_finding_however_often_it_is_seen():
    assert all(warn == [] and rate == [] for warn, rate in _runs([NOISE] * 20))


def test_a_slowdown_drains_only_once_seen_in_more_runs_than_allowed_within_the_window():
    results = _runs([0x8 | 0x4] * 5)
    assert [len(warn) for warn, _ in results] == [1] * 5          # each sighting warns
    assert [len(rate) for _, rate in results] == [0, 0, 0, 1, 1]  # more than 2 runs after the baseline
    finding = results[3][1][0]
    assert (finding.check, finding.status, finding.action) == ("gpu.clock_events.rate", "fail", "drain")
    assert finding.evidence["runs"] == 3.0 and finding.evidence["active"] == ["HW slowdown"]


def test_a_slowdown_that_stopped_or_comes_rarely_drains_nothing():
    assert _runs([0x40, 0x40, 0x40, 0x40, 0])[-1][1] == []
    # Seen in every run, but runs two hours apart: about one sighting per hour's window.
    assert all(rate == [] for _, rate in _runs([0x80] * 6, spacing_s=7200.0))


def test_unknown_reasons_take_no_sample_and_raise_nothing():
    inp = default_input(nvml=NvmlFacts(gpus=[_gpu(None)]), now=T0)
    assert clock_slowdown_samples(inp) == {} and clock_slowdown_rate(inp) == [] and clock_events(inp) == []


def test_the_power_brake_profile_still_warns_once_and_only_that(tmp_path):
    cfg = make_config(hardware=HARDWARE["H100"], tiers={"health": CLOCK_CHECKS})
    report = run_checks(cfg, "n1", "health", sources=sim(tmp_path, "h100-power-brake.toml"))
    assert [(f.check, f.gpu, f.action, f.evidence["active"]) for f in report.findings] == [
        ("gpu.clock_events", 0, "warn", ["HW power brake"])]


@pytest.mark.parametrize("driver", ["570.133.20", "535.161.08", "470.256.02"])
def test_a_slowdown_storm_drains_on_every_driver_branch(tmp_path, driver):
    """R535+ answers the event-reasons call, R470 only the throttle-reasons one: the same bits."""
    state = tmp_path / "state"
    cfg = make_config(hardware=HARDWARE["H100"], state_dir=str(state), tiers={"health": CLOCK_CHECKS})
    profile = "h100-hw-slowdown.toml"
    sim(state, profile)
    SimNode(str(state), "n1").inject([("node.driver_version", driver)])
    found = []
    for n in range(4):
        report = run_checks(cfg, "n1", "health", sources=sim(state, profile), now=T0 + 300 * n, commit=True)
        found.append(sorted((f.check, f.gpu) for f in report.findings))
    assert found[:3] == [[("gpu.clock_events", 3)]] * 3
    assert found[3] == [("gpu.clock_events", 3), ("gpu.clock_events.rate", 3)]
    assert report.action == "drain"
    # The storm ends: nothing more, not even a warning.
    SimNode(str(state), "n1").inject([("gpu.3.clock_event_reasons", 0x4)])
    quiet = run_checks(cfg, "n1", "health", sources=sim(state, profile), now=T0 + 1500, commit=True)
    assert quiet.findings == []
