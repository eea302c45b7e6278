"""NVIDIA's catalog as data, mapped onto our actions; overrides and escalation rules in config."""
from __future__ import annotations

import pytest

from healthcheck.config import CONFIG_SCHEMA, Config, ConfigError, builtin_defaults
from healthcheck.xid.events import XID_ACTIONS
from healthcheck.kernellog.api import XidSettings
from healthcheck.xid.catalog import XidCatalog, action_map, catalog_entries, decode_rows
from healthcheck.kernellog.parser import parse_line
from healthcheck.schema import validate


def classify(line: bytes, overrides=None):
    return XidCatalog(overrides).classify(parse_line(line))


def xid_line(code: int, text: str = "something happened") -> bytes:
    return f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=python, {text}".encode()


@pytest.mark.parametrize("code,action", [
    (79, "reboot"),            # fallen off the bus: RESTART_BM
    (48, "reset_gpu"),         # double-bit ECC: WORKFLOW_XID_48
    (31, "job"),               # MMU fault: RESTART_APP, the application's fault
    (43, "ignore"),            # GPU stopped processing: IGNORE
    (13, "job"),
    (95, "reset_gpu"),
    (94, "job"),
    (999, "contact_support"),  # not in the catalog: never ignored
    (163, "contact_support"),  # in the catalog, no action named yet
])
def test_catalog_codes_map_to_our_actions(code, action):
    event = classify(xid_line(code))
    assert event.action == action, event.action_source


def test_catalog_carries_mnemonic_and_nvidia_action():
    event = classify(xid_line(79))
    assert event.mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" and event.nvidia_action == "RESTART_BM"
    assert classify(xid_line(999)).mnemonic is None


def test_the_data_files_are_complete():
    entries = catalog_entries()
    assert len(entries) == 172 and sorted(entries) == list(range(1, 173))
    entry = entries[48]
    assert (entry.mnemonic, entry.immediate_action, entry.investigatory_action) == (
        "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", "WORKFLOW_XID_48")
    mapping = action_map()
    # Every bucket the catalog and the decode table use has a row in the mapping file, so no code
    # falls through to "unknown" by accident.
    used = {entry.immediate_action for entry in entries.values() if entry.immediate_action}
    assert used <= set(mapping["immediate"]), used - set(mapping["immediate"])
    decode_buckets = {row.immediate_action for rows in decode_rows().values() for row in rows}
    assert decode_buckets <= set(mapping["decode"])
    assert set(mapping["recovery"]) >= {"0", "1", "2", "3", "4"}
    assert all(item.action in XID_ACTIONS for table in mapping.values() for item in table.values())
    assert sorted(decode_rows()) == list(range(144, 151))


@pytest.mark.parametrize("value,action", [(0, "ignore"), (1, "reset_gpu"), (2, "reboot"), (3, "reset_gpu"),
                                          (4, "reset_gpu"), (5, "contact_support"), (6, "reset_gpu"),
                                          (7, "reboot")])
def test_xid_154_acts_on_the_recovery_action_in_its_text(value, action):
    line = f"NVRM: Xid (PCI:0000:04:00): 154, GPU recovery action changed from 0x0 (None) to 0x{value} (Whatever)"
    event = classify(line.encode())
    assert (event.recovery_action, event.action) == (value, action)
    assert "154 recovery action" in event.action_source


def test_xid_154_without_a_readable_action_is_contact_support():
    event = classify(b"NVRM: Xid (PCI:0000:04:00): 154, GPU recovery action changed")
    assert event.recovery_action is None and event.action == "contact_support"


