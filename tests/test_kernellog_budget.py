"""A read budget: a flood of distinct Xid lines is read in bounded pieces, each run going on
from where the last one stopped, and what a read did not get to is reported, never dropped
silently."""
from __future__ import annotations

import os
import tempfile

from healthcheck.config import Config
from healthcheck.kernellog import kmsg, logfiles, readers
from healthcheck.kernellog.api import read_new_events, scan_events
from healthcheck.kernellog.flood import MAX_GROUPS
from healthcheck.kernellog.scanner import CHUNK, LineScanner
from healthcheck.runner import run_checks
from healthcheck.sim.node import SimNode

from .checks_support import hardware_for, make_config, sim

NOISE = "[ 100.000000] eth0: link up, 100Gbps, flow control rx/tx {n}\n"


def distinct_xids(count, start=0):
    """``count`` Xid lines that are all distinct events: code and PCI address vary."""
    lines = []
    for n in range(start, start + count):
        code = (13, 31, 43, 45, 62)[n % 5]
        bus, device = divmod(n // 5, 32)
        lines.append(f"[ 200.{n:06d}] NVRM: Xid (PCI:{bus // 256:04x}:{bus % 256:02x}:{device:02x}): {code}, "
                     f"pid={n}, name=python, flood {n}\n")
    return "".join(lines)


def keys(events):
    return {(e.code, e.pci) for e in events}


def read_all(log, state, config=None, runs=10):
    """Read and commit until a read gets to the end; every read's events and capped texts."""
    seen, capped = [], []
    for _ in range(runs):
        read = read_new_events(str(log), state, "gpu1", config=config)
        read.commit()
        seen.append(read.events)
        capped.append(read.capped)
        if read.capped is None:
            break
    return seen, capped


def test_more_distinct_events_than_a_read_keeps_are_read_over_several_runs(tmp_path):
    total = 2 * MAX_GROUPS + 500
    log = tmp_path / "kern.log"
    log.write_text(distinct_xids(total))
    seen, capped = read_all(log, str(tmp_path / "state"))
    assert [len(events) for events in seen] == [MAX_GROUPS, MAX_GROUPS, 500]
    assert capped[0].startswith("the read stopped early: more than 10000 new distinct events in one read")
    assert capped[-1] is None
    every = [key for events in seen for key in keys(events)]
    assert len(every) == len(set(every)) == total        # nothing lost, nothing twice


def test_a_byte_budget_stops_at_a_line_and_the_next_run_goes_on(tmp_path):
    config = Config.from_document({"xid": {"read_budget_bytes": 1024 * 1024, "rescan_bytes": 64 * 1024 * 1024}}, None)
    log = tmp_path / "kern.log"
    per_part = 20000
    with open(log, "w") as handle:          # ~5 MiB: noise with Xids all through it
        for part in range(4):
            handle.write("".join(NOISE.format(n=n) for n in range(per_part)))
            handle.write(distinct_xids(50, start=part * 50))
    assert os.path.getsize(log) > 4 * 1024 * 1024
    seen, capped = read_all(log, str(tmp_path / "state"), config)
    assert len(seen) >= 3
    assert all("read budget of 1048576 bytes ([xid] read_budget_bytes) was spent" in text for text in capped[:-1])
    every = [key for events in seen for key in keys(events)]
    assert len(every) == len(set(every)) == 200


def test_a_time_budget_stops_after_the_first_chunk_that_moved_the_cursor():
    fed = []
    scanner = LineScanner(lambda line: fed.append(line))
    data = (NOISE.format(n=0) * (3 * CHUNK // len(NOISE))).encode()
    with tempfile.NamedTemporaryFile() as handle:
        handle.write(data)
        handle.flush()
        fd = os.open(handle.name, os.O_RDONLY)
        try:
            logfiles._feed_range(fd, 0, len(data), scanner, readers.Budget(max_seconds=0.0))
        finally:
            os.close(fd)
    assert scanner.stopped == "the read budget of 0 s ([xid] read_budget_s) was spent"
    assert scanner.stats.bytes_read == CHUNK and 0 < scanner.consumed <= CHUNK


def test_kmsg_reads_resume_at_the_record_where_they_stopped(tmp_path, monkeypatch):
    fake = tmp_path / "kmsg"
    monkeypatch.setattr(readers, "KMSG", str(fake))
    monkeypatch.setattr(kmsg, "boot_id", lambda: "boot-1")
    records = []
    for n, line in enumerate(distinct_xids(MAX_GROUPS + 300).splitlines(), start=1):
        text = line.split("] ", 1)[1]
        records.append(f"4,{n},{5_000_000 + n},-;{text}\n")
    fake.write_text("".join(records))
    seen, capped = read_all("kmsg", str(tmp_path / "state"))
    assert [len(events) for events in seen] == [MAX_GROUPS, 300]
    assert capped[0].startswith("the read stopped early") and capped[1] is None


def test_a_one_shot_scan_reports_what_it_did_not_keep(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(distinct_xids(MAX_GROUPS + 7))
    scan = scan_events(str(log))
    assert len(scan.events) == MAX_GROUPS
    assert scan.capped == "7 events past the first 10000 distinct ones were not kept"
    assert scan.capped in scan.stats.problems


def test_the_health_check_says_a_read_stopped_early_and_drains_nothing_for_it(tmp_path):
    state = tmp_path / "state"
    cfg = make_config(hardware=hardware_for("H100"), state_dir=str(state), tiers={"health": ["kernel.xid"]},
                      xid={"actions": {"13": "ignore", "31": "ignore", "43": "ignore", "45": "ignore", "62": "ignore"}})
    sources_ = sim(state, "h100-healthy.toml")
    SimNode(str(state), "n1").inject([], distinct_xids(MAX_GROUPS + 10).splitlines())
    report = run_checks(cfg, "n1", "health", sources=sources_, commit=True)
    [finding] = report.findings
    assert (finding.check, finding.status, finding.action) == ("kernel.xid", "warn", "none")
    assert "the read stopped early" in finding.message and finding.evidence["capped"]
    assert run_checks(cfg, "n1", "health", sources=sources_, commit=True).findings == []


def test_a_read_stopped_in_a_rotated_file_goes_on_there_then_in_the_new_one(tmp_path):
    config = Config.from_document({"xid": {"read_budget_bytes": 1024 * 1024, "rescan_bytes": 64 * 1024 * 1024}}, None)
    log, state = tmp_path / "kern.log", str(tmp_path / "state")
    log.write_text(distinct_xids(1))
    first = read_new_events(str(log), state, "gpu1", config=config)
    first.commit()
    with open(log, "a") as handle:          # > 2 chunks appended, then the file rotates
        handle.write("".join(NOISE.format(n=n) for n in range(80000)) + distinct_xids(3, start=1))
    os.rename(log, str(log) + ".1")
    log.write_text(distinct_xids(2, start=4))
    seen, capped = read_all(log, state, config)
    assert len(seen) >= 2 and capped[-1] is None
    assert "read budget" in capped[0] and seen[0] == []   # stopped in the noise of kern.log.1
    every = [key for events in seen for key in keys(events)]
    assert len(every) == len(set(every)) == 5
