"""The simulator's stand-in for perftest's ``ib_write_bw``: same arguments, same output format,
the bandwidth a profile gives the port (``ib.<hca>:<port>.write_bw_gbps``; negative: 96% of its
rate). The server side prints its header and returns at once; the client prints the result
table. A port that is not ACTIVE fails as perftest does. ``SimNode`` renders a small launcher
``<sim>/bin/ib_write_bw`` that calls ``main`` with the node's live profile."""
from __future__ import annotations

import sys
from typing import List, Optional

from ..facts import parse_numbered, parse_rate
from ..safeio import tomlio

HEALTHY_SHARE = 0.96
RULE = "-" * 87


def _option(argv: List[str], name: str, default: Optional[str] = None) -> Optional[str]:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def _positional(argv: List[str]) -> Optional[str]:
    takes_value = {"-d", "-i", "-p", "-D", "-s", "-q", "-x", "-n", "-m"}
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in takes_value:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def main(argv: List[str], live_profile: str) -> int:
    hca, port = _option(argv, "-d", "mlx5_0"), int(_option(argv, "-i", "1") or 1)
    size, qps = int(_option(argv, "-s", "65536") or 65536), int(_option(argv, "-q", "1") or 1)
    gbits = "--report_gbits" in argv
    profile = tomlio.load_file(live_profile)
    entry = next((p for p in profile.get("ib", []) if p.get("hca") == hca and int(p.get("port", 1)) == port), None)
    if entry is None:
        print(f" Couldn't find device {hca} port {port}", file=sys.stderr)
        return 1
    state, _ = parse_numbered(str(entry.get("state", "")))
    layer = entry.get("link_layer", "InfiniBand")
    print(RULE)
    print(" " * 20 + "RDMA_Write BW Test")
    print(f" Dual-port       : OFF\t\tDevice         : {hca}")
    print(f" Number of qps   : {qps}\t\tTransport type : IB")
    print(" Connection type : RC\t\tUsing SRQ      : OFF")
    print(" TX depth        : 128")
    print(" CQ Moderation   : 100")
    print(" Mtu             : 4096[B]")
    print(f" Link type       : {'Ethernet' if layer == 'Ethernet' else 'IB'}")
    print(" Max inline data : 0[B]")
    print(" rdma_cm QPs\t : OFF")
    print(" Data ex. method : Ethernet")
    print(RULE)
    if state != 4:
        print(f" Port {port} of {hca} is not ACTIVE", file=sys.stderr)
        print(" Couldn't create IB resources", file=sys.stderr)
        return 1
    if _positional(argv) is None:
        return 0        # the server side: the client prints the results
    rate = parse_rate(str(entry.get("rate", ""))) or 0.0
    measured = float(entry.get("write_bw_gbps", -1.0))
    gbps = rate * HEALTHY_SHARE if measured < 0 else measured
    value, unit = (gbps, "Gb/sec") if gbits else (gbps * 1e9 / 8 / 0x100000, "MB/sec")
    rate_mpps = gbps * 1e9 / 8 / size / 1e6
    print(f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]")
    print(f" {size:<10d} {0:<13d}  {0:.2f}               {value:.2f}               {rate_mpps:.6f}")
    print(RULE)
    return 0
