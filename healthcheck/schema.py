"""A small declarative validator for TOML documents (config files and simulator profiles).

A schema is a dict of key -> Field or nested dict (a table).  Validation collects every
problem as ``(dotted.key, what is wrong, what is allowed)`` instead of stopping at the
first, so an admin fixes a file in one pass.
"""
from __future__ import annotations

import math
from .plain import plain
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

Problem = Tuple[str, str, str]

_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "a table"}


@plain
class Field:
    """One leaf value.

    ``kind`` is a Python type (int, float, str, bool, list, dict); floats accept ints.
    ``item`` validates list items (a Field or a schema dict for tables); ``values`` validates
    the values of a free-keyed table; ``check`` returns an error string or None.
    """
    kind: type
    choices: Optional[Sequence[Any]] = None
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    item: Any = None
    values: Any = None
    check: Optional[Callable[[Any], Optional[str]]] = None
    required: bool = False
    doc: str = ""


def type_ok(kind: type, value: Any) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def allowed_text(spec: Field) -> str:
    if spec.choices is not None:
        return "one of " + ", ".join(repr(c) for c in spec.choices)
    text = _TYPE_NAMES.get(spec.kind, spec.kind.__name__)
    if spec.minimum is not None:
        text += f" >= {spec.minimum:g}"
    if spec.maximum is not None:
        text += f"{',' if spec.minimum is not None else ''} <= {spec.maximum:g}"
    return text


def validate(doc: Any, schema: Dict[str, Any], prefix: str = "") -> List[Problem]:
    problems: List[Problem] = []
    if not isinstance(doc, dict):
        return [(prefix.rstrip(".") or "(top)", f"is {type(doc).__name__}", "a table")]
    for key, value in doc.items():
        dotted = f"{prefix}{key}"
        if key not in schema:
            allowed = ", ".join(sorted(schema)) or "no keys"
            problems.append((dotted, "unknown key", f"allowed here: {allowed}"))
            continue
        problems.extend(validate_value(value, schema[key], dotted))
    for key, spec in schema.items():
        if isinstance(spec, Field) and spec.required and key not in doc:
            problems.append((f"{prefix}{key}", "is missing", allowed_text(spec)))
    return problems


def validate_value(value: Any, spec: Any, dotted: str) -> List[Problem]:
    if isinstance(spec, dict):
        return validate(value, spec, dotted + ".")
    if not type_ok(spec.kind, value):
        return [(dotted, f"has the wrong type ({type(value).__name__} {value!r})", allowed_text(spec))]
    problems: List[Problem] = []
    if isinstance(value, str) and "\0" in value:
        # No key takes one, and a path with a NUL byte makes every os call raise.
        return [(dotted, "holds a NUL byte", allowed_text(spec))]
    if spec.choices is not None and value not in spec.choices:
        problems.append((dotted, f"{value!r} is not allowed", allowed_text(spec)))
    if spec.kind in (int, float) and not _finite(value):
        # TOML has nan and inf; neither is a timeout, a window or a count.
        return [(dotted, f"{value!r} is not a finite number", allowed_text(spec))]
    if spec.minimum is not None and value < spec.minimum:
        problems.append((dotted, f"{value!r} is below the minimum", allowed_text(spec)))
    if spec.maximum is not None and value > spec.maximum:
        problems.append((dotted, f"{_short(value)} is above the maximum", allowed_text(spec)))
    if spec.item is not None and isinstance(value, list):
        for index, item in enumerate(value):
            problems.extend(validate_value(item, spec.item, f"{dotted}[{index}]"))
    if spec.values is not None and isinstance(value, dict):
        for key, item in value.items():
            problems.extend(validate_value(item, spec.values, f"{dotted}.{key}"))
    if spec.check is not None and not problems:
        message = spec.check(value)
        if message:
            problems.append((dotted, message, spec.doc or allowed_text(spec)))
    return problems


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:           # an int beyond a float's range (10**400): finite, just huge
        return True


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"


def merge(base: Dict[str, Any], override: Dict[str, Any]) -> Dict[str, Any]:
    """Deep merge of tables; lists and scalars in ``override`` replace those in ``base``.

    The result shares no mutable value with either input: merging one defaults table into
    eight GPUs must give eight independent GPUs."""
    import copy             # only for a merge (a load the compiled cache does not answer)

    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
