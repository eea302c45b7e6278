"""Corrupt state heals: a state file that does not match its schema is set aside as
``<name>.corrupt`` (kept for the admin), said once on stderr, and rebuilt; never a traceback,
never a probe error on every later run."""
from __future__ import annotations

import glob
import json
import os
import time

import pytest

from healthcheck.counters.history import CounterHistory
from healthcheck.kernellog.api import read_new_events
from healthcheck.runner import run_checks

from .checks_support import hardware_for, make_config, sim

STAMP = time.strftime("%b %d %H:%M:%S", time.localtime(time.time()))
XID48 = STAMP + " gpu001 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=77, name=python, DBE (0x0000000b).\n"


def _setup(tmp_path):
    log, state = tmp_path / "kern.log", str(tmp_path / "state")
    log.write_text(XID48)
    first = read_new_events(str(log), state, "gpu1")
    first.commit()
    [cursor] = glob.glob(os.path.join(state, "kernellog", "gpu1", "cursor-file-*.json"))
    return log, state, cursor


def _heals(capsys, path, written, read_again):
    """The damaged file is moved aside with its content, said once, and the state rebuilt."""
    with open(path, "w") as handle:
        handle.write(written)
    capsys.readouterr()
    result = read_again()
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and f"state file {path} is unusable" in said and "starting afresh" in said
    assert open(path + ".corrupt").read() == written
    assert "Traceback" not in said
    again = read_again()                                 # rebuilt: nothing said a second time
    assert capsys.readouterr().err == ""
    return result, again


CURSOR_OFFSETS = ["null", "[]", "{}", "Infinity", "NaN", '"abc"', "-5", "1.5", "true"]


@pytest.mark.parametrize("offset", CURSOR_OFFSETS)
def test_a_cursor_with_a_bad_offset_heals(tmp_path, capsys, offset):
    log, state, cursor = _setup(tmp_path)
    doc = json.load(open(cursor))
    text = json.dumps(doc).replace(f'"offset": {doc["offset"]}', f'"offset": {offset}')
    assert offset in text

    def read_again():
        read = read_new_events(str(log), state, "gpu1")
        read.commit()
        return read

    healed, again = _heals(capsys, cursor, text, read_again)
    assert healed.rescan == "no cursor yet" and [e.code for e in healed.events] == [48]
    assert again.rescan is None and again.events == []  # the rebuilt cursor is used


@pytest.mark.parametrize("whole", ["[]", "{}", '"abc"', "NaN", "5", "{not json", '{"source": 5}'])
def test_a_cursor_file_that_is_not_a_cursor_heals(tmp_path, capsys, whole):
    log, state, cursor = _setup(tmp_path)

    def read_again():
        read = read_new_events(str(log), state, "gpu1")
        read.commit()
        return read

    healed, _ = _heals(capsys, cursor, whole, read_again)
    assert healed.rescan == "no cursor yet"


@pytest.mark.parametrize("flood", ['{"events": 5}', '{"events": [5]}', '{"bursts": 5}',
                                   '{"events": [{"kind": "xid", "code": "x", "pci": null, "message": ""}]}',
                                   '{"events": [{"kind": "xid", "code": 48, "pci": null, "message": "", '
                                   '"last_seen": NaN}]}',
                                   '{"bursts": {"xid|13|p": {"starts": [null], "last": 1}}}',
                                   '{"uuids": {"0000:3b:00": 7}}', "[]"])
def test_a_bad_flood_state_heals(tmp_path, capsys, flood):
    log, state, _ = _setup(tmp_path)
    path = os.path.join(state, "kernellog", "gpu1", "flood.json")
    with open(log, "a") as handle:
        handle.write(XID48.replace("pid=77", "pid=78"))

    def read_again():
        read = read_new_events(str(log), state, "gpu1")
        read.commit()
        return read

    healed, _ = _heals(capsys, path, flood, read_again)
    assert [e.code for e in healed.events] == [48]
    assert json.load(open(path))["events"]              # rebuilt with this run's event


@pytest.mark.parametrize("value", ["null", "{}", "[]", '"x"', "NaN", "1e999", "true"])
def test_counter_values_that_are_not_numbers_heal(tmp_path, capsys, value):
    store = CounterHistory(str(tmp_path), "gpu1")
    store.record({"gpu/GPU-1/ecc": (1, 60.0)}, now=0.0)
    written = '{"version": 1, "series": {"gpu/GPU-1/ecc": [[0, %s]]}}' % value
    healed, _ = _heals(capsys, store.path, written, store.load)
    assert healed == {}
    store.record({"gpu/GPU-1/ecc": (2, 60.0)}, now=10.0)
    assert store.load() == {"gpu/GPU-1/ecc": [[10.0, 2.0]]}


@pytest.mark.parametrize("series", ['{"series": 5}', '{"series": {"k": 5}}', '{"series": {"k": [[1, 2, 3]]}}', "[]"])
def test_a_history_that_is_not_series_heals(tmp_path, capsys, series):
    store = CounterHistory(str(tmp_path), "gpu1")
    store.record({"k": (1, 60.0)}, now=0.0)
    healed, _ = _heals(capsys, store.path, series, store.load)
    assert healed == {}


def test_the_runner_rebuilds_a_corrupt_history_without_an_error_finding(tmp_path, capsys):
    state = tmp_path / "state"
    cfg = make_config(hardware=hardware_for("H100"), state_dir=str(state), tiers={"health": ["ib.counters"]})
    run_checks(cfg, "n1", "health", sources=sim(state, "h100-healthy.toml"), commit=True)
    path = state / "counters" / "n1.json"
    path.write_text('{"series": {"ib/mlx5_0:1/symbol_error": [[0, null]]}}')
    for _ in range(2):
        report = run_checks(cfg, "n1", "health", sources=sim(state, "h100-healthy.toml"), commit=True)
        assert report.findings == []
    assert (state / "counters" / "n1.json.corrupt").exists()
    assert capsys.readouterr().err.count("is unusable") == 1


def test_a_link_or_foreign_file_is_left_alone(tmp_path, capsys):
    """Not ours: neither trusted nor moved (the next save replaces the link itself)."""
    store = CounterHistory(str(tmp_path), "gpu1")
    os.makedirs(store.dir)
    target = tmp_path / "elsewhere.json"
    target.write_text("{not json")
    os.symlink(target, store.path)
    assert store.load() == {}
    assert os.path.islink(store.path) and not os.path.exists(store.path + ".corrupt")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kind, good, bad", [
    ("kmsg", {"boot_id": "b-1", "seq": 41}, [{"seq": None}, {"seq": "abc"}, {"seq": -2}, {"boot_id": 5}]),
    ("journal", {"cursor": "s=abc;i=1"}, [{"cursor": 5}, {"cursor": []}]),
    ("file", {"dev": 1, "ino": 2, "offset": 3, "tail_sha256": "ab"}, [{"ino": 1.5}, {"tail_sha256": None},
                                                                     {"mid_line": "yes"}]),
])
def test_every_cursor_kind_has_a_schema(kind, good, bad):
    from healthcheck.kernellog.cursor import cursor_problem

    assert cursor_problem(kind, dict(good, source="x")) is None
    for change in bad:
        assert cursor_problem(kind, dict(good, source="x", **change)) is not None, change
    assert cursor_problem(kind, dict(good)) == "'source' is missing"
