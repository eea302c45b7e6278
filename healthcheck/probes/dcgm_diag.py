"""The DCGM probe: ``dcgmi diag -r LEVEL -j``, when dcgmi is installed.

NVIDIA publishes no stable schema for this JSON: 3.x puts everything under
"DCGM GPU Diagnostic" with ``gpu_ids`` strings, 4.x under "DCGM Diagnostic" with
``entity_group``/``entity_id`` and warning objects, and a warning is written as "Fail". The
parser walks what it finds and keeps what it understands.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any, Iterable, List, Optional, Tuple

from ..safeio import programs
from ..facts import DcgmFacts, DcgmTestResult

# Hooks run with no PATH; these are where the DCGM packages put dcgmi.
SEARCH_PATH = "/usr/bin:/usr/local/bin:/usr/sbin:/usr/local/sbin:/opt/dcgm/bin"


def find_dcgmi(configured: str) -> Optional[str]:
    if os.sep in configured:
        return configured if os.access(configured, os.X_OK) and os.path.isfile(configured) else None
    search = os.pathsep.join(p for p in (os.environ.get("PATH", ""), SEARCH_PATH) if p)
    return shutil.which(configured, path=search)


def probe_dcgm(dcgmi: str, level: int, timeout_s: float, gpus: Optional[Iterable[int]] = None) -> DcgmFacts:
    facts = DcgmFacts(level=level, timeout_s=timeout_s)
    path = find_dcgmi(dcgmi)
    if path is None:
        facts.status, facts.message = "not_installed", f"{dcgmi} not found"
        return facts
    args = [path, "diag", "-r", str(int(level)), "-j"]
    if gpus is not None:
        args += ["-i", ",".join(str(int(g)) for g in sorted(gpus))]
    code, out, err, timed_out = run_bounded(args, timeout_s)
    facts.exit_code = code
    if timed_out:
        facts.status = "timeout"
        facts.message = f"dcgmi diag -r {level} did not finish within {timeout_s:g} s"
        return facts
    if code is None:
        facts.status, facts.message = "error", err
        return facts
    try:
        facts.version, facts.results, runtime_error = parse_diag(out)
    except ValueError as exc:
        first = (err.strip().splitlines() or [""])[0]
        facts.status = "error"
        facts.message = f"dcgmi diag exited {code}: {first or exc}"
        return facts
    if runtime_error:
        facts.status, facts.message = "error", f"dcgmi diag: {runtime_error}"
    return facts


def run_bounded(args: List[str], timeout_s: float) -> Tuple[Optional[int], str, str, bool]:
    """(exit code, stdout, stderr, timed out); exit code None when dcgmi could not be run (the
    error is then in stderr). The shared runner kills dcgmi and everything it started at the
    deadline."""
    try:
        done = programs.run(args, timeout_s)
    except programs.CommandError as exc:
        return None, "", ("" if exc.timed_out else str(exc)), exc.timed_out
    return done.returncode, done.stdout, done.stderr, False


# -- parsing --------------------------------------------------------------------------------------
_STATUS = {"pass": "pass", "passed": "pass", "ok": "pass",
           "fail": "fail", "failed": "fail", "error": "fail", "warn": "fail", "warning": "fail",
           "skip": "skip", "skipped": "skip", "not run": "skip", "notrun": "skip", "n/a": "skip"}


def parse_diag(text: str) -> Tuple[Optional[str], List[DcgmTestResult], Optional[str]]:
    """(DCGM version, one result per test and entity, runtime error) from ``dcgmi diag -j``."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in dcgmi's output")
    try:
        doc = json.loads(text[start:end + 1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"dcgmi printed invalid JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise ValueError("dcgmi's JSON is not an object")
    root = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic", doc))
    if not isinstance(root, dict):
        raise ValueError("dcgmi's JSON has no diagnostic section")
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    version = metadata.get("version") or root.get("version") or doc.get("version")
    runtime_error = root.get("runtime_error") or doc.get("runtime_error")
    tests: List[Tuple[str, Any]] = []
    for category in _list(root.get("test_categories")):
        if isinstance(category, dict):
            name = str(category.get("category", ""))
            tests.extend((name, test) for test in _list(category.get("tests")))
    tests.extend(("", test) for test in _list(root.get("tests")))
    results: List[DcgmTestResult] = []
    for category, test in tests:
        if not isinstance(test, dict):
            continue    # 3.x writes null for tests it did not run
        name = str(test.get("name", "?"))
        mine = [_result(category, name, entry) for entry in _list(test.get("results")) if isinstance(entry, dict)]
        results.extend(mine)
        summary = test.get("test_summary")
        if isinstance(summary, dict) and not any(r.status in ("fail", "other") for r in mine):
            # 4.x reports an error with no entity only in the test's summary.
            verdict = _result(category, name, {k: v for k, v in summary.items() if k not in ("entity_id", "gpu_id",
                                                                                           "gpu_ids")})
            if verdict.status in ("fail", "other"):
                results.append(verdict)
    if not results and not runtime_error:
        raise ValueError("dcgmi's JSON holds no test results")
    return (str(version) if version else None), results, (str(runtime_error) if runtime_error else None)


def _result(category: str, test: str, entry: dict) -> DcgmTestResult:
    raw = str(entry.get("status", "")).strip().lower()
    status = _STATUS.get(raw, "other")
    gpus: List[int] = []
    group = str(entry.get("entity_group", "GPU"))
    if "entity_id" in entry and group.upper() == "GPU":
        gpus = _ints([entry["entity_id"]])
    elif "gpu_id" in entry:
        gpus = _ints([entry["gpu_id"]])
    elif "gpu_ids" in entry:
        value = entry["gpu_ids"]
        gpus = _ints(value.split(",") if isinstance(value, str) else _list(value))
    warnings: List[str] = []
    error_ids: List[int] = []
    # 4.x writes "warnings" (a list); some writers use "warning", and either may hold one item.
    raw = entry["warnings"] if "warnings" in entry else entry.get("warning")
    for warning in raw if isinstance(raw, list) else [raw]:
        if isinstance(warning, dict):
            text = warning.get("warning") or warning.get("message") or json.dumps(warning, sort_keys=True)
            if "error_id" in warning:
                text = f"{text} (error id {warning['error_id']})"
                error_ids.extend(_ints([warning["error_id"]]))
            warnings.append(str(text))
        elif warning:
            warnings.append(str(warning))
    if group.upper() != "GPU" and "entity_id" in entry:
        warnings.insert(0, f"entity {group} {entry['entity_id']}")
    return DcgmTestResult(category=category, test=test, status=status, gpus=gpus, warnings=warnings,
                          error_ids=error_ids)


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _ints(values: Iterable[Any]) -> List[int]:
    out = []
    for value in values:
        try:
            out.append(int(str(value).strip()))
        except ValueError:
            continue
    return out
