"""``scontrol show node -o`` as Slurm 22.05.8 prints it (captured from the lab), read by the CLI
backend: state flags, the reason, who set it and when."""
from __future__ import annotations

import os

import pytest

from healthcheck.slurm.cli_backend import CliBackend, parse_scontrol_record

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "slurm")


def node_from(name: str):
    with open(os.path.join(FIXTURES, f"scontrol-show-node-{name}.txt"), encoding="utf-8") as handle:
        line = handle.read().splitlines()[0]
    return CliBackend()._node_from_fields(parse_scontrol_record(line))


@pytest.mark.parametrize("fixture, state, flags, drained, down, responding", [
    ("idle", "IDLE", ["IDLE"], False, False, True),
    ("allocated", "MIXED", ["MIXED"], False, False, True),
    ("drained_ours", "IDLE+DRAIN", ["IDLE", "DRAIN"], True, False, True),
    ("draining_ours", "MIXED+DRAIN", ["MIXED", "DRAIN"], True, False, True),
    ("down_admin", "DOWN", ["DOWN"], False, True, True),
    ("fail", "IDLE+FAIL", ["IDLE", "FAIL"], False, False, True),
    ("maint", "IDLE+MAINTENANCE+RESERVED", ["IDLE", "MAINTENANCE", "RESERVED"], False, False, True),
    ("drained_not_responding", "IDLE+DRAIN+NOT_RESPONDING", ["IDLE", "DRAIN", "NOT_RESPONDING"], True, False, False),
])
def test_state_and_flags(fixture, state, flags, drained, down, responding):
    node = node_from(fixture)
    assert (node.state, node.flags, node.drained, node.down, node.responding) == (state, flags, drained, down, responding)


def test_our_reason_is_split_from_who_set_it_and_when():
    node = node_from("drained_ours")
    assert node.name == "gpu1"
    assert node.reason == "gpu-hooks: v1 kernel.xid gpu5 xid:79; Xid 79 (GPU fell off the bus) on GPU 5"
    assert (node.reason_user, node.reason_time) == ("root", "2026-11-30T14:43:09")


def test_an_admin_reason_with_commas_stays_whole():
    node = node_from("drained_admin")
    assert (node.name, node.reason, node.reason_user) == ("gpu2", "disk replaced, ticket 4711", "root")


def test_a_node_without_reason_has_an_empty_one():
    node = node_from("idle")
    assert (node.reason, node.reason_user, node.reason_time) == ("", "", "")


def test_sinfo_short_state_star_means_not_responding():
    from healthcheck.slurm.backend import NodeInfo

    assert NodeInfo("gpu1", "drained*").flags == ["NOT_RESPONDING", "DRAINED"]
    assert not NodeInfo("gpu1", "DOWN*").responding and NodeInfo("gpu1", "DOWN*").down


def test_every_node_of_a_cluster_listing(tmp_path):
    with open(os.path.join(FIXTURES, "scontrol-show-node-all.txt"), encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    nodes = [CliBackend()._node_from_fields(parse_scontrol_record(line)) for line in lines]
    assert [(n.name, n.state, n.reason_user) for n in nodes] == [
        ("gpu1", "IDLE+DRAIN", "root"), ("gpu2", "IDLE+DRAIN", "root"), ("gpu3", "IDLE", "")]


def test_sinfo_json_gives_flags_who_and_when_as_epoch():
    import json

    from healthcheck.slurm.cli_backend import node_from_sinfo

    with open(os.path.join(FIXTURES, "sinfo-json-two-drained.json"), encoding="utf-8") as handle:
        doc = json.load(handle)
    nodes = {item["name"]: node_from_sinfo(item) for item in doc["nodes"]}
    assert nodes["gpu1"].state == "IDLE+DRAIN" and nodes["gpu1"].drained
    assert nodes["gpu1"].reason.startswith("gpu-hooks: v1 kernel.xid gpu5 xid:79")
    assert (nodes["gpu1"].reason_user, nodes["gpu1"].reason_epoch) == ("root", 1796049789.0)
    assert nodes["gpu1"].partitions == ["low", "high"]
    assert nodes["gpu2"].reason == "disk replaced, ticket 4711" and not nodes["gpu3"].drained
    with open(os.path.join(FIXTURES, "sinfo-json-drained-not-responding.json"), encoding="utf-8") as handle:
        gpu2 = node_from_sinfo(json.load(handle)["nodes"][1])
    assert gpu2.state == "IDLE+DRAIN+NOT_RESPONDING" and not gpu2.responding


def test_scontrol_reason_time_and_partitions():
    node = node_from("drained_ours")
    assert node.partitions == ["low", "high"]
    import time

    assert node.reason_epoch == time.mktime(time.strptime("2026-11-30T14:43:09", "%Y-%m-%dT%H:%M:%S"))
