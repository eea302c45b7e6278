"""Counter growth over a time window: pure arithmetic on a counter's samples.

A counter's total says little (an old GPU has old errors); how fast it grows says whether the
part is failing now. A series is ``[[unix_time, value], ...]``, oldest first; a key seen for
the first time is a baseline and raises nothing. Checks import this module; the state file
that keeps the series between runs is ``healthcheck/counters/history.py``.

Series stay small: runs of an unchanged value keep only their two ends (a counter that is 0
all day is two samples), samples closer than 1/16 of the window are thinned, and samples
older than the window go, except the newest of them (the baseline when runs are sparse).
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

Series = List[List[float]]
_SAMPLES_PER_WINDOW = 16


def as_sample(value: object) -> Optional[float]:
    """A counter reading as a finite float, or None (10**400 from a broken sysfs file or
    profile, nan, a non-number): such a reading is not history, and never an exception."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def growth(series: Sequence[Sequence[float]], current: float, now: float,
           window_s: float) -> Optional[Tuple[float, float]]:
    """(growth within the window, seconds it was measured over); None on a first sighting.

    The baseline is the oldest sample inside the window. A counter that went down was reset
    (driver reload, GPU reset, reboot): what it reads now has all accrued since the last
    sample. When every sample is older than the window (sparse runs), the growth since the
    newest is pro-rated to the window rather than charged to it whole.
    """
    current = as_sample(current)       # type: ignore[assignment]
    if not series or current is None:
        return None
    last_t, last_v = series[-1]
    if current < last_v:
        return float(current), max(now - last_t, 0.0)
    start = now - window_s
    inside = [s for s in series if s[0] >= start]
    base_t, base_v = inside[0] if inside else series[-1]
    span = max(now - base_t, 0.0)
    delta = float(current - base_v)
    if span > window_s > 0:
        delta = delta * window_s / span
    return delta, span


def append_sample(series: Series, now: float, value: float, window_s: float) -> Series:
    """``series`` with (now, value) added and thinned; a drop (a reset) starts a new series."""
    if series and value < series[-1][1]:
        series = []
    if len(series) >= 2 and series[-1][1] == value and series[-2][1] == value:
        series[-1] = [now, value]
    else:
        series.append([now, value])
        spacing = window_s / _SAMPLES_PER_WINDOW
        if len(series) >= 3 and series[-2][1] != series[-3][1] and series[-2][0] - series[-3][0] < spacing:
            del series[-2]
    start = now - window_s
    old = [i for i, sample in enumerate(series) if sample[0] < start]
    if len(old) > 1:
        del series[:old[-1]]
    return series


def add_samples(series: Dict[str, Series], samples: Mapping[str, Tuple[float, float]],
                now: float) -> Dict[str, Series]:
    """Every series with ``{key: (value, window_s)}`` added at ``now``; keys unseen for longer
    than the longest window go."""
    windows: Dict[str, float] = {}
    for key, (value, window_s) in samples.items():
        sample = as_sample(value)
        if sample is None:
            continue
        series[key] = append_sample(series.get(key, []), now, sample, window_s)
        windows[key] = window_s
    longest = max(windows.values(), default=0.0)
    for key in list(series):
        if key not in windows and (not series[key] or series[key][-1][0] < now - longest):
            del series[key]
    return series
