"""Counter growth over a window, and the per-node history kept for it in the state dir."""
from __future__ import annotations

import json
import os
import stat

import pytest

from healthcheck.counters.growth_rate import append_sample, growth
from healthcheck.counters.history import CounterHistory


def test_first_sighting_has_no_growth():
    assert growth([], 10, now=100.0, window_s=60) is None


def test_growth_inside_the_window_uses_the_oldest_sample_in_it():
    series = [[0.0, 0.0], [50.0, 10.0], [90.0, 20.0]]
    assert growth(series, 30, now=100.0, window_s=60) == (20.0, 50.0)   # baseline: the sample at t=50


def test_growth_measured_over_more_than_the_window_is_pro_rated():
    delta, span = growth([[0.0, 0.0]], 100, now=400.0, window_s=100)
    assert (delta, span) == (25.0, 400.0)


def test_a_counter_that_went_down_was_reset():
    assert growth([[0.0, 500.0]], 7, now=10.0, window_s=100) == (7.0, 10.0)


def test_flat_runs_keep_their_two_ends_and_resets_start_over():
    series = []
    for t in range(10):
        series = append_sample(series, float(t), 0.0, window_s=1000)
    assert series == [[0.0, 0.0], [9.0, 0.0]]
    series = append_sample(series, 10.0, 5.0, window_s=1000)
    series = append_sample(series, 11.0, 1.0, window_s=1000)
    assert series == [[11.0, 1.0]]


def test_old_samples_go_except_the_newest_before_the_window():
    series = [[0.0, 1.0], [10.0, 2.0], [20.0, 3.0]]
    series = append_sample(series, 100.0, 4.0, window_s=50)
    assert series == [[20.0, 3.0], [100.0, 4.0]]


def test_history_round_trip_mode_and_pruning(tmp_path):
    store = CounterHistory(str(tmp_path), "gpu1")
    store.record({"a": (1, 60.0), "b": (5, 60.0)}, now=0.0)
    store.record({"a": (3, 60.0)}, now=100.0)         # b unseen for longer than any window: dropped
    assert store.load() == {"a": [[0.0, 1.0], [100.0, 3.0]]}
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o640
    assert json.load(open(store.path))["version"] == 1


def test_history_refuses_a_symlink_and_odd_node_names(tmp_path):
    store = CounterHistory(str(tmp_path), "gpu1")
    os.makedirs(store.dir)
    target = tmp_path / "elsewhere.json"
    target.write_text('{"series": {"x": [[0, 1]]}}')
    os.symlink(target, store.path)
    assert store.load() == {}                          # a link is not ours: a new baseline
    store.record({"a": (1, 60.0)}, now=0.0)
    assert not os.path.islink(store.path)              # the link itself was replaced...
    assert target.read_text() == '{"series": {"x": [[0, 1]]}}'   # ...its target never written
    with pytest.raises(ValueError):
        CounterHistory(str(tmp_path), "../etc")


def test_a_corrupt_history_file_is_a_new_baseline(tmp_path):
    store = CounterHistory(str(tmp_path), "gpu1")
    os.makedirs(store.dir)
    open(store.path, "w").write("{not json")
    assert store.load() == {}


def test_a_runs_commit_reads_the_history_again_only_when_another_writer_replaced_it(tmp_path, monkeypatch):
    from healthcheck.counters import history as module
    from healthcheck.counters.history import CounterHistory

    calls = []
    real = module.read_state_json
    monkeypatch.setattr(module, "read_state_json", lambda *a, **k: calls.append(1) or real(*a, **k))
    CounterHistory(str(tmp_path), "n1").record({"gpu.0.ecc": (1, 3600.0)}, 100.0)
    mine = CounterHistory(str(tmp_path), "n1")
    loaded = mine.load()
    loaded["gpu.0.ecc"].append([1.0, 99.0])              # the caller's copy: not what is saved
    calls.clear()
    mine.record({"gpu.0.ecc": (2, 3600.0)}, 200.0)
    assert calls == []                                   # the file it loaded is still there
    assert CounterHistory(str(tmp_path), "n1").load()["gpu.0.ecc"] == [[100.0, 1.0], [200.0, 2.0]]
    mine.load()
    CounterHistory(str(tmp_path), "n1").record({"gpu.0.ecc": (3, 3600.0)}, 300.0)   # another run's commit
    from healthcheck.counters.growth_rate import add_samples

    expected = add_samples(CounterHistory(str(tmp_path), "n1").load(), {"gpu.0.ecc": (4, 3600.0)}, 400.0)
    calls.clear()
    mine.record({"gpu.0.ecc": (4, 3600.0)}, 400.0)
    assert calls == [1]                                  # the other run's file, read and checked
    assert CounterHistory(str(tmp_path), "n1").load() == expected
