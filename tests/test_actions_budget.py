"""The cluster budget (healthcheck/actions/budget.py): pure, on node lists as Slurm gives them."""
from __future__ import annotations

from healthcheck.actions.budget import Budget, keeps_its_drain, limit, over_budget
from healthcheck.slurm.backend import NodeInfo

from .conftest import builtin_settings

NOW = 1_800_000_000.0
PREFIX = "gpu-hooks:"
OURS = "gpu-hooks: v1 gpu.ecc.uncorrectable gpu3 dbe:2; GPU 3"


def node(name, state="IDLE", reason="", at=None, partitions=("low",)):
    return NodeInfo(name=name, state=state, reason=reason, reason_user="root" if reason else "",
                    reason_epoch=at, partitions=list(partitions))


def cluster(drained_ours=0, size=10, admin=1):
    nodes = []
    for index in range(size):
        name = f"gpu{index + 1}"
        if index < drained_ours:
            nodes.append(node(name, "IDLE+DRAIN", OURS, at=NOW - 60 * (index + 1)))
        elif index < drained_ours + admin:
            nodes.append(node(name, "IDLE+DRAIN", "admin: PSU", at=NOW - 60))
        else:
            nodes.append(node(name))
    return nodes


def test_under_budget_drains():
    assert over_budget(cluster(drained_ours=0), "gpu9", builtin_settings(Budget, max_nodes=1, max_fraction=0), PREFIX, NOW) is None


def test_a_budget_of_one_node_refuses_the_second_and_names_the_first():
    why = over_budget(cluster(drained_ours=1), "gpu9", builtin_settings(Budget, max_nodes=1, max_fraction=0), PREFIX, NOW)
    assert why is not None and "gpu1" in why and "at most 1" in why


def test_admin_drains_do_not_count():
    assert over_budget(cluster(drained_ours=0, admin=5), "gpu9", builtin_settings(Budget, max_nodes=1, max_fraction=0), PREFIX, NOW) is None


def test_drains_older_than_the_window_do_not_count():
    nodes = [node("gpu1", "IDLE+DRAIN", OURS, at=NOW - 7200), node("gpu2")]
    assert over_budget(nodes, "gpu2", builtin_settings(Budget, max_nodes=1, max_fraction=0, window_s=3600), PREFIX, NOW) is None


def test_the_fraction_counts_nodes_sharing_a_partition_and_allows_at_least_one():
    nodes = cluster(size=20, admin=0) + [node(f"cpu{i}", partitions=("cpu",)) for i in range(80)]
    policy = builtin_settings(Budget, max_nodes=0, max_fraction=0.1)
    assert limit(nodes, "gpu1", policy) == 2
    assert limit(cluster(size=3, admin=0), "gpu1", policy) == 1


def test_a_disabled_budget_never_blocks():
    assert over_budget(cluster(drained_ours=9), "gpu10", builtin_settings(Budget, enabled=False), PREFIX, NOW) is None


def test_concurrent_drains_the_earliest_keeps_its_place():
    nodes = [node("gpu1", "IDLE+DRAIN", OURS, at=NOW), node("gpu2", "IDLE+DRAIN", OURS, at=NOW),
             node("gpu3", "IDLE+DRAIN", OURS, at=NOW - 1)]
    policy = builtin_settings(Budget, max_nodes=1, max_fraction=0)
    assert [keeps_its_drain(nodes, name, policy, PREFIX, NOW) for name in ("gpu1", "gpu2", "gpu3")] == [False, False, True]
    policy2 = builtin_settings(Budget, max_nodes=2, max_fraction=0)
    assert [keeps_its_drain(nodes, name, policy2, PREFIX, NOW) for name in ("gpu1", "gpu2", "gpu3")] == [True, False, True]
