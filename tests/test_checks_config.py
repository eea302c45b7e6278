"""Check ids, thresholds and tiers are data: the defaults are complete and config typos are caught."""
from __future__ import annotations

import os
import re

import pytest

from healthcheck import checks
from healthcheck.checklist import CHECKS, FINDING_IDS, PROBE_FINDINGS
from healthcheck.config import TIERS, Config, ConfigError, builtin_defaults

from .conftest import ROOT

DOC = open(os.path.join(ROOT, "docs", "checks.md"), encoding="utf-8").read()


def test_every_check_has_a_default_action_and_every_tier_is_known():
    defaults = builtin_defaults()
    ours = set(defaults["actions"])
    assert ours == set(FINDING_IDS)
    assert set(defaults["tiers"]) == set(TIERS)
    for tier, ids in defaults["tiers"].items():
        ours = set(ids)
        assert ours and ours <= set(CHECKS), tier
    assert set(defaults["tiers"]["health"]) & set(CHECKS) | {"dcgm.diag", "ib.bandwidth", "gpu.processes"} \
        == set(CHECKS)
    for deep_only in ("dcgm.diag", "ib.bandwidth"):    # they run programs for seconds to minutes
        assert deep_only in defaults["tiers"]["deep"], deep_only
        assert deep_only not in defaults["tiers"]["prolog"] + defaults["tiers"]["health"], deep_only


def test_every_check_function_and_sampler_exists():
    for spec in CHECKS.values():
        assert callable(checks.judge(spec))
        assert spec.samples is None or callable(checks.sampler(spec))


def test_every_check_and_threshold_is_documented():
    for check_id in FINDING_IDS:
        assert re.search(rf"^#+ `{re.escape(check_id)}`", DOC, re.M), f"docs/checks.md lacks a section for {check_id}"
    for name in builtin_defaults()["thresholds"]:
        assert f"`{name}`" in DOC, f"docs/checks.md does not mention threshold {name}"


def test_each_checks_default_action_is_stated_in_its_section():
    """docs/checks.md is where a check's default action is documented (docs/configuration.md
    points there): each section's **Default action** is the built-in one."""
    actions = builtin_defaults()["actions"]
    for check_id in FINDING_IDS:
        section = re.search(rf"^#+ `{re.escape(check_id)}`\n(.*?)(?=^#|\Z)", DOC, re.M | re.S)
        stated = re.search(r"\*\*Default action\*\* `(\w+)`", section.group(1)) if section else None
        assert stated and stated.group(1) == actions[check_id], check_id


@pytest.mark.parametrize("doc,line", [
    ({"actions": {"gpu.eccc": "drain"}}, '(built-in): actions."gpu.eccc": unknown check id; one of '),
    ({"tiers": {"prolog": ["gpu.count", "nvlink.dwn"]}}, "(built-in): tiers.prolog[1]: unknown check id 'nvlink.dwn'; one of "),
    ({"thresholds": {"temperature_margin": 3}}, "(built-in): thresholds.temperature_margin: unknown threshold; one of "),
])
def test_unknown_ids_and_thresholds_are_one_line_errors(doc, line):
    with pytest.raises(ConfigError) as caught:
        Config.from_document(doc, None)
    [only] = caught.value.lines()
    assert only.startswith(line)


def test_probe_findings_take_actions_but_are_not_tier_entries():
    Config.from_document({"actions": {"probe.timeout": "warn"}}, None)
    with pytest.raises(ConfigError, match="tiers.health\\[0\\]: unknown check id 'probe.timeout'"):
        Config.from_document({"tiers": {"health": ["probe.timeout"]}}, None)
    assert set(PROBE_FINDINGS) == {"probe.timeout", "probe.error", "check.error"}


def test_admin_overrides_merge_over_the_defaults():
    cfg = Config.from_document({"actions": {"gpu.pcie": "drain"}, "thresholds": {"temperature_margin_c": 2},
                                "tiers": {"prolog": ["gpu.count"]}}, None)
    assert cfg.action("gpu.pcie") == "drain" and cfg.action("gpu.lost") == "drain"
    assert cfg.threshold("temperature_margin_c") == 2 and cfg.threshold("power_limit_min_pct") == 95
    assert cfg.tier("prolog") == ["gpu.count"]


def test_kernel_log_ids_are_known_check_ids():
    cfg = Config.from_document({"actions": {"kernel.xid": "drain"}, "tiers": {"health": ["gpu.lost", "kernel.xid"]}},
                               None)
    assert cfg.action("kernel.xid") == "drain" and "kernel.xid" in cfg.tier("health")
