"""The scenario table: its schema, one ``Scenario`` per row, and loading it.

The table itself is data (``slurm_hooks/data/lab-scenarios.toml``); this module only reads
and validates it, so a bad row is one clear line before any job is submitted.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Dict, List, Optional, Tuple

from healthcheck.safeio import tomlio
from healthcheck.records.classes import CLASSES, UNKNOWN
from healthcheck.schema import Field, validate

from .. import LabError
from .. import paths as P

KINDS = ("simple", "cancel", "preempt", "node_fail", "fault", "oom", "array", "hetjob")

_STR_LIST = Field(list, item=Field(str))
SCENARIO_SCHEMA: Dict[str, Any] = {
    "name": Field(str, required=True),
    "title": Field(str, required=True),
    "kind": Field(str, required=True, choices=KINDS),
    "nodes": Field(list, required=True, item=Field(str, choices=P.NODES)),
    "exclusive": Field(bool),
    "sbatch": _STR_LIST,
    "payload": Field(list, required=True, item=Field(str)),
    "srun": Field(bool),
    # kind "array": sbatch's --array (each task is checked against `expect` on its own)
    "array": Field(str, check=lambda v: None if re.match(r"^[0-9]{1,4}(-[0-9]{1,4})?$", v) else
                   "is a task range such as 1-4"),
    # srun steps the job script runs one after the other (with srun = true)
    "steps": Field(int, minimum=1, maximum=10),
    # kind "hetjob": one sbatch option list per component (`sbatch C0 : C1 ...`), each checked
    "components": Field(list, item=_STR_LIST),
    "inject": _STR_LIST,
    "log": _STR_LIST,
    "expect": {
        "state": Field(str, required=True),
        "exit_code": Field(str),
        "requeued": Field(bool),
        "preemptor": Field(str),
        "cause": Field(str),
        "drain": Field(bool),
        # The job-ending class the hooks record (records/classes.py); checked when given.
        "class": Field(str, choices=CLASSES + (UNKNOWN,)),
    },
}
TABLE_SCHEMA = {"scenario": Field(list, required=True, item=SCENARIO_SCHEMA)}


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    kind: str
    nodes: Tuple[str, ...]
    payload: Tuple[str, ...]
    expect: Dict[str, Any]
    exclusive: bool = False
    sbatch: Tuple[str, ...] = ()
    srun: bool = False
    inject: Tuple[str, ...] = ()
    log: Tuple[str, ...] = ()
    array: str = ""
    steps: int = 1
    components: Tuple[Tuple[str, ...], ...] = ()

    @property
    def array_tasks(self) -> Tuple[int, ...]:
        first, _, last = self.array.partition("-")
        return tuple(range(int(first), int(last or first) + 1)) if self.array else ()

    @property
    def expect_state(self) -> str:
        return self.expect["state"]

    @property
    def expect_class(self) -> Optional[str]:
        """The job-ending class the hooks must record, or None where the row does not say."""
        return self.expect.get("class")

    @property
    def uses_sim(self) -> bool:
        return self.kind == "fault"


def load_table(path: Optional[str] = None) -> List[Scenario]:
    if path is None:
        text = resources.files("slurm_hooks").joinpath("data/lab-scenarios.toml").read_text("utf-8")
        source = "lab-scenarios.toml"
    else:
        with open(path, encoding="utf-8") as handle:
            text, source = handle.read(), path
    return parse_table(text, source)


def parse_table(text: str, source: str = "lab-scenarios.toml") -> List[Scenario]:
    try:
        doc = tomlio.loads(text)
    except ValueError as exc:
        raise LabError(f"{source}: not TOML: {exc}") from None
    problems = validate(doc, TABLE_SCHEMA)
    if problems:
        raise LabError(f"{source}: {problems[0][0]}: {problems[0][1]}; {problems[0][2]}")
    table, seen = [], set()
    for raw in doc["scenario"]:
        if raw["name"] in seen:
            raise LabError(f"{source}: scenario {raw['name']!r} appears twice")
        seen.add(raw["name"])
        if raw["kind"] == "fault" and not raw.get("inject"):
            raise LabError(f"{source}: fault scenario {raw['name']!r} injects nothing")
        if (raw["kind"] == "array") != bool(raw.get("array")):
            raise LabError(f"{source}: scenario {raw['name']!r}: `array` goes with kind \"array\", and only there")
        if (raw["kind"] == "hetjob") != (len(raw.get("components", ())) >= 2):
            raise LabError(f"{source}: scenario {raw['name']!r}: kind \"hetjob\" needs two `components` or more, "
                           "and only it has them")
        table.append(Scenario(
            name=raw["name"], title=raw["title"], kind=raw["kind"], nodes=tuple(raw["nodes"]),
            payload=tuple(raw["payload"]), expect=dict(raw["expect"]),
            exclusive=raw.get("exclusive", False), sbatch=tuple(raw.get("sbatch", ())),
            srun=raw.get("srun", False), inject=tuple(raw.get("inject", ())), log=tuple(raw.get("log", ())),
            array=raw.get("array", ""), steps=raw.get("steps", 1),
            components=tuple(tuple(c) for c in raw.get("components", ()))))
    return table
