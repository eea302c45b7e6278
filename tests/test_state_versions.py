"""A rollback: state files and records written by a newer version (a larger format version)
are left exactly as they are by today's code: never rewritten, never set aside as corrupt,
never a drain, never a traceback; the health check says so in one line and exits 0. Files of
the current format without a version key (format 1, as earlier releases wrote some) still load."""
from __future__ import annotations

import json
import os

import pytest

from healthcheck.actions import ledger as ledgers
from healthcheck.actions import state as node_state
from healthcheck.counters.history import CounterHistory
from healthcheck.kernellog.cursor import StateStore
from healthcheck.records import store
from healthcheck.safeio.fsutil import NewerFormat

from .test_healthcheck_program import inject, program, write_config

NODE = "gpu1"


def newer(path: str, key: str = "version", **rest) -> bytes:
    """A file as a future version would write it: format 2, in a shape today's schema refuses."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = json.dumps(dict({key: 2, "shape": ["of", "a", "future"]}, **rest)).encode()
    with open(path, "wb") as handle:
        handle.write(body)
    os.chmod(path, 0o640)
    return body


def left_alone(path: str, body: bytes) -> None:
    with open(path, "rb") as handle:
        assert handle.read() == body
    assert not os.path.exists(path + ".corrupt")


def test_a_newer_health_state_is_left_alone(tmp_path):
    path = node_state.state_path(str(tmp_path), NODE)
    body = newer(path)
    with pytest.raises(NewerFormat, match="format 2 of a newer slurm-gpu-hooks"):
        node_state.load(str(tmp_path), NODE)
    assert node_state.load(str(tmp_path), NODE, read_only=True) == node_state.NodeState()   # the watcher
    left_alone(path, body)


def test_a_newer_remediation_ledger_is_left_alone(tmp_path):
    path = ledgers.ledger_path(str(tmp_path), NODE)
    body = newer(path)
    with pytest.raises(NewerFormat):
        ledgers.load(str(tmp_path), NODE)
    left_alone(path, body)


def test_a_newer_counter_history_is_left_alone_and_a_record_of_it_writes_nothing(tmp_path):
    history = CounterHistory(str(tmp_path), NODE)
    body = newer(history.path, series=[1, 2, 3])
    with pytest.raises(NewerFormat):
        history.load()
    with pytest.raises(NewerFormat):
        history.record({"gpu/x/ecc": (1.0, 3600.0)}, 1000.0)
    left_alone(history.path, body)


def test_newer_kernel_log_cursors_and_flood_state_are_left_alone(tmp_path):
    states = StateStore(str(tmp_path), NODE)
    states.save_cursor("file", "/var/log/kern.log", {"offset": 10, "ino": 1, "dev": 2,
                                                     "tail_sha256": "0" * 64})
    cursor_path = states.cursor_path("file", "/var/log/kern.log")
    body = newer(cursor_path, source="/var/log/kern.log")
    with pytest.raises(NewerFormat):
        states.load_cursor("file", "/var/log/kern.log")
    left_alone(cursor_path, body)
    flood = os.path.join(states.dir, "flood.json")
    flood_body = newer(flood)
    with pytest.raises(NewerFormat):
        states.load_flood()
    left_alone(flood, flood_body)


def test_a_cursor_of_an_earlier_release_without_a_version_still_loads(tmp_path):
    states = StateStore(str(tmp_path), NODE)
    cursor = {"offset": 10, "ino": 1, "dev": 2, "tail_sha256": "0" * 64}
    states.save_cursor("file", "/var/log/kern.log", cursor)
    path = states.cursor_path("file", "/var/log/kern.log")
    with open(path, encoding="utf-8") as handle:
        saved = json.load(handle)
    assert saved.pop("version") == 1
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(saved, handle)                                  # as the previous release wrote it
    loaded = states.load_cursor("file", "/var/log/kern.log")
    assert loaded is not None and loaded["offset"] == 10


def test_a_newer_job_record_is_not_replaced(tmp_path):
    path = store.record_path(str(tmp_path), "42", NODE)
    body = newer(path, key="v", job_id="42", node=NODE)
    with pytest.raises(NewerFormat):
        store.write_record(str(tmp_path), {"job_id": "42", "node": NODE, "class": "COMPLETED"})
    left_alone(path, body)


def test_the_health_check_after_a_rollback_keeps_checking_and_writes_nothing_over_the_newer_state(tmp_path):
    """It judges and acts as a node with no state would (one line says why each run), and the
    newer version finds its file as it left it."""
    config = write_config(tmp_path)
    path = node_state.state_path(str(tmp_path / "state"), NODE)
    body = newer(path)
    done = program("--config", config, "--node", NODE)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "format 2 of a newer slurm-gpu-hooks" in lines[0] and "keeps no state" in lines[0], lines
    assert "Traceback" not in done.stderr
    left_alone(path, body)
    inject(config, "gpu.3.ecc.volatile_uncorrected=2")
    done = program("--config", config, "--node", NODE, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["decision"] == "drain"          # a real fault still drains
    left_alone(path, body)
