"""Small, pure tests of what a JSON value read back from a state file is: the schemas of the
kernel-log cursor, the flood state and the counter history are written with them."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    """A non-negative int (a count, an offset)."""
    return is_int(value) and value >= 0


def is_number(value: Any) -> bool:
    """A finite int or float (JSON has no NaN or Infinity; Python's reader accepts them)."""
    try:
        return (is_int(value) or isinstance(value, float)) and math.isfinite(value)
    except OverflowError:           # an int beyond a float's range (10**400)
        return False


def is_str(value: Any) -> bool:
    return isinstance(value, str)


def optional(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or test(value)


def field_problem(data: Mapping[str, Any], tests: Mapping[str, Callable[[Any], bool]],
                  required: bool = True) -> Optional[str]:
    """The first key of ``tests`` whose value fails its test (or is missing when ``required``)."""
    for key, test in tests.items():
        if key not in data:
            if required:
                return f"{key!r} is missing"
            continue
        if not test(data[key]):
            return f"{key!r} is {_short(data[key])}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
