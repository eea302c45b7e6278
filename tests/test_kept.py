"""The reboot count kept with the node in Slurm's Extra (healthcheck/actions/kept.py): ours is one
token merged into what is there, never another tool's words lost; a JSON object keeps its keys;
the field stays short; and Slurm's node parsers read Extra and BootTime (text on 22.05, JSON on
24.11 and later; the formats measured in the lab: docs/slurm-versions.md)."""
from __future__ import annotations

import json

from hypothesis import given, strategies as st

from healthcheck.actions import kept
from healthcheck.slurm.backend import extra_argv, local_epoch
from healthcheck.slurm.cli_backend import CliBackend, node_from_json, parse_scontrol_record

SIG = "gpu.lost gpu3 GPU-8f2c1b9e-0000-4d2a-9a51-7be3c1f0a001"
DAY = 86400.0


def test_a_reboot_is_kept_after_another_tools_words_and_read_back():
    extra = kept.noting_reboot("rack=12 owner:ml", SIG, 1765000000.7, DAY)
    assert extra == f"rack=12 owner:ml sgh-reboots:{kept.key_of(SIG)}@1765000000"
    extra = kept.noting_reboot(extra, SIG, 1765000600, DAY)
    assert kept.times_for(extra, SIG) == [1765000000, 1765000600]
    assert extra.split()[:2] == ["rack=12", "owner:ml"]
    assert kept.times_for(extra, "another cause") == []


def test_a_json_object_field_gets_our_key_and_keeps_its_own():
    extra = kept.noting_reboot('{"rack": 12, "zone": "b"}', SIG, 1765000000, DAY)
    assert json.loads(extra) == {"rack": 12, "zone": "b", "sgh-reboots": f"{kept.key_of(SIG)}@1765000000"}
    assert kept.times_for(extra, SIG) == [1765000000]
    assert json.loads(kept.forgetting(extra)) == {"rack": 12, "zone": "b"}


def test_times_outside_the_window_go_and_the_field_stays_short():
    extra = ""
    for n in range(40):
        extra = kept.noting_reboot(extra, f"cause {n % 7}", 1765000000 + n * 60, DAY)
    held = kept.reboots_kept(extra)
    assert len(held) == kept.MAX_SIGNATURES and all(len(times) <= kept.MAX_TIMES for times in held.values())
    later = kept.noting_reboot(extra, SIG, 1765000000 + 2 * DAY, DAY)
    assert kept.reboots_kept(later) == {kept.key_of(SIG): [int(1765000000 + 2 * DAY)]}


def test_forgetting_one_signature_keeps_the_others_and_all_of_ours_can_go():
    extra = kept.noting_reboot(kept.noting_reboot("rack=12", SIG, 1765000000, DAY), "other", 1765000001, DAY)
    assert kept.times_for(kept.forgetting(extra, [SIG]), "other") == [1765000001]
    assert kept.times_for(kept.forgetting(extra, [SIG]), SIG) == []
    assert kept.forgetting(extra) == "rack=12"


def test_a_token_of_ours_that_is_not_well_formed_counts_nothing_and_is_replaced():
    for bad in ("sgh-reboots:", "sgh-reboots:zz@1", "sgh-reboots:abcdef01@1;rm", "sgh-reboots:abcdef01@-5"):
        assert kept.reboots_kept(f"rack=12 {bad}") == {}
        fixed = kept.noting_reboot(f"rack=12 {bad}", SIG, 1765000000, DAY)
        assert fixed == f"rack=12 sgh-reboots:{kept.key_of(SIG)}@1765000000"


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp")), min_size=1,
                        max_size=12).filter(lambda w: not w.startswith(kept.TOKEN) and not w.startswith("{")),
                max_size=5))
def test_every_word_of_another_tool_survives_a_reboot_noted_and_forgotten(words):
    extra = " ".join(words)
    noted = kept.noting_reboot(extra, SIG, 1765000000, DAY)
    assert noted.split()[:len(words)] == words
    assert kept.forgetting(noted) == extra


def test_the_argv_sets_the_whole_field_as_one_argument():
    assert extra_argv("gpu1", "rack=12 sgh-reboots:abcdef01@1") == (
        "update", "nodename=gpu1", "extra=rack=12 sgh-reboots:abcdef01@1")


def test_slurm_text_and_json_give_extra_and_boot_time():
    line = ("NodeName=gpu3 Arch=x86_64 CoresPerSocket=8 State=IDLE+DRAIN BootTime=2026-12-06T07:06:55 "
            "SlurmdStartTime=2026-12-06T07:06:56 Extra=rack12 sgh-reboots:abcdef01@1765000000 "
            "Reason=gpu-hooks: v1 gpu.lost gpu3 [root@2026-12-06T07:00:00]")
    node = CliBackend()._node_from_fields(parse_scontrol_record(line), line)
    assert node.extra == "rack12 sgh-reboots:abcdef01@1765000000"
    assert node.boot_epoch == local_epoch("2026-12-06T07:06:55") and node.boot_epoch > node.reason_epoch
    spaced = line.replace("Extra=rack12 ", "Extra=rack=12 owner=ml ")
    assert CliBackend()._node_from_fields(parse_scontrol_record(spaced), spaced).extra == \
        "rack=12 owner=ml sgh-reboots:abcdef01@1765000000"
    null = CliBackend()._node_from_fields(parse_scontrol_record("NodeName=gpu1 State=IDLE Extra=(null)"),
                                          "NodeName=gpu1 State=IDLE Extra=(null)")
    assert (null.extra, null.boot_epoch) == ("", None)
    item = {"name": "gpu3", "state": ["IDLE", "DRAIN"], "extra": "rack12 sgh-reboots:abcdef01@1765000000",
            "boot_time": {"set": True, "infinite": False, "number": 1796540981}, "reason": "x",
            "reason_changed_at": {"set": True, "infinite": False, "number": 1796540000}}
    node = node_from_json(item)
    assert (node.extra, node.boot_epoch, node.reason_epoch) == ("rack12 sgh-reboots:abcdef01@1765000000",
                                                                1796540981.0, 1796540000.0)
    assert node_from_json({"name": "gpu1", "state": ["IDLE"]}).boot_epoch is None
