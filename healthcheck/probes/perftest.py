"""The IB bandwidth probe: perftest's ``ib_write_bw`` in loopback between this node's own ports.

Each ACTIVE port writes to the next one (a ring; a node with one port writes to itself): a
server on the next port, a client on this one connecting over 127.0.0.1 to exchange queue
pairs, then RDMA writes for ``[perftest] duration_s`` through the fabric. All pairs run
together, each on its own TCP port, every program through ``programs.run`` under
``[perftest] timeout_s``. perftest not installed -> status "unsupported", never a failure.

perftest prints one table row per message size under the header
``#bytes  #iterations  BW peak[MB/sec]  BW average[MB/sec]  MsgRate[Mpps]`` (``[Gb/sec]`` with
``--report_gbits``); MB there is 2**20 bytes and Gb is 10**9 bits (perftest's
``format_factor``: 0x100000 or 125000000 bytes).
"""
from __future__ import annotations

import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from ..safeio import programs
from ..facts import IbBandwidthFacts, IbBandwidthResult, IbPortFacts

if TYPE_CHECKING:
    from ..config.settings import PerftestSettings

# Hooks and `slurm-gpu check` may run without PATH; these are where perftest packages put it.
ACTIVE = 4
LOOPBACK = "127.0.0.1"

_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(?P<unit>[A-Za-z]+/sec)\]\s+BW average\[(?P=unit)\]")
_ROW = re.compile(r"^\s*(?P<bytes>\d+)\s+(?P<iters>\d+)\s+(?P<peak>\d+(?:\.\d+)?)\s+(?P<avg>\d+(?:\.\d+)?)"
                  r"(?:\s+(?P<rate>\d+(?:\.\d+)?))?\s*$")
# What one unit perftest prints is worth in Gb/s (10**9 bits per second).
_TO_GBPS = {"Gb/sec": 1.0, "MB/sec": 0x100000 * 8 / 1e9}


class PerftestOutputError(ValueError):
    pass


def parse_bw(text: str) -> Tuple[str, int, float, float]:
    """(unit, message bytes, BW peak, BW average) of the last table row (the largest message
    size; ``-a`` prints one row per size), values in the unit printed."""
    unit = None
    row = None
    for line in text.splitlines():
        header = _HEADER.search(line)
        if header:
            unit, row = header.group("unit"), None
            continue
        if unit is not None:
            match = _ROW.match(line)
            if match:
                row = match
    if unit is None:
        raise PerftestOutputError("no result table (#bytes #iterations BW peak ...) in ib_write_bw's output")
    if row is None:
        raise PerftestOutputError("ib_write_bw printed its table header but no result row")
    if unit not in _TO_GBPS:
        raise PerftestOutputError(f"unknown bandwidth unit {unit!r} in ib_write_bw's output")
    return unit, int(row.group("bytes")), float(row.group("peak")), float(row.group("avg"))


def to_gbps(value: float, unit: str) -> float:
    return value * _TO_GBPS[unit]


def port_name(port: IbPortFacts) -> str:
    return f"{port.hca}:{port.port}"


def plan_pairs(ports: Sequence[IbPortFacts]) -> List[Tuple[IbPortFacts, IbPortFacts]]:
    """(client, server) per ACTIVE port, in a ring over the ports sorted by name."""
    active = sorted((p for p in ports if p.state == ACTIVE), key=lambda p: (p.hca, p.port))
    if len(active) == 1:
        return [(active[0], active[0])]
    return [(port, active[(i + 1) % len(active)]) for i, port in enumerate(active)]


def gid_index(port: IbPortFacts, configured: Optional[int]) -> Optional[int]:
    """RoCE needs a GID index (``-x``): the node's configured one, else the port's first RoCE v2."""
    if port.link_layer != "Ethernet":
        return None
    if configured is not None:
        return int(configured)
    v2 = sorted(i for i, kind in port.gid_types.items() if kind.strip().lower() == "roce v2")
    return v2[0] if v2 else None


