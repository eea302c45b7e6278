"""PCIe AER: the kernel's aer_dev_* files parsed in their real formats, the probe on a sysfs
tree (hand-built and the simulator's), the three checks, and the simulated counters."""
from __future__ import annotations

import os
import shutil

import pytest

from healthcheck.checks.pcie_aer import aer_correctable_rate, aer_fatal, aer_nonfatal
from healthcheck.facts import (AER_FILES, AER_UNCORRECTABLE_NAMES, GpuFacts, NvmlFacts, PcieAerDevice, PcieAerFacts, parse_aer,
                               sysfs_pci_address)
from healthcheck.probes.aer_sysfs import probe_aer
from healthcheck.runner import run_checks
from healthcheck.sim.node import SimNode

from .checks_support import HARDWARE, default_input, make_config, sim

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "aer")
BUS_ID = "00000000:3A:00.0"
AER_CHECKS = ["gpu.nvml", "gpu.pcie.aer_fatal", "gpu.pcie.aer_nonfatal", "gpu.pcie.aer_correctable_rate"]


def fixture(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        return handle.read()


def test_the_kernels_formats_parse_to_the_total_line():
    assert parse_aer(fixture("aer_dev_correctable.linux6"), "correctable") == (
        4, {"RxErr": 3, "BadTLP": 1, "BadDLLP": 0, "Rollover": 0, "Timeout": 0, "NonFatalErr": 0,
            "CorrIntErr": 0, "HeaderOF": 0})
    total, counts = parse_aer(fixture("aer_dev_nonfatal.linux6"), "nonfatal")
    # The total counts ERR_NONFATAL messages: below the lines' sum; an unnamed bit keeps its name.
    assert total == 3 and sum(counts.values()) == 4
    assert counts["CmpltTO"] == 2 and counts["dev_nonfatal_errs_bit[27]"] == 1
    assert parse_aer(fixture("aer_dev_fatal.linux6"), "fatal")[0] == 1
    # Linux 4.19 spelled the names out: the count is still the last word.
    total, counts = parse_aer(fixture("aer_dev_correctable.linux4.19"), "correctable")
    assert total == 2 and counts["Receiver Error"] == 2 and counts["RELAY_NUM Rollover"] == 0


def test_a_file_without_its_total_line_has_no_total():
    assert parse_aer("RxErr 1\nBadTLP 0\n", "correctable") == (None, {"RxErr": 1, "BadTLP": 0})
    assert parse_aer(fixture("aer_dev_fatal.linux6"), "nonfatal")[0] is None   # TOTAL_ERR_FATAL is not it


def test_nvml_bus_ids_become_sysfs_addresses_or_nothing():
    assert sysfs_pci_address("00000000:3A:00.0") == "0000:3a:00.0"
    assert sysfs_pci_address("0000:3a:00.0") == "0000:3a:00.0"
    for bad in ("00000000:3A:00.0/../../x", "..", "", "00000000:3A:00.9"):
        assert sysfs_pci_address(bad) is None


def _tree(tmp_path, files):
    """<root>/devices/pci0000:00/0000:3a:00.0 with the given aer files, linked from
    <root>/bus/pci/devices/ as the kernel links it."""
    root = tmp_path / "sys"
    device = root / "devices" / "pci0000:00" / "0000:3a:00.0"
    device.mkdir(parents=True)
    for kind, name in files.items():
        shutil.copy(os.path.join(FIXTURES, name), device / AER_FILES[kind])
    (root / "bus" / "pci" / "devices").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:3a:00.0", root / "bus" / "pci" / "devices" / "0000:3a:00.0")
    return root, device


def test_the_probe_reads_each_gpus_files_through_sysfs_links(tmp_path):
    root, _ = _tree(tmp_path, {"fatal": "aer_dev_fatal.linux6", "nonfatal": "aer_dev_nonfatal.linux6",
                               "correctable": "aer_dev_correctable.linux6"})
    facts = probe_aer(str(root), [BUS_ID, "00000000:9A:00.0", "not/a/bus/id"])
    device = facts.device(BUS_ID)
    assert device.address == "0000:3a:00.0"
    assert device.totals == {"fatal": 1, "nonfatal": 3, "correctable": 4} and device.errors == {}
    assert device.counts["fatal"]["MalfTLP"] == 1
    # A GPU whose device has no AER files (no AER capability, a kernel before 4.19): unknown.
    assert facts.device("00000000:9A:00.0").totals == {"fatal": None, "nonfatal": None, "correctable": None}
    assert set(facts.devices) == {BUS_ID, "00000000:9A:00.0"}      # no path made of a bad id


def test_the_probe_does_not_follow_a_link_in_place_of_a_file(tmp_path):
    root, device = _tree(tmp_path, {"fatal": "aer_dev_fatal.linux6"})
    secret = tmp_path / "elsewhere"
    secret.write_text("TOTAL_ERR_NONFATAL 99\n")
    os.symlink(str(secret), device / "aer_dev_nonfatal")
    found = probe_aer(str(root), [BUS_ID]).device(BUS_ID)
    assert found.totals["nonfatal"] is None and "nonfatal" in found.errors
    assert found.totals["fatal"] == 1


def _input(totals, history=None, now=1000.0, **thresholds):
    gpu = GpuFacts(index=2, uuid="GPU-2", pci_bus_id=BUS_ID)
    aer = PcieAerFacts(devices={BUS_ID: PcieAerDevice(address="0000:3a:00.0", totals=totals,
                                                      counts={"nonfatal": {"CmpltTO": totals.get("nonfatal") or 0}})})
    inp = default_input(nvml=NvmlFacts(gpus=[gpu]), aer=aer, history=history or {}, now=now)
    if thresholds:
        inp.thresholds = dict(inp.thresholds, **thresholds)
    return inp


def test_fatal_errors_since_boot_fail_and_drain():
    [finding] = aer_fatal(_input({"fatal": 1, "nonfatal": 0, "correctable": 0}))
    assert (finding.check, finding.status, finding.action, finding.gpu) == ("gpu.pcie.aer_fatal", "fail", "drain", 2)
    assert finding.evidence["total"] == 1 and finding.evidence["address"] == "0000:3a:00.0"
    assert aer_fatal(_input({"fatal": 0, "nonfatal": 5, "correctable": 900})) == []
    assert aer_fatal(_input({"fatal": 3}, pcie_aer_fatal_max=3)) == []


def test_nonfatal_errors_fail_on_their_total_since_boot_or_their_growth():
    key = "gpu/GPU-2/pcie_aer_nonfatal"
    assert aer_nonfatal(_input({"nonfatal": 10})) == []                     # first sighting, at the limit
    [many] = aer_nonfatal(_input({"nonfatal": 11}))
    assert (many.status, many.action) == ("fail", "drain") and "11 since boot" in many.message
    # One new error within the hour, far below the total's limit.
    [grew] = aer_nonfatal(_input({"nonfatal": 3}, history={key: [[400.0, 2.0]]}))
    assert grew.evidence["growth"] == 1.0 and "CmpltTO 3" in grew.message
    assert aer_nonfatal(_input({"nonfatal": 3}, history={key: [[400.0, 3.0]]})) == []


def test_correctable_growth_warns_over_its_rate():
    key = "gpu/GPU-2/pcie_aer_correctable"
    assert aer_correctable_rate(_input({"correctable": 5000})) == []        # a total alone says nothing
    assert aer_correctable_rate(_input({"correctable": 600}, history={key: [[0.0, 500.0]]})) == []
    [finding] = aer_correctable_rate(_input({"correctable": 601}, history={key: [[0.0, 500.0]]}))
    assert (finding.status, finding.action, finding.evidence["growth"]) == ("warn", "warn", 101.0)


def test_a_gpu_without_aer_is_not_judged():
    inp = _input({"fatal": None, "nonfatal": None, "correctable": None})
    assert aer_fatal(inp) == aer_nonfatal(inp) == aer_correctable_rate(inp) == []


def test_the_simulator_renders_the_kernels_format_and_a_reboot_clears_it(tmp_path):
    sources = sim(tmp_path, "h100-aer-fatal.toml")
    path = os.path.join(sources.sysfs_root, "bus", "pci", "devices", "0000:9a:00.0", "aer_dev_fatal")
    text = open(path, encoding="utf-8").read()
    assert text.splitlines()[-1] == "TOTAL_ERR_FATAL 1" and "DLP 1" in text.splitlines()
    assert parse_aer(text, "fatal") == (1, {**{name: 0 for name in AER_UNCORRECTABLE_NAMES}, "DLP": 1})
    assert oct(os.stat(path).st_mode & 0o777) == "0o444"
    node = SimNode(sources.state_dir, "n1")
    node.gpu_reset("4")
    assert probe_aer(sources.sysfs_root, ["00000000:9A:00.0"]).device("00000000:9A:00.0").totals["fatal"] == 1
    node.reboot()
    assert probe_aer(sources.sysfs_root, ["00000000:9A:00.0"]).device("00000000:9A:00.0").totals["fatal"] == 0
    node.inject([("gpu.4.aer.enabled", False)])
    assert not os.path.exists(path)


def test_aer_growth_shows_on_the_second_run(tmp_path):
    state = tmp_path / "state"
    cfg = make_config(hardware=HARDWARE["H100"], state_dir=str(state), tiers={"health": AER_CHECKS})
    path = "h100-healthy.toml"
    first = run_checks(cfg, "n1", "health", sources=sim(state, path), now=1_000_000.0, commit=True)
    assert first.findings == [] and first.facts.aer.device("00000000:18:00.0").totals["correctable"] == 0
    SimNode(str(state), "n1").inject([("gpu.1.aer.correctable", 500), ("gpu.5.aer.nonfatal", 1),
                                      ("gpu.2.aer.correctable", 100)])
    second = run_checks(cfg, "n1", "health", sources=sim(state, path), now=1_000_600.0, commit=True)
    assert sorted((f.check, f.gpu, f.action) for f in second.findings) == [
        ("gpu.pcie.aer_correctable_rate", 1, "warn"), ("gpu.pcie.aer_nonfatal", 5, "drain")]
    # Two hours on, nothing new: growth is over; the one non-fatal error is within its total.
    third = run_checks(cfg, "n1", "health", sources=sim(state, path), now=1_000_600.0 + 7200, commit=True)
    assert third.findings == []


@pytest.mark.parametrize("name,check,gpu", [("h100-aer-fatal.toml", "gpu.pcie.aer_fatal", 4),
                                            ("h100-aer-nonfatal.toml", "gpu.pcie.aer_nonfatal", 6)])
def test_the_aer_profiles_drain_their_one_gpu_without_any_expectation(tmp_path, name, check, gpu):
    cfg = make_config(tiers={"health": AER_CHECKS})
    report = run_checks(cfg, "n1", "health", sources=sim(tmp_path, name))
    assert [(f.check, f.gpu, f.action) for f in report.findings] == [(check, gpu, "drain")]


def test_new_drains_are_confirmed_and_resumed_as_the_docs_say():
    """docs/configuration.md [health]: a fatal AER error and a slowdown rate drain at once; only a
    reboot clears the AER counters, so a fatal one resumes after a reboot."""
    from healthcheck.actions.decision import Policy
    from healthcheck.config import Config
    from healthcheck.health.policy import HealthPolicy

    cfg = Config.from_document({}, None)
    health = HealthPolicy.from_config(cfg)
    assert health.confirm("gpu.pcie.aer_fatal") == health.confirm("gpu.clock_events.rate") == 1
    assert health.confirm("gpu.pcie.aer_nonfatal") == health.confirm_runs == 2
    policy = cfg.typed(Policy)
    assert policy.resume_mode("gpu.pcie.aer_fatal") == "after_reboot"
    assert policy.resume_mode("gpu.pcie.aer_nonfatal") == policy.resume_mode("gpu.clock_events.rate") == "auto"
