"""Typed settings (healthcheck/config/settings.py): each default lives only in defaults.toml; a
typed section is built once per config; the module stays as cheap to import as the hooks need."""
from __future__ import annotations

import ast
import inspect
import os

import pytest

from healthcheck.actions.decision import Policy
from healthcheck.config import Config, settings
from healthcheck.config.settings import (DrainSettings, GpuSettings, PathsSettings, PerftestSettings, PrologSettings,
                                         RecordsSettings, Retention, SlurmSettings, WatchSettings, XidSettings)
from healthcheck.health.policy import HealthPolicy
from healthcheck.plain import FrozenInstanceError, asdict
from healthcheck.records.outbox import DeliverySettings
from healthcheck.safeio import tomlio

from .conftest import ROOT

SETTINGS_PY = os.path.join(ROOT, "healthcheck", "config", "settings.py")
TYPED = [kind for _, kind in inspect.getmembers(settings, inspect.isclass)
         if kind.__module__ == settings.__name__ and hasattr(kind, "__plain__")]
# Sections whose typed fields are the section's keys, one for one (same names, same values).
ONE_FOR_ONE = {"records": RecordsSettings, "retention": Retention, "prolog": PrologSettings, "slurm": SlurmSettings,
               "watch": WatchSettings, "drain": DrainSettings, "paths": PathsSettings, "gpu": GpuSettings,
               "perftest": PerftestSettings}


def shipped_defaults():
    with open(os.path.join(ROOT, "healthcheck", "data", "defaults.toml"), encoding="utf-8") as handle:
        return tomlio.loads(handle.read())


def test_the_typed_sections_are_found():
    assert len(TYPED) >= 15 and RecordsSettings in TYPED and XidSettings in TYPED


@pytest.mark.parametrize("kind", TYPED, ids=lambda kind: kind.__name__)
def test_no_typed_section_has_a_default_of_its_own(kind):
    _, defaults, factories, _, _ = kind.__plain__
    assert not defaults and not factories, f"{kind.__name__}: defaults belong in defaults.toml"


@pytest.mark.parametrize("kind", [kind for kind in TYPED if hasattr(kind, "from_config")], ids=lambda k: k.__name__)
def test_every_typed_section_reads_from_the_built_in_defaults_alone(kind):
    assert kind.from_config(Config.from_document({}, None)) == kind.from_config(Config.builtin())


@pytest.mark.parametrize("section", sorted(ONE_FOR_ONE))
def test_a_typed_section_holds_the_values_of_defaults_toml(section):
    typed = asdict(ONE_FOR_ONE[section].from_config(Config.from_document({}, None)))
    assert typed == shipped_defaults()[section]


def test_the_sections_with_tables_hold_the_values_of_defaults_toml():
    shipped, config = shipped_defaults(), Config.from_document({}, None)
    xid = XidSettings.from_config(None)
    assert (xid.flood_window_s, xid.rescan_bytes) == (shipped["xid"]["flood_window_s"], shipped["xid"]["rescan_bytes"])
    assert {code: asdict(rule) for code, rule in xid.escalate.items()} == shipped["xid"]["escalate"]
    health = config.typed(settings.HealthSettings)
    assert health.budget.max_nodes == shipped["health"]["budget_max_nodes"]
    assert health.resume_by_check == shipped["health"]["resume"]
    assert config.typed(settings.SummarySettings).offenders.ratio == shipped["summary"]["offender_ratio"]


@pytest.mark.parametrize("kind,not_settings", [
    (Policy, {"resume_by_cause"}),                      # what a recorded drain says, not the config
    (HealthPolicy, set()),
    (DeliverySettings, {"lock_wait_s", "backoff_s"}),   # waits that are no config key
])
def test_the_types_built_from_typed_sections_have_no_config_defaults(kind, not_settings):
    _, defaults, factories, _, _ = kind.__plain__
    assert set(defaults) | set(factories) == not_settings


@pytest.mark.parametrize("kind", [kind for kind in TYPED if hasattr(kind, "from_config")], ids=lambda k: k.__name__)
def test_a_typed_section_cannot_be_changed_as_every_reader_shares_it(kind):
    typed = Config.builtin().typed(kind)
    with pytest.raises(FrozenInstanceError):
        setattr(typed, kind.__plain__[0][0], None)


def test_a_site_value_reaches_the_typed_section():
    config = Config.from_document({"records": {"accounting": False, "write_attempts": 9}}, None)
    records = config.typed(RecordsSettings)
    assert (records.accounting, records.write_attempts) == (False, 9)
    assert DeliverySettings.from_config(config).attempts == 9


def test_a_typed_section_is_built_once_per_config():
    config = Config.from_document({}, None)
    assert config.typed(RecordsSettings) is config.typed(RecordsSettings)
    assert Config.from_document({}, None).typed(RecordsSettings) is not config.typed(RecordsSettings)


def test_settings_imports_only_plain_and_typing():
    # The hooks load it: no dataclasses, no inspect, nothing that costs import time.
    tree = ast.parse(open(SETTINGS_PY, encoding="utf-8").read())
    imported = {(node.level, node.module) for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert imported == {(0, "__future__"), (0, "typing"), (2, "plain")}
    assert not [node for node in tree.body if isinstance(node, ast.Import)]
