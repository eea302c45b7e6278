"""docs/configuration.md against the validator's schema: every key it knows is documented, every
documented key is one it knows, and each default the page shows is the built-in one."""
from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterator, Set, Tuple

from healthcheck.safeio import tomlio
from healthcheck.config import CONFIG_SCHEMA, TIERS, builtin_defaults
from healthcheck.config.keys import DEPRECATED_KEYS
from healthcheck.schema import Field

from .conftest import ROOT

DOC = os.path.join(ROOT, "docs", "configuration.md")

# Section heading: ### `[paths]`, ### `[[nodes]]`, #### `[xid.escalate.<code>]`
_HEADING = re.compile(r"^#{2,4} `\[\[?([^\]`]+)\]\]?`")
# Key row: | `state_dir` | default | meaning |   or   | `"gpu.nvml"` | ...
_ROW = re.compile(r'^\| `"?([^`"]+)"?` \| (.*?) \| ')


def _free_table_names() -> Dict[str, Set[str]]:
    """The names the validator accepts in the free-keyed top-level tables (``[actions]`` has one
    row for every check id: each check's default is in docs/checks.md)."""
    return {"thresholds": set(builtin_defaults()["thresholds"]), "tiers": set(TIERS)}


def schema_keys(schema: Dict[str, Any] = CONFIG_SCHEMA, prefix: str = "") -> Set[str]:
    """Every key the validator knows, dotted; ``*`` stands for a free key (an Xid code)."""
    names = _free_table_names()
    keys: Set[str] = set()
    for key, spec in schema.items():
        dotted = prefix + key
        if isinstance(spec, dict):
            keys |= schema_keys(spec, dotted + ".")
        elif spec.kind is list and isinstance(spec.item, dict):
            keys |= {f"{dotted}.{sub}" for sub in spec.item}
        elif dotted == "actions":
            keys.add("actions.<check id>")     # one row: each check's default is in docs/checks.md
        elif spec.kind is dict and not prefix and dotted in names:
            keys |= {f"{dotted}.{name}" for name in names[dotted]}
        elif spec.kind is dict and isinstance(spec.values, dict):
            keys.add(dotted)
            keys |= {f"{dotted}.*.{sub}" for sub in spec.values}
        else:
            keys.add(dotted)
    return keys


def documented_lines() -> Iterator[Tuple[str, str, str]]:
    """(dotted key, default cell, the whole row) for every key row under a section heading of the page."""
    section = None
    with open(DOC, encoding="utf-8") as handle:
        for line in handle:
            heading = _HEADING.match(line)
            if heading:
                section = re.sub(r"<[^>]+>", "*", heading.group(1))
                continue
            if line.startswith("#"):
                section = None
                continue
            row = _ROW.match(line)
            if row and section:
                yield f"{section}.{row.group(1)}", row.group(2), line


def documented_rows() -> Iterator[Tuple[str, str]]:
    """(dotted key, default cell) for every key row under a section heading of the page."""
    for key, default, _ in documented_lines():
        yield key, default


def _default(dotted: str) -> Any:
    value: Any = builtin_defaults()
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def test_every_key_the_validator_knows_is_documented():
    # An older key (keys.DEPRECATED_KEYS) is documented in the page's "Older keys" table instead.
    documented = {key for key, _ in documented_rows()} | set(DEPRECATED_KEYS)
    missing = sorted(schema_keys() - documented)
    assert not missing, f"docs/configuration.md lacks a row for: {', '.join(missing)}"


def test_configuration_md_names_no_key_the_validator_does_not_know():
    unknown = sorted({key for key, _ in documented_rows()} - schema_keys())
    assert not unknown, f"docs/configuration.md documents keys the validator does not know: {', '.join(unknown)}"


def test_each_key_is_documented_once():
    keys = [key for key, _ in documented_rows()]
    assert sorted(set(keys)) == sorted(keys) and len(keys) > 50


def test_documented_defaults_are_the_built_in_ones():
    wrong = []
    for key, cell in documented_rows():
        default = _default(key)
        if isinstance(default, (str, int, float, bool)):
            literal = re.fullmatch(r"`(.+)`", cell)
            shown = tomlio.loads(f"v = {literal.group(1)}")["v"] if literal else None
            if shown != default or type(shown) is not type(default):
                wrong.append(f"{key}: page says {cell}, built-in is {tomlio.dumps({'v': default})[4:].strip()}")
        elif isinstance(default, list) and cell.startswith("`["):
            # an argument list (a command) is shown as itself
            if tomlio.loads(f"v = {cell.strip('`')}")["v"] != default:
                wrong.append(f"{key}: page says {cell}, built-in is {default}")
        elif isinstance(default, list):
            counted = re.fullmatch(r"(\d+) checks", cell)
            if not counted or int(counted.group(1)) != len(default):
                wrong.append(f"{key}: page says {cell}, built-in has {len(default)} checks")
    assert not wrong, "docs/configuration.md defaults differ:\n" + "\n".join(wrong)


def test_the_schema_walk_sees_nested_and_free_keys():
    """The comparison above is only as good as this walk: it must reach every kind of key."""
    keys = schema_keys()
    assert {"paths.state_dir", "nodes.match", "xid.escalate", "xid.escalate.*.count",
            "thresholds.temperature_margin_c", "actions.<check id>", "tiers.prolog", "dcgm.levels"} <= keys
    assert isinstance(CONFIG_SCHEMA["nodes"], Field)


def numeric_fields(schema: Dict[str, Any] = CONFIG_SCHEMA, prefix: str = "") -> Iterator[Tuple[str, Field]]:
    """(dotted key as the page's rows name it, Field) for every number the validator takes; a
    free-keyed table of numbers (thresholds, [health] confirm) is its value Field."""
    names = _free_table_names()
    for key, spec in schema.items():
        dotted = prefix + key
        if isinstance(spec, dict):
            yield from numeric_fields(spec, dotted + ".")
        elif spec.kind in (int, float):
            yield dotted, spec
        elif spec.kind is list and isinstance(spec.item, dict):
            yield from numeric_fields(spec.item, dotted + ".")
        elif spec.kind is dict and isinstance(spec.values, dict):
            yield from numeric_fields(spec.values, dotted + ".*.")
        elif spec.kind is dict and isinstance(spec.values, Field) and spec.values.kind in (int, float):
            if not prefix and dotted in names:
                for name in sorted(names[dotted]):
                    yield f"{dotted}.{name}", spec.values
            else:
                yield dotted, spec.values


def range_text(spec: Field) -> str:
    return f"Range: {spec.minimum:g} to {spec.maximum:g}."


def test_every_number_in_the_schema_has_both_bounds():
    """A value config check accepts must never overflow a sleep, a deadline or a float."""
    fields = dict(numeric_fields())
    assert {"records.verify_delay_s", "summary.sacct_timeout_s", "health.confirm_runs", "health.confirm",
            "thresholds.temperature_margin_c", "xid.escalate.*.count", "nodes.gpus"} <= set(fields)
    unbounded = sorted(key for key, spec in fields.items() if spec.minimum is None or spec.maximum is None)
    assert not unbounded, f"numeric keys without both bounds: {', '.join(unbounded)}"


def test_every_numeric_key_row_shows_its_range():
    rows = {key: line for key, _, line in documented_lines()}
    wrong = [f"{key}: wants '{range_text(spec)}'" for key, spec in numeric_fields()
             if range_text(spec) not in rows.get(key, "")]
    assert not wrong, "docs/configuration.md rows without their range:\n" + "\n".join(wrong)
