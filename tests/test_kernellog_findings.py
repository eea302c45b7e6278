"""Events -> Findings: status and action from the mapped action, the GPU named, evidence kept."""
from __future__ import annotations

import io
from types import SimpleNamespace

from healthcheck.config import Config
from healthcheck.kernellog.api import scan_events
from healthcheck.xid.event_findings import xid_findings

GPUS = [SimpleNamespace(index=0, uuid="GPU-aaaa", pci_bus_id="00000000:18:00.0"),
        {"index": 3, "uuid": "GPU-dddd", "pci_bus_id": "00000000:5D:00.0"}]


def events_of(text: str):
    return scan_events("-", stream=io.BytesIO(text.encode())).events


def test_actions_become_status_and_drain():
    events = events_of(
        "1700000000.0 n kernel: NVRM: Xid (PCI:0000:5d:00): 79, pid=42, name=python, GPU has fallen off the bus.\n"
        "1700000000.1 n kernel: NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.\n"
        "1700000001.0 n kernel: NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable double bit error (DBE)\n"
        "1700000002.0 n kernel: NVRM: Xid (PCI:0000:18:00): 31, pid=7, name=a.out, MMU Fault\n"
        "1700000003.0 n kernel: NVRM: Xid (PCI:0000:18:00): 43, pid=7, name=a.out, Ch 00000008\n"
        "1700000004.0 n kernel: NVRM: Xid (PCI:0000:18:00): 999, something new\n"
        "1700000005.0 n kernel: nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up\n")
    findings = {(finding.check, finding.evidence["code"]): finding for finding in xid_findings(events, GPUS)}
    assert set(findings) == {("kernel.xid", 79), ("kernel.xid", 48), ("kernel.xid", 31), ("kernel.xid", 999),
                             ("kernel.sxid", 20034)}                     # 43 is "ignore": no finding
    lost = findings[("kernel.xid", 79)]
    assert (lost.status, lost.action, lost.gpu, lost.uuid, lost.pci_bus_id) == (
        "fail", "drain", 3, "GPU-dddd", "00000000:5D:00.0")
    # The Xid 79 line and its "fallen off the bus" line are one fall, one finding.
    assert lost.evidence["count"] == 1 and lost.evidence["kind"] == ["fallen_off_bus", "xid"]
    assert lost.evidence["mnemonic"] == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert lost.evidence["first_seen"] == 1700000000.0 and lost.evidence["pids"] == [42]
    assert "GPU 3" in lost.message and "reboot" in lost.message
    assert (findings[("kernel.xid", 48)].status, findings[("kernel.xid", 48)].gpu) == ("fail", 0)
    assert (findings[("kernel.xid", 31)].status, findings[("kernel.xid", 31)].action) == ("ok", "none")
    assert findings[("kernel.xid", 999)].evidence["xid_action"] == "contact_support"
    switch = findings[("kernel.sxid", 20034)]
    assert (switch.status, switch.action, switch.gpu) == ("fail", "drain", None)
    assert switch.evidence["device"] == "nvidia-nvswitch0" and switch.evidence["severity"] == "Fatal"


def test_counts_and_times_of_a_flood_are_evidence():
    events = events_of("".join(f"{1700000000 + i}.0 n kernel: NVRM: Xid (PCI:0000:18:00): 95, pid=9, Uncontained\n"
                               for i in range(300)))
    [finding] = xid_findings(events, GPUS)
    assert finding.evidence["count"] == 300 and "x300" in finding.message
    assert (finding.evidence["first_seen"], finding.evidence["last_seen"]) == (1700000000.0, 1700000299.0)


def test_config_actions_can_soften_the_drain():
    events = events_of("NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n")
    config = Config.from_document({"actions": {"kernel.xid": "warn"}}, None)
    [finding] = xid_findings(events, GPUS, config)
    assert (finding.status, finding.action) == ("fail", "warn")
    [default] = xid_findings(events, GPUS, Config.from_document({}, None))
    assert default.action == "drain"


def test_without_gpu_facts_the_address_still_names_the_gpu():
    [finding] = xid_findings(events_of("NVRM: Xid (PCI:0000:18:00): 48, DBE\n"))
    assert finding.gpu is None and finding.pci_bus_id == "0000:18:00" and "0000:18:00" in finding.message


def test_xid_154_findings_take_the_strongest_recovery_action():
    events = events_of(
        "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)\n"
        "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x2 (Node Reboot Required)\n")
    assert [event.recovery_action for event in events] == [1, 2]
    [finding] = xid_findings(events, GPUS)
    assert finding.evidence["xid_action"] == "reboot" and finding.evidence["recovery_action"] == 2