@pytest.mark.parametrize("line,action", [
    # RLW_REMAP status 0x40 is RESET_GPU in the decode table (intrinfo matches the pre-R575 pattern).
    (b"NVRM: Xid (PCI:0001:00:00): 145, RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 0x00000000)",
     "reset_gpu"),
    # RLW_REMAP status 0x100 is IGNORE (R575+ pattern).
    (b"NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000100 0x00000000 0x00000000)",
     "ignore"),
    # XID_154_EVAL: the Xid 154 that follows decides; the job may crash.
    (b"NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000 0x00000000)",
     "job"),
    (b"NVRM: Xid (PCI:0000:04:00): 144, SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000002 0x00000000 0x00000000)",
     "reset_gpu"),
    # A status no row lists is read bit by bit: 0x5 = 0x1 (IGNORE) + 0x4 (IGNORE).
    (b"NVRM: Xid (PCI:0000:04:00): 144, SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000001 0x00000005 0x00000000)",
     "ignore"),
    # No row matches (unknown interrupt info): the catalog's WORKFLOW_NVLINK5_ERR -> reset_gpu.
    (b"NVRM: Xid (PCI:0000:04:00): 144, SAW_MVB Fatal XC0 i0 Link 00 (0x0000ffff 0x00000002 0x00000000)", "reset_gpu"),
    # No parenthesised words at all: the catalog.
    (b"NVRM: Xid (PCI:0000:04:00): 149, NETIR_LINK_EVT Fatal", "reset_gpu"),
])
def test_nvlink5_xids_are_refined_by_the_decode_table(line, action):
    event = classify(line)
    assert event.action == action, event.action_source


def test_decode_refinement_says_which_row_decided():
    event = classify(b"NVRM: Xid (PCI:0001:00:00): 145, RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082 0x00000040 0x0)")
    assert "decode table" in event.action_source and "RLW_REMAP" in event.action_source


def test_sxid_action_follows_severity():
    fatal = classify(b"nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up")
    minor = classify(b"nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 12028, Non-fatal, Link 47 egress PRIV error")
    assert (fatal.action, minor.action) == ("reboot", "ignore")


def test_fallen_off_bus_without_an_xid_is_code_79_and_reboot():
    event = classify(b"NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.")
    assert (event.kind, event.code, event.action) == ("fallen_off_bus", 79, "reboot")


def test_config_overrides_one_code():
    config = Config.from_document({"xid": {"actions": {"13": "reboot", "79": "job", "sxid:12028": "contact_support"}}},
                                  None)
    settings = XidSettings.from_config(config)
    assert classify(xid_line(13), settings.overrides).action == "reboot"
    assert classify(xid_line(79), settings.overrides).action_source == "config [xid] actions"
    assert classify(xid_line(31), settings.overrides).action == "job"          # others untouched
    sxid = classify(b"nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 12028, Non-fatal, Link 47", settings.overrides)
    assert sxid.action == "contact_support"


@pytest.mark.parametrize("xid,problem", [
    ({"actions": {"13": "drain"}}, "xid.actions.13"),
    ({"actions": {"thirteen": "job"}}, "xid.actions"),
    ({"escalate": {"13": {"count": 5, "window_s": 3600}}}, "xid.escalate.13.action"),
    ({"escalate": {"13": {"count": 0, "window_s": 3600, "action": "reboot"}}}, "xid.escalate.13.count"),
    ({"escalate": {"13": {"count": 5, "window_s": 3600, "action": "explode"}}}, "xid.escalate.13.action"),
    ({"escalate": {"13": {"count": 5, "window_s": 3600, "action": "reboot", "often": True}}}, "xid.escalate.13.often"),
    ({"escalate": {"13": 5}}, "xid.escalate.13"),
    ({"escalate": {"x13": {"count": 5, "window_s": 3600, "action": "reboot"}}}, "xid.escalate"),
    ({"escalate": {"13": {"count": 10**6, "window_s": 3600, "action": "reboot"}}}, "xid.escalate.13.count"),
    ({"rescan_bytes": -1}, "xid.rescan_bytes"),
])
def test_bad_xid_config_is_one_clear_problem(xid, problem):
    with pytest.raises(ConfigError) as caught:
        Config.from_document({"xid": xid}, "config.toml")
    assert any(line.startswith(f"config.toml: {problem}") for line in caught.value.lines()), caught.value.lines()


def test_shipped_defaults_are_valid_and_typed():
    assert validate(builtin_defaults(), CONFIG_SCHEMA) == []
    settings = XidSettings.from_config(None)
    assert settings.rescan_bytes == 4 * 1024 * 1024 and settings.flood_window_s == 3600
    assert settings.escalate["13"].action == "reset_gpu" and settings.escalate["13"].count == 5
