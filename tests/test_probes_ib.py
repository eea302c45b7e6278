"""The InfiniBand/RoCE sysfs probe on the simulator's tree and on hand-built oddities."""
from __future__ import annotations

import os

from healthcheck.facts import parse_numbered, parse_rate
from healthcheck.probes.ib_sysfs import ib_facts, probe_ib, start_ib_probe

from .checks_support import sim


def test_ndr_ports_from_the_simulated_tree(tmp_path):
    facts = probe_ib(sim(tmp_path, "h100-healthy.toml").sysfs_root)
    assert [p.name for p in facts.ports] == [f"mlx5_{i}:1" for i in range(8)]
    port = facts.port("mlx5_4", 1)
    assert (port.state, port.state_text, port.phys_state, port.phys_state_text) == (4, "ACTIVE", 5, "LinkUp")
    assert (port.rate_gbps, port.link_layer, port.numa_node) == (400.0, "InfiniBand", 1)
    assert port.counters["symbol_error"] == 0 and port.gid_types == {}


def test_roce_ports_read_their_gid_types(tmp_path):
    port = probe_ib(sim(tmp_path, "pcie-l40s-healthy.toml").sysfs_root).port("mlx5_1", 1)
    assert port.link_layer == "Ethernet"
    assert port.gid_types == {0: "IB/RoCE v1", 1: "RoCE v2", 2: "IB/RoCE v1", 3: "RoCE v2"}


def test_no_pma_counter_and_missing_class_dir(tmp_path):
    root = sim(tmp_path, "h100-healthy.toml").sysfs_root
    path = os.path.join(root, "class/infiniband/mlx5_0/ports/1/counters/symbol_error")
    os.unlink(path)
    open(path, "w").write("N/A (no PMA)\n")
    assert probe_ib(root).port("mlx5_0", 1).counters["symbol_error"] is None
    assert probe_ib(str(tmp_path / "no-sysfs")).ports == []


def test_parsers():
    assert parse_numbered("4: ACTIVE") == (4, "ACTIVE")
    assert parse_numbered("5: LinkUp\n") == (5, "LinkUp")
    assert parse_numbered("weird") == (None, "weird")
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate("N/A") is None


def test_probe_under_a_deadline_returns_the_same_facts(tmp_path):
    root = sim(tmp_path, "h100-healthy.toml").sysfs_root
    facts = ib_facts(start_ib_probe(root, 5.0))
    assert facts.status == "ok" and len(facts.ports) == 8 and facts.timeout_s == 5.0
