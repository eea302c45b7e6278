"""The lab's stateless boot (slurm_hooks/lab/stateless.py), without the lab: a reboot removes
the node's own state entries and nothing else: not its simulated hardware, not another node's
(gpu10's files when gpu1 reboots), and never through a link."""
from __future__ import annotations

import os

from healthcheck import compiled
from slurm_hooks.lab import stateless


def test_a_reboot_forgets_the_nodes_own_state_only(tmp_path):
    keep = ["sim/gpu1/state.json", "health/gpu10.json", "outbox/77.gpu10.json", "jobs/77/gpu2.json",
            "counters/.gpu10.lock", "retention.stamp"]
    gone = ["health/gpu1.json", "health/gpu1.last.json", "remediate/gpu1.json", "remediate/.gpu1.lock",
            "counters/gpu1.json", "kernellog/gpu1/cursor", "kernellog/gpu1.watch", "outbox/77.gpu1.json",
            "jobs/77/gpu1.json", "jobs/77/gpu1.baseline.json", "hook-runs/gpu1.jsonl", "actions/.gpu1.decide.lock"]
    for name in keep + gone:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    outside = tmp_path.parent / "outside-gpu1.json"
    outside.write_text("keep me")
    os.symlink(outside, tmp_path / "health" / "gpu1.link.json")
    removed = stateless.forget_node(str(tmp_path), "gpu1")
    expected = {name.split("/cursor")[0] for name in gone} | {"health/gpu1.link.json"}     # a directory: whole
    assert sorted(os.path.relpath(p, tmp_path) for p in removed) == sorted(expected)
    assert not any(os.path.lexists(tmp_path / name) for name in gone)
    assert all((tmp_path / name).exists() for name in keep)
    assert outside.read_text() == "keep me"


def test_the_runtime_dir_emptied_is_the_hooks_compiled_config_cache():
    assert stateless.RUNTIME_DIRS == (compiled.CACHE_DIR,)
