"""Floods are counted, not re-reported; repeats escalate per config; state carries across runs."""
from __future__ import annotations

import io

from healthcheck.config import Config
from healthcheck.kernellog.api import read_new_events, scan_events
from healthcheck.xid.catalog import XidCatalog
from healthcheck.xid.events import XidEvent
from healthcheck.kernellog.flood import EscalationRule, FloodTracker
from healthcheck.kernellog.parser import parse_line
from healthcheck.kernellog.timestamps import PrefixClock

XID95 = "{stamp} gpu001 kernel: [{up:.6f}] NVRM: Xid (PCI:0000:5d:00): 95, pid=2371, Uncontained: FBHUB. RST: Yes\n"


def read_and_commit(*args, **kwargs):
    """A hook's whole cycle: read, then commit (nothing acts in between here)."""
    read = read_new_events(*args, **kwargs)
    read.commit()
    return read


def stamped(epoch: float, code: int = 13, pci: str = "0000:3b:00") -> bytes:
    return (f"{epoch:.6f} gpu001 kernel: NVRM: Xid (PCI:{pci}): {code}, pid=1, name=python, "
            f"Graphics SM Warp Exception\n").encode()


def test_a_flood_of_identical_lines_is_one_event_with_a_count():
    line = b"[ 8812.332117] NVRM: Xid (PCI:0000:5d:00): 95, pid=2371, Uncontained: FBHUB. RST: Yes, D-RST: No\n"
    result = scan_events("-", stream=io.BytesIO(line * 200_000))
    assert [(event.code, event.count, event.action) for event in result.events] == [(95, 200_000, "reset_gpu")]
    assert result.stats.events == 200_000


def test_flood_lines_with_changing_timestamps_fold_too():
    data = b"".join(stamped(1_700_000_000 + index * 0.01, code=95) for index in range(20_000))
    events = scan_events("-", stream=io.BytesIO(data)).events
    assert len(events) == 1 and events[0].count == 20_000
    assert events[0].first_seen == 1_700_000_000 and round(events[0].last_seen, 2) == 1_700_000_199.99


def test_different_gpus_codes_and_mig_instances_stay_apart():
    data = (stamped(1e9, 13) * 3 + stamped(1e9, 13, "0000:5d:00") + stamped(1e9, 31)
            + b"NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 13, pid=1, name=x, y\n")
    events = scan_events("-", stream=io.BytesIO(data)).events
    assert [(event.code, event.pci, event.gpu_instance, event.count) for event in events] == [
        (13, "0000:3b:00", None, 3), (13, "0000:5d:00", None, 1), (31, "0000:3b:00", None, 1), (13, "0000:3b:00", 1, 1)]


def test_a_repeat_after_the_window_is_a_new_event():
    data = stamped(1e9) + stamped(1e9 + 100) + stamped(1e9 + 4000)
    events = scan_events("-", stream=io.BytesIO(data)).events
    assert [event.count for event in events] == [2, 1]


def test_sxid_detail_lines_belong_to_their_header():
    data = (b"nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 12028, Non-fatal, Link 35 egress non-posted PRIV error (First)\n"
            b"nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 12028, Severity 0 Engine instance 35 Sub-engine instance 00\n"
            b"nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 12028, Data {0x00000000, 0x00000000}\n")
    events = scan_events("-", stream=io.BytesIO(data)).events
    assert [(event.code, event.count, event.severity) for event in events] == [(12028, 1, "Non-fatal")]


def tracker_with_rule(count=5, window_s=3600, burst_s=60, action="reset_gpu"):
    return FloodTracker(3600, {"13": EscalationRule(count, window_s, action, burst_s)})


def feed(tracker, epochs, code=13):
    catalog = XidCatalog()
    for epoch in epochs:
        tracker.add(catalog.classify(parse_line(stamped(epoch, code).rstrip(b"\n"), PrefixClock())))


def test_repeated_xid13_on_one_gpu_escalates():
    tracker = tracker_with_rule()
    feed(tracker, [1e9 + minute * 300 for minute in range(4)])
    assert tracker.events()[0].action == "job"
    feed(tracker, [1e9 + 1500])
    event = tracker.events()[0]
    assert event.action == "reset_gpu" and "escalated" in event.action_source and event.count == 5


