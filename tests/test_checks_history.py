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
    real = module.read_state_bytes
    monkeypatch.setattr(module, "read_state_bytes", lambda *a, **k: calls.append(1) or real(*a, **k))
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


# -- the hook server's parsed copies (counters/history.py: PARSED, refresh) -----------------------
@pytest.fixture
def kept(tmp_path, monkeypatch):
    """A history of one series on disk, kept parsed as the hook server keeps it; PARSED and READ
    are this test's own."""
    from healthcheck.counters import history

    monkeypatch.setattr(history, "PARSED", {})
    monkeypatch.setattr(history, "SEEN", {})
    monkeypatch.setattr(history, "READ", [])
    store = CounterHistory(str(tmp_path), "gpu1")
    store.record({"k": (1.0, 3600.0)}, now=100.0)
    assert history.refresh([store.path]) == 1
    return history, store


def _marked(history, store):
    """Swap the kept series for a marker, under the same bytes: a load that returns the marker
    took the kept copy; one that returns the file's series read the file."""
    raw = history.PARSED[store.path][0]
    history.PARSED[store.path] = (raw, {"marker": [[1.0, 2.0]]})


def test_a_kept_copy_is_used_while_the_file_holds_the_bytes_it_was_parsed_from(kept):
    history, store = kept
    _marked(history, store)
    assert CounterHistory(os.path.dirname(store.dir), "gpu1").load() == {"marker": [[1.0, 2.0]]}
    assert history.READ == [store.path]                      # the server is told which file was read


def test_a_kept_copy_of_a_rewritten_file_is_not_used(kept):
    history, store = kept
    from healthcheck.safeio.fsutil import atomic_write

    _marked(history, store)
    atomic_write(store.path, json.dumps({"version": 1, "series": {"k": [[100.0, 1.0], [200.0, 2.0]]}}), mode=0o640)
    assert CounterHistory(os.path.dirname(store.dir), "gpu1").load() == {"k": [[100.0, 1.0], [200.0, 2.0]]}


def test_a_kept_copy_of_a_file_replaced_by_one_of_the_same_size_and_time_is_not_used(kept):
    history, store = kept
    _marked(history, store)
    info = os.stat(store.path)
    with open(store.path, "rb") as handle:
        text = handle.read().replace(b"[100.0,1.0]", b"[100.0,7.0]")
    assert len(text) == info.st_size
    with open(store.path + ".new", "wb") as handle:
        handle.write(text)
    os.chmod(store.path + ".new", 0o640)
    os.replace(store.path + ".new", store.path)
    os.utime(store.path, ns=(info.st_atime_ns, info.st_mtime_ns))     # same size, same mtime
    assert CounterHistory(os.path.dirname(store.dir), "gpu1").load() == {"k": [[100.0, 7.0]]}


def test_a_kept_copy_of_a_removed_file_or_one_behind_a_link_is_not_used(kept, tmp_path):
    history, store = kept
    _marked(history, store)
    os.rename(store.path, tmp_path / "elsewhere.json")
    assert CounterHistory(os.path.dirname(store.dir), "gpu1").load() == {}
    os.symlink(tmp_path / "elsewhere.json", store.path)              # the very bytes, through a link
    assert CounterHistory(os.path.dirname(store.dir), "gpu1").load() == {}
    assert history.refresh([store.path]) == 0 and store.path not in history.PARSED


def test_the_server_keeps_a_corrupt_history_unparsed_and_leaves_it_to_its_writer(kept):
    history, store = kept
    with open(store.path, "w") as handle:
        handle.write('{"version": 1, "series": {"k": [["x", 1]]}}')
    assert history.refresh([store.path]) == 0 and store.path not in history.PARSED
    assert os.path.exists(store.path) and not os.path.exists(store.path + ".corrupt")
    assert CounterHistory(os.path.dirname(store.dir), "gpu1").load() == {}     # the run sets it aside
    assert os.path.exists(store.path + ".corrupt")


def test_a_load_of_a_kept_copy_does_not_change_the_copy(kept):
    history, store = kept
    before = json.dumps(history.PARSED[store.path][1])
    loaded = CounterHistory(os.path.dirname(store.dir), "gpu1")
    loaded.load()["k"].append([1.0, 1.0])
    loaded.record({"k": (5.0, 3600.0)}, now=300.0)
    assert json.dumps(history.PARSED[store.path][1]) == before


def _counting_reads(history, monkeypatch):
    """The paths ``refresh`` reads (``read_state_bytes``, the real one, called through a tally)."""
    reads = []
    real = history.read_state_bytes

    def read(path):
        reads.append(path)
        return real(path)

    monkeypatch.setattr(history, "read_state_bytes", read)
    return reads


def test_the_servers_idle_refresh_does_not_read_an_unchanged_history_again(kept, monkeypatch):
    history, store = kept
    reads = _counting_reads(history, monkeypatch)
    assert history.refresh([store.path]) == 0 and history.refresh([store.path]) == 0
    assert reads == [] and store.path in history.PARSED                 # kept, not read twice a second
    store.record({"k": (2.0, 3600.0)}, now=200.0)                        # a run wrote it: read, parsed
    del reads[:]                                                         # (the run's own read)
    assert history.refresh([store.path]) == 1 and reads == [store.path]
    assert history.PARSED[store.path][1] == {"k": [[100.0, 1.0], [200.0, 2.0]]}
    os.chmod(store.path, 0o646)                                          # not ours to trust any more
    assert history.refresh([store.path]) == 0 and store.path not in history.PARSED
    assert reads == [store.path] * 2


def test_a_change_the_servers_stat_misses_leaves_the_kept_copy_unused_never_stale(kept, monkeypatch):
    """Correctness never rests on the stat: a child compares the bytes."""
    history, store = kept
    _marked(history, store)
    with open(store.path, "r+b") as handle:                              # same size, same inode
        text = handle.read().replace(b"[100.0,1.0]", b"[100.0,7.0]")
        handle.seek(0)
        handle.write(text)
    history.SEEN[store.path] = history._stat_identity(store.path)       # as if the lstat had not changed
    reads = _counting_reads(history, monkeypatch)
    assert history.refresh([store.path]) == 0 and reads == []
    assert CounterHistory(os.path.dirname(store.dir), "gpu1").load() == {"k": [[100.0, 7.0]]}
