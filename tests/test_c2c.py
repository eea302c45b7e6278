"""nvlink.c2c: the GPUs' NVLink-C2C links to their Grace CPU, read in the probe's child from
NVML's field values 170 (count) and 171 (per link, by scopeId) as the simulator serves them
like a driver of each branch; a link not active drains, a GPU without C2C or a driver without
the fields (R470) is never judged."""
from __future__ import annotations

import os

from healthcheck.facts import GpuFacts, NvmlFacts
from healthcheck.runner import run_checks
from healthcheck.checks.c2c import c2c_links

from .checks_support import default_input, hardware_for, make_config, sim
from .conftest import SIM_PROFILES

HEALTHY = os.path.join(SIM_PROFILES, "gb200-nvl72-healthy.toml")


def probe(tmp_path, path, tier="health"):
    cfg = make_config(hardware=hardware_for("GB200"))
    return run_checks(cfg, "n1", tier, sources=sim(tmp_path, path))


def test_the_probe_reads_each_gpus_c2c_links_and_a_gpu_without_reports_none(tmp_path):
    gpus = probe(tmp_path, HEALTHY).facts.nvml.gpus
    assert [g.c2c_links for g in gpus] == [{0: 1}] * 4 and all("c2c" not in g.unsupported for g in gpus)
    h100 = run_checks(make_config(hardware=hardware_for("H100")), "n1", "health",
                      sources=sim(tmp_path / "h100", "h100-healthy.toml")).facts.nvml.gpus
    assert [g.c2c_links for g in h100] == [{}] * 8


def test_a_link_down_fails_that_gpu_in_every_tier(tmp_path):
    for tier in ("prolog", "health"):
        report = probe(tmp_path / tier, os.path.join(SIM_PROFILES, "gb200-c2c-link-down.toml"), tier)
        assert [(f.check, f.gpu, f.action, f.evidence["down"]) for f in report.findings] == \
            [("nvlink.c2c", 2, "drain", [0])]


def test_a_driver_without_the_fields_leaves_the_links_unknown_and_judges_nothing(tmp_path):
    profile = tmp_path / "r470.toml"
    profile.write_text(f'base = "{os.path.join(SIM_PROFILES, "gb200-c2c-link-down.toml")}"\n'
                       '[node]\ndriver_version = "470.256.02"\n[expect]\nfindings = []\n')
    gpus = probe(tmp_path, str(profile)).facts.nvml.gpus
    assert all(g.c2c_links is None and "c2c" in g.unsupported for g in gpus)
    assert not [f for f in probe(tmp_path / "again", str(profile)).findings if f.check == "nvlink.c2c"]


def test_the_check_judges_only_links_the_gpu_reports():
    gpus = [GpuFacts(index=0, c2c_links={0: 1, 1: 0}), GpuFacts(index=1, c2c_links={}),
            GpuFacts(index=2, c2c_links=None), GpuFacts(index=3, c2c_links={0: 0}, state="lost")]
    findings = c2c_links(default_input(nvml=NvmlFacts(gpus=gpus, device_count=len(gpus))))
    assert [(f.gpu, f.evidence) for f in findings] == [(0, {"down": [1], "links": 2})]
    assert "link 1 to the CPU not active (1 of 2 active)" in findings[0].message


def test_a_link_count_no_gpu_has_is_an_error_read_no_further():
    """What a broken driver might answer: said as the probe's error for the fact, no loop over it."""
    import pynvml

    from healthcheck.probes import nvml as probe

    class Value:
        def __init__(self, number):
            self.nvmlReturn, self.value = pynvml.NVML_SUCCESS, type("V", (), {"uiVal": number})()

    class Nvml:
        calls = 0

        def nvmlDeviceGetFieldValues(self, handle, fields):
            self.calls += 1
            return [Value(4_000_000_000)]
    nvml, gpu = Nvml(), GpuFacts(index=0)
    probe._read_c2c(nvml, pynvml, None, gpu, lambda fact, call: call())
    assert nvml.calls == 1 and gpu.c2c_links is None and "4000000000" in gpu.errors["c2c"]
