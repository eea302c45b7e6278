"""Which NVML functions each driver branch exports (``data/nvml-functions.tsv``, data), and
which field values (``nvmlDeviceGetFieldValues``) it knows (``data/nvml-fields.tsv``).

The simulator uses it to act like a node's driver (a call the branch lacks raises what pynvml
raises), the tests build stand-in ``libnvidia-ml.so.1`` libraries from it, and
``docs/checks.md`` shows it. Pure: reads only the package's own data file.
"""
from __future__ import annotations

import re
from .plain import plain
from functools import lru_cache
from typing import Dict, FrozenSet, Optional, Tuple

from .safeio import datafiles

# The branches modelled, oldest first. A driver between two branches has the older one's
# functions; one older than the first is treated as the first.
BRANCHES: Tuple[str, ...] = ("R470", "R525", "R535", "R550", "R560", "R570", "R575", "R580")

_VERSION = re.compile(r"\s*(\d+)")


@plain(frozen=True)
class NvmlFunction:
    name: str
    since: str        # the first branch in BRANCHES that exports it
    fact: str         # what the probe reads with it
    source: str


@lru_cache(maxsize=1)
def functions() -> Dict[str, NvmlFunction]:
    text = datafiles.read_text("nvml-functions.tsv")
    out: Dict[str, NvmlFunction] = {}
    rows = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    for line in rows[1:]:    # the header
        name, since, fact, source = line.split("\t")
        if since not in BRANCHES:
            raise ValueError(f"nvml-functions.tsv: {name}: unknown branch {since!r}")
        out[name] = NvmlFunction(name, since, fact, source)
    return out


@plain(frozen=True)
class NvmlField:
    name: str         # pynvml's constant, e.g. NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    id: int
    since: str        # the first branch in BRANCHES that knows it
    fact: str
    source: str


@lru_cache(maxsize=1)
def fields() -> Dict[str, NvmlField]:
    """Field name -> its row of ``nvml-fields.tsv``."""
    text = datafiles.read_text("nvml-fields.tsv")
    out: Dict[str, NvmlField] = {}
    rows = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    for line in rows[1:]:    # the header
        name, number, since, fact, source = line.split("\t")
        if since not in BRANCHES:
            raise ValueError(f"nvml-fields.tsv: {name}: unknown branch {since!r}")
        out[name] = NvmlField(name, int(number), since, fact, source)
    return out


def driver_knows_field(driver_version: str, number: int) -> bool:
    """Whether a driver of this version answers field ``number``; fields outside the table are
    taken as known."""
    for entry in fields().values():
        if entry.id == number:
            return BRANCHES.index(entry.since) <= BRANCHES.index(branch_of(driver_version))
    return True


@plain(frozen=True)
class NvmlStructVersion:
    function: str     # the versioned call, e.g. nvmlDeviceGetGpuFabricInfoV
    version: int      # of its structure (the high byte of the struct's version word)
    since: str        # the first branch in BRANCHES that accepts it
    fact: str
    source: str


@lru_cache(maxsize=1)
def struct_versions() -> Dict[Tuple[str, int], NvmlStructVersion]:
    """(function, version) -> its row of ``nvml-struct-versions.tsv``."""
    text = datafiles.read_text("nvml-struct-versions.tsv")
    out: Dict[Tuple[str, int], NvmlStructVersion] = {}
    rows = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    for line in rows[1:]:    # the header
        function, version, since, fact, source = line.split("\t")
        if since not in BRANCHES:
            raise ValueError(f"nvml-struct-versions.tsv: {function} v{version}: unknown branch {since!r}")
        out[(function, int(version))] = NvmlStructVersion(function, int(version), since, fact, source)
    return out


def driver_accepts_version(driver_version: str, function: str, version: int) -> bool:
    """Whether a driver of this version accepts ``function``'s structure ``version``; versions
    outside the table are taken as accepted (the call's own export is ``driver_exports``)."""
    entry = struct_versions().get((function, version))
    if entry is None:
        return True
    return BRANCHES.index(entry.since) <= BRANCHES.index(branch_of(driver_version))


def branch_of(driver_version: str) -> str:
    """``"535.161.08"`` -> ``"R535"``; ``"545.23.08"`` -> ``"R535"`` (the newest branch not above it)."""
    match = _VERSION.match(driver_version or "")
    if not match:
        raise ValueError(f"{driver_version!r} is not a driver version such as 550.90.07")
    major = int(match.group(1))
    chosen = BRANCHES[0]
    for branch in BRANCHES:
        if int(branch[1:]) <= major:
            chosen = branch
    return chosen


def exports(branch: str) -> FrozenSet[str]:
    """The NVML functions (of those in the table) that ``branch`` exports."""
    rank = BRANCHES.index(branch)
    return frozenset(f.name for f in functions().values() if BRANCHES.index(f.since) <= rank)


def driver_exports(driver_version: str, function: str) -> bool:
    """Whether a driver of this version exports ``function``; functions outside the table are
    taken as present (the table lists what the probe uses)."""
    entry: Optional[NvmlFunction] = functions().get(function)
    if entry is None:
        return True
    return BRANCHES.index(entry.since) <= BRANCHES.index(branch_of(driver_version))


# -- clock event reasons: noise or slowdown (data/clock-event-reasons.tsv) --------------------

@plain(frozen=True)
class ClockEventReason:
    bit: int
    name: str         # how a finding names it ("HW slowdown")
    constant: str     # nvml.h's name
    kind: str         # noise | slowdown


CLOCK_EVENT_KINDS = ("noise", "slowdown")


@lru_cache(maxsize=1)
def clock_event_reasons() -> Tuple[ClockEventReason, ...]:
    """Every row of ``clock-event-reasons.tsv``, lowest bit first."""
    text = datafiles.read_text("clock-event-reasons.tsv")
    rows = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    out = []
    for line in rows[1:]:    # the header
        bit, name, constant, kind = line.split("\t")
        if kind not in CLOCK_EVENT_KINDS:
            raise ValueError(f"clock-event-reasons.tsv: {constant}: unknown class {kind!r}")
        value = int(bit, 16)
        if value <= 0 or value & (value - 1):
            raise ValueError(f"clock-event-reasons.tsv: {constant}: {bit} is not one bit")
        out.append(ClockEventReason(value, name, constant, kind))
    return tuple(sorted(out, key=lambda reason: reason.bit))


def slowdown_reasons(mask: int) -> Tuple[ClockEventReason, ...]:
    """The reasons of ``mask`` the table calls slowdown (noise and unlisted bits left out)."""
    return tuple(r for r in clock_event_reasons() if r.kind == "slowdown" and mask & r.bit)