def build_argv(program: str, port: IbPortFacts, settings: PerftestSettings, tcp_port: int,
               gid: Optional[int], server: Optional[str]) -> List[str]:
    argv = [program, "-d", port.hca, "-i", str(int(port.port)), "-p", str(int(tcp_port)),
            "-D", str(settings.duration_s), "-s", str(settings.message_bytes),
            "-q", str(settings.qps), "-F", "--report_gbits"]
    if gid is not None:
        argv += ["-x", str(int(gid))]
    if server is not None:
        argv.append(server)
    return argv


def probe_ib_bandwidth(ports: Sequence[IbPortFacts], settings: PerftestSettings,
                       programs_dir: Optional[str] = None, roce_gid_index: Optional[int] = None) -> IbBandwidthFacts:
    timeout_s = settings.timeout_s
    facts = IbBandwidthFacts(timeout_s=timeout_s)
    program = programs.find_program(settings.ib_write_bw, programs_dir)
    if program is None:
        facts.status = "unsupported"
        facts.message = f"{settings.ib_write_bw} not found (perftest is not installed)"
        return facts
    facts.program = program
    pairs = plan_pairs(ports)
    if not pairs:
        facts.message = "no ACTIVE IB port to test"
        return facts
    base = settings.base_port
    runs = []
    for i, (client, server) in enumerate(pairs):
        result = IbBandwidthResult(client=port_name(client), server=port_name(server),
                                   rate_gbps=_slower(client.rate_gbps, server.rate_gbps))
        server_argv = build_argv(program, server, settings, base + i, gid_index(server, roce_gid_index), None)
        client_argv = build_argv(program, client, settings, base + i, gid_index(client, roce_gid_index), LOOPBACK)
        runs.append((result, server_argv, client_argv))
    outcome: Dict[int, Tuple[str, Any]] = {}

    def run(key: int, argv: List[str]) -> None:
        try:
            outcome[key] = ("done", programs.run(argv, timeout_s))
        except programs.CommandError as exc:
            outcome[key] = ("timeout" if exc.timed_out else "error", str(exc))

    servers = [threading.Thread(target=run, args=(2 * i, s), daemon=True) for i, (_, s, _) in enumerate(runs)]
    for thread in servers:
        thread.start()
    # perftest's client does not retry: the servers must be listening when it connects.
    time.sleep(settings.server_wait_s)
    clients = [threading.Thread(target=run, args=(2 * i + 1, c), daemon=True) for i, (_, _, c) in enumerate(runs)]
    for thread in clients:
        thread.start()
    for thread in clients + servers:
        thread.join()
    for i, (result, _, _) in enumerate(runs):
        _judge_run(result, outcome.get(2 * i + 1), outcome.get(2 * i), timeout_s)
        facts.results.append(result)
    return facts


def _judge_run(result: IbBandwidthResult, client, server, timeout_s: float) -> None:
    kind, value = client if client is not None else ("error", "the client did not run")
    if kind == "timeout":
        result.status, result.message = "timeout", f"ib_write_bw did not finish within {timeout_s:g} s"
        return
    if kind == "error":
        result.status, result.message = "error", str(value)
        return
    if value.returncode != 0:
        why = value.last_line()
        if server is not None and server[0] == "done" and server[1].returncode != 0:
            why = f"{why} (server: {server[1].last_line()})"
        result.status, result.message = "error", f"ib_write_bw exited {value.returncode}: {why}"
        return
    try:
        unit, size, peak, avg = parse_bw(value.stdout)
    except PerftestOutputError as exc:
        result.status, result.message = "error", str(exc)
        return
    result.unit, result.message_bytes = unit, size
    result.bw_peak_gbps, result.bw_avg_gbps = round(to_gbps(peak, unit), 3), round(to_gbps(avg, unit), 3)


def _slower(a: Optional[float], b: Optional[float]) -> Optional[float]:
    known = [v for v in (a, b) if v is not None]
    return min(known) if known else None
