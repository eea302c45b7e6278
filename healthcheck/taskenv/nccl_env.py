"""The NCCL environment a task should get on this node: pure, facts in, ``(NAME, value)`` out.

* ``NCCL_IB_HCA``: the ACTIVE ports (of ``[[nodes]] ib_ports`` when listed) of the HCAs closest
  to the task's GPUs: the same PCIe switch first, then the same NUMA node
  (``topology.closeness``); every ACTIVE port when the task has no GPU the driver lists. The
  ``=`` prefix makes NCCL match the names exactly (``mlx5_1`` would also pick ``mlx5_10``).
* ``NCCL_IB_GID_INDEX``: when a chosen port is RoCE (link layer Ethernet), ``[[nodes]]
  roce_gid_index``, else the lowest index that is RoCE v2 on every chosen RoCE port.
* ``NCCL_SOCKET_IFNAME``: ``[nccl] socket_ifname``, else the chosen HCAs' interfaces that are up.
* ``[nccl] env``: the site's fixed settings (NCCL_IB_TIMEOUT, NCCL_NET_GDR_LEVEL, ...).

A name the task's environment already has is left out: the user's setting wins. Our own
settings are not the user's, though a task inherits them: the batch script's TaskProlog exports
them into the batch environment, and every ``srun`` in it passes that environment on to its
step's tasks, on this node and on the job's other nodes. So each export is also recorded in
``SGH_NCCL_EXPORTED`` (``NAME:crc32`` of the value we set); a name whose value still matches
that record is ours and is derived again for this task (a port that went down since, another
node's HCAs), or unset when this task gets none. A value the user changed is theirs and stays.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..config.keys import ENV_NAME, env_value_problem
from ..config.settings import NcclSettings
from ..facts import IbPortFacts
from .topology import GpuPlace, HcaPlace, closest

ACTIVE = 4
# What this tool exported into the task: "NAME:crc32,..." (see the module's docstring).
MARK = "SGH_NCCL_EXPORTED"


@dataclass
class Plan:
    """What the TaskProlog prints: ``export NAME=value`` lines, then ``unset NAME`` lines."""
    exports: List[Tuple[str, str]] = field(default_factory=list)
    unsets: List[str] = field(default_factory=list)


def task_gpus(env: Mapping[str, str]) -> Optional[List[int]]:
    """The task's GPUs as GRES indices (device minors): the step's, else the job's; None when
    the task has none (or the variable is unreadable)."""
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        text = env.get(name, "").strip()
        if text:
            try:
                return sorted({int(item) for item in text.split(",") if item.strip()})
            except ValueError:
                return None
    return None


def usable_ports(ports: Sequence[IbPortFacts], expected_ports: Optional[Iterable[str]]) -> List[IbPortFacts]:
    wanted = None
    if expected_ports is not None:
        wanted = set()
        for text in expected_ports:
            hca, _, number = str(text).partition(":")
            wanted.add((hca, int(number or 1)))
    return sorted((p for p in ports if p.state == ACTIVE and (wanted is None or (p.hca, p.port) in wanted)),
                  key=lambda p: (p.hca, p.port))


def chosen_ports(gpus: Optional[Sequence[int]], gpu_places: Mapping[int, GpuPlace],
                 hca_places: Mapping[str, HcaPlace], ports: Sequence[IbPortFacts]) -> List[IbPortFacts]:
    placed = [gpu_places[g].place for g in (gpus or []) if g in gpu_places]
    if not placed:
        return list(ports)
    candidates = [hca_places[h] for h in dict.fromkeys(p.hca for p in ports) if h in hca_places]
    near = {h.hca for place in placed for h in closest(place, candidates)}
    # Ports whose HCA has no PCI facts cannot be placed: they stay out unless nothing is placed.
    return [p for p in ports if p.hca in near] or list(ports)


def gid_index(ports: Sequence[IbPortFacts], configured: Optional[int]) -> Optional[int]:
    roce = [p for p in ports if p.link_layer == "Ethernet"]
    if not roce:
        return None
    if configured is not None:
        return int(configured)
    common = None
    for port in roce:
        v2 = {i for i, kind in port.gid_types.items() if kind.strip().lower() == "roce v2"}
        common = v2 if common is None else common & v2
    return min(common) if common else None


def wanted(gpus: Optional[Sequence[int]], ports: Sequence[IbPortFacts], gpu_places: Mapping[int, GpuPlace],
           hca_places: Mapping[str, HcaPlace], expected: Mapping, settings: NcclSettings) -> List[Tuple[str, str]]:
    """The ``(NAME, value)`` pairs this task should have, in a stable order; raises ValueError
    on a value that cannot be exported (the caller then exports nothing)."""
    out: List[Tuple[str, str]] = []
    usable = usable_ports(ports, expected.get("ib_ports"))
    chosen = chosen_ports(gpus, gpu_places, hca_places, usable)
    if chosen:
        out.append(("NCCL_IB_HCA", "=" + ",".join(f"{p.hca}:{p.port}" for p in chosen)))
        gid = gid_index(chosen, expected.get("roce_gid_index"))
        if gid is not None:
            out.append(("NCCL_IB_GID_INDEX", str(gid)))
    ifname = settings.socket_ifname
    if not ifname:
        names: Dict[str, None] = {}
        for port in chosen:
            place = hca_places.get(port.hca)
            for netdev, state in (place.netdevs.items() if place else ()):
                if state == "up":
                    names[netdev] = None
        ifname = "=" + ",".join(names) if names else ""
    if ifname:
        out.append(("NCCL_SOCKET_IFNAME", ifname))
    for name, value in sorted(settings.env.items()):
        out.append((str(name), str(value)))
    for name, value in out:
        problem = None if ENV_NAME.fullmatch(name) else "is not a variable name"
        problem = problem or env_value_problem(value)
        if problem:
            raise ValueError(f"{name}: {problem}")
    return out


def digest(value: str) -> str:
    return f"{zlib.crc32(value.encode('utf-8', 'surrogateescape')):08x}"


def ours(env: Mapping[str, str]) -> Dict[str, str]:
    """The names the task has from an earlier export of ours, value unchanged (name -> value)."""
    found: Dict[str, str] = {}
    for item in env.get(MARK, "").split(","):
        name, _, recorded = item.partition(":")
        if name and name in env and digest(env[name]) == recorded:
            found[name] = env[name]
    return found


def plan(env: Mapping[str, str], pairs: Sequence[Tuple[str, str]]) -> Plan:
    """Export what the task should have unless the user set it; unset what we set earlier and
    this task should not have; record what is ours now in ``MARK``."""
    inherited = ours(env)
    out = Plan()
    mine: Dict[str, str] = {}
    for name, value in pairs:
        if name in env and name not in inherited:
            continue                      # the user's
        mine[name] = value
        if env.get(name) != value:
            out.exports.append((name, value))
    out.unsets = sorted(name for name in inherited if name not in mine)
    mark = ",".join(f"{name}:{digest(value)}" for name, value in mine.items())
    if mark and env.get(MARK) != mark:
        out.exports.append((MARK, mark))
    elif not mark and MARK in env:
        out.unsets.append(MARK)
    return out


def derive(env: Mapping[str, str], ports: Sequence[IbPortFacts], gpu_places: Mapping[int, GpuPlace],
           hca_places: Mapping[str, HcaPlace], expected: Mapping, settings: NcclSettings) -> Plan:
    """What this task's TaskProlog prints; raises ValueError as ``wanted`` does."""
    return plan(env, wanted(task_gpus(env), ports, gpu_places, hca_places, expected, settings))


def render(result: Plan) -> str:
    return "".join([f"export {name}={value}\n" for name, value in result.exports] +
                   [f"unset {name}\n" for name in result.unsets])
