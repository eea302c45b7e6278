"""Helpers shared by the check, probe and CLI tests: expected hardware per simulated node
type, configs built from it, and simulated nodes on a temp state dir."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from healthcheck.checklist import CHECKS
from healthcheck.checks.base import CheckInput
from healthcheck.config import Config
from healthcheck.sources import sim_sources

from .conftest import SIM_PROFILES

# The [[nodes]] entry that describes each shipped profile's hardware (keyed by NVML name).
HARDWARE: Dict[str, Dict[str, Any]] = {
    # PCIe cards without a bridge: no NVLink expectation at all (before "A100": first match wins).
    "A100 80GB PCIe": dict(gpus=4, gpu_model="A100", nvswitch_fabric=False,
                           ib_ports=["mlx5_0:1", "mlx5_1:1"], ib_rate_gbps=200,
                           ib_link_layer="InfiniBand", power_limit_w=300),
    # GB200 before B200 (a GB200's name holds "B200"): a compute tray of an NVL72 rack.
    "GB200": dict(gpus=4, gpu_model="GB200", nvlinks_per_gpu=18, nvswitch_fabric=True,
                  ib_ports=[f"mlx5_{i}:1" for i in range(4)], ib_rate_gbps=400,
                  ib_link_layer="InfiniBand", power_limit_w=1200, imex_owned=True),
    "B200": dict(gpus=8, gpu_model="B200", nvlinks_per_gpu=18, nvswitch_fabric=True,
                 ib_ports=[f"mlx5_{i}:1" for i in range(8)], ib_rate_gbps=400,
                 ib_link_layer="InfiniBand", power_limit_w=1000),
    "H100": dict(gpus=8, gpu_model="H100", nvlinks_per_gpu=18, nvswitch_fabric=True,
                 ib_ports=[f"mlx5_{i}:1" for i in range(8)], ib_rate_gbps=400,
                 ib_link_layer="InfiniBand", power_limit_w=700),
    "A100": dict(gpus=8, gpu_model="A100", nvlinks_per_gpu=12, nvswitch_fabric=False,
                 ib_ports=[f"mlx5_{i}:1" for i in range(8)], ib_rate_gbps=200,
                 ib_link_layer="InfiniBand", power_limit_w=400),
    "L40S": dict(gpus=4, gpu_model="L40S", nvlinks_per_gpu=0, nvswitch_fabric=False,
                 ib_ports=["mlx5_0:1", "mlx5_1:1"], ib_rate_gbps=200, ib_link_layer="Ethernet",
                 roce_gid_index=3, power_limit_w=350),
    "V100": dict(gpus=8, gpu_model="V100", nvlinks_per_gpu=6, nvswitch_fabric=False,
                 ib_ports=[f"mlx5_{i}:1" for i in range(4)], ib_rate_gbps=100,
                 ib_link_layer="InfiniBand", power_limit_w=300),
}

# Every check the simulator feeds by reading (DCGM needs a real dcgmi; ib.bandwidth runs the
# ib_write_bw stand-in, a few seconds per node: its profiles ask for it by name).
PERFTEST_CHECKS = ["ib.bandwidth"]
ALL_SIM_CHECKS = [cid for cid in CHECKS if cid != "dcgm.diag" and cid not in PERFTEST_CHECKS]


def hardware_for(gpu_name: str) -> Dict[str, Any]:
    return next(dict(entry) for model, entry in HARDWARE.items() if model in gpu_name)


# The probe deadline of a test that expects every GPU to answer: far above what a loaded CI host
# (the unit tests run beside the lab tests of other releases) takes to start the probe child and ask NVML, so a slow
# host is never read as a hang. A test that wants a hang names its short deadline (HANG_TIMEOUT_S).
ANSWER_TIMEOUT_S = 20.0
HANG_TIMEOUT_S = 1.0
# One hung GPU among siblings that answer: they must answer in the deadline's first half
# (probe_health.LONE_HANG_ANSWERED_WITHIN), which a loaded host's probe child does in 2 s, not in 0.5.
LONE_HANG_TIMEOUT_S = 4.0


def make_config(node: str = "n1", hardware: Optional[Dict[str, Any]] = None, timeout_s: float = ANSWER_TIMEOUT_S,
                state_dir: Optional[str] = None, **sections: Any) -> Config:
    doc: Dict[str, Any] = {"gpu": {"probe_timeout_s": timeout_s}}
    if state_dir:
        doc["paths"] = {"state_dir": state_dir}
    if hardware is not None:
        doc["nodes"] = [dict(match=node, **hardware)]
    doc.update(sections)
    return Config.from_document(doc, None)


def sim(tmp_path, profile: str, node: str = "n1"):
    path = profile if os.path.isabs(profile) else os.path.join(SIM_PROFILES, profile)
    return sim_sources(node, str(tmp_path), path)


def default_input(**facts: Any) -> CheckInput:
    """A CheckInput with the built-in thresholds and actions and the given facts."""
    cfg = Config.from_document({}, None)
    facts.setdefault("node", "n1")
    return CheckInput(thresholds=cfg.section("thresholds"), actions=cfg.section("actions"), **facts)