def test_one_burst_of_lines_is_one_occurrence():
    tracker = tracker_with_rule()
    feed(tracker, [1e9 + second for second in range(50)])      # one crash prints many lines
    assert tracker.events()[0].action == "job"


def test_occurrences_spread_wider_than_the_window_do_not_escalate():
    tracker = tracker_with_rule(window_s=600)
    feed(tracker, [1e9 + index * 500 for index in range(6)])
    assert all(event.action == "job" for event in tracker.events())


def test_escalation_rules_do_not_touch_other_codes():
    tracker = tracker_with_rule(count=1)
    feed(tracker, [1e9], code=31)
    assert tracker.events()[0].action == "job"


def test_floods_and_escalation_carry_across_health_check_runs(tmp_path):
    log = tmp_path / "kern.log"
    state = str(tmp_path / "state")
    now = 1_700_000_000.0
    config = Config.from_document({"xid": {"escalate": {"13": {"count": 3, "window_s": 3600, "action": "reboot"}}}}, None)
    log.write_bytes(stamped(now) * 1000)
    first = read_and_commit(str(log), state, "gpu1", config=config, now=now + 1)
    assert [(event.count, event.count_new, event.action) for event in first.events] == [(1000, 1000, "job")]
    with open(log, "ab") as handle:
        handle.write(stamped(now + 120) * 500)
    second = read_and_commit(str(log), state, "gpu1", config=config, now=now + 121)
    assert [(event.count, event.count_new, event.action) for event in second.events] == [(1500, 500, "job")]
    with open(log, "ab") as handle:
        handle.write(stamped(now + 300))
    third = read_and_commit(str(log), state, "gpu1", config=config, now=now + 301)
    assert [(event.count, event.action) for event in third.events] == [(1501, "reboot")]
    # After the window the event is no longer active, and the state file stays small.
    later = read_and_commit(str(log), state, "gpu1", config=config, now=now + 301 + 3601)
    assert later.events == [] and later.active == []
    assert (tmp_path / "state" / "kernellog" / "gpu1" / "flood.json").stat().st_size < 2000


def test_tracker_memory_is_bounded():
    tracker = FloodTracker(3600, max_groups=100)
    catalog = XidCatalog()
    for code in range(1, 400):
        tracker.add(catalog.classify(parse_line(stamped(1e9, code).rstrip(b"\n"))))
    assert len(tracker.events()) == 100 and tracker.dropped == 299


def test_the_flood_shortcut_gives_what_parsing_every_line_gives():
    """Lines that repeat the previous kernel text skip the parser; the result must not change."""
    import random

    pool = [
        b"NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
        b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
        b"NVRM: Xid (PCI:0000:3b:00): 95, pid=2371, Uncontained: FBHUB.",
        b"nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
        b"nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Data {0x0}",
        b"NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Graphics Exception",
    ]
    prefixes = [b"", b"[ 12.5] ", b"1700000000.5 n kernel: ", b"1700000100.5 n kernel: [ 13.0] ",
                b"1700000000.5 n alice: ", b"junk "]
    rng = random.Random(5)
    lines = []
    for _ in range(3000):
        if lines and rng.random() < 0.7:
            body = lines[-1][1]
        else:
            body = rng.choice(pool)
        lines.append((rng.choice(prefixes), body))
    data = b"".join(prefix + body + b"\n" for prefix, body in lines)
    fast = scan_events("-", stream=io.BytesIO(data)).events
    reference = FloodTracker(3600, {})
    catalog, clock = XidCatalog(), PrefixClock()
    for prefix, body in lines:
        event = parse_line(prefix + body, clock)
        if isinstance(event, XidEvent):
            reference.add(catalog.classify(event))
    shape = lambda events: [(e.kind, e.code, e.pci, e.count, e.first_seen, e.last_seen) for e in events]  # noqa: E731
    assert shape(fast) == shape(reference.events()) and len(fast) > 3
