"""The summary for a terminal, and for CSV. Every value that came from Slurm (job names, users,
reasons) is data: escaped for the terminal, quoted in CSV."""
from __future__ import annotations

import csv
import io
import json
import re
from typing import Any, Callable, Dict, Iterable, List, Sequence, TextIO, Tuple

from .rows import I_ACCOUNT, I_END, I_EXIT, I_JOBID, I_NODELIST, I_PARTITION, I_START, I_STATE, I_USER
from .tally import JobView
from .accounting import INDEX, job_name

TOP_NODES = 15

# C0/C1 controls and the bidirectional overrides that can make a terminal show other text.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7f, 0xa0))}
_ESCAPES.update({code: f"\\u{code:04x}" for code in (*range(0x202a, 0x202f), *range(0x2066, 0x206a))})


def terminal_safe(value: object) -> str:
    """Log text is written by whoever caused the error: escape what a terminal would obey.
    (``str.translate`` writes the escaped text straight out: a regex substitution with a
    function kept an object per match, 80 times the text's size for a name of ESC bytes.)"""
    text = str(value)
    if _UNSAFE.search(text) is None:
        return text
    return text.translate(_ESCAPES)


# -- text that grows when escaped, cut to a line's cap first (issue 34) ------------------------
MAX_GROWTH = 12          # output bytes one character can become: JSON's \udXXX\udXXX for one past U+FFFF
_PIECE = 4096            # characters measured at a time
CUT_MARK = "[cut]"
ROW_FRAME = 512          # a row's bytes beside its text fields: JSON keys, quotes, separators, numbers


def fitting(value: str, budget: int, measure: Callable[[str], int]) -> Tuple[str, bool]:
    """The longest head of ``value`` whose escaped form (``measure``: its size in bytes) fits in
    ``budget``, and whether it was cut. Measured a piece at a time: nothing past the budget is
    ever escaped, and no more than a piece's escape is held beside the head."""
    if len(value) * MAX_GROWTH <= budget:
        return value, False
    used = position = 0
    while position < len(value):
        piece = value[position:position + _PIECE]
        size = measure(piece)
        if used + size > budget:
            for char in piece:
                size = measure(char)
                if used + size > budget:
                    return value[:position], True
                used += size
                position += 1
        used += size
        position += len(piece)
    return value, False


def _text_size(value: str) -> int:
    return len(terminal_safe(value).encode("utf-8", "surrogateescape"))


def _csv_size(value: str) -> int:
    safe = terminal_safe(value)
    return len(safe.encode("utf-8", "surrogateescape")) + safe.count('"')


def _json_size(value: str) -> int:
    return len(json.dumps(value)) - 2


SIZES = {"text": _text_size, "csv": _csv_size, "json": _json_size}


def bounded_row(row: Dict[str, Any], cap: int, mode: str) -> Dict[str, Any]:
    """A job row whose line, escaped as ``mode`` writes it, is at most ``cap`` bytes ([summary]
    max_line_bytes, the longest line read): its text fields share ``cap - ROW_FRAME``, the job
    name last, so that a long one is what gets cut (ending in ``CUT_MARK``). Each field is cut
    before it is escaped."""
    measure = SIZES[mode]
    budget = cap - ROW_FRAME - len(CUT_MARK)
    texts = [key for key, value in row.items() if isinstance(value, str) and key != "name"] + ["name"]
    if sum(map(len, (row[key] for key in texts))) * MAX_GROWTH <= budget:
        return row                                   # every ordinary row
    row = dict(row)
    for key in texts:
        head, cut = fitting(row[key], max(budget, 0), measure)
        budget -= measure(head)
        row[key] = head + CUT_MARK if cut else head
    return row


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Sequence[int] = ()) -> List[str]:
    cells = [[terminal_safe(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(widths[i]) if i in right else v.ljust(widths[i])
                         for i, v in enumerate(values)).rstrip()
    return [line(headers)] + [line(row) for row in cells]


def render_text(report: Dict[str, Any], top_nodes: int = TOP_NODES) -> str:
    window = report["window"]
    out: List[str] = []
    since = window.get("since") or window.get("first_end") or "(start of input)"
    until = window.get("until") or window.get("last_end") or "(end of input)"
    out.append(f"Jobs that ended {since} .. {until}: {report['jobs']}, {report['gpu_hours']:.1f} GPU-hours")
    hw = report["hardware"]
    out.append(f"Hardware causes: {hw['jobs']} jobs ({_pct(hw['share_jobs'])}), {hw['gpu_hours']:.1f} GPU-hours "
               f"({_pct(hw['share_gpu_hours'])}); {report['from_accounting']} jobs classified from sacct alone (*)")
    out.append("")
    rows = []
    for cause, row in report["by_cause"].items():
        mark = "*" if row["from_accounting"] == row["jobs"] else ("(*)" if row["from_accounting"] else "")
        rows.append([cause + mark, "hardware" if row["hardware"] else "", row["jobs"], _pct(row["share_jobs"]),
                     f"{row['gpu_hours']:.2f}", _pct(row["share_gpu_hours"])])
    out += _table(["CAUSE", "KIND", "JOBS", "SHARE", "GPU-HOURS", "SHARE"], rows, right=(2, 3, 4, 5))
    nodes = [n for n in report["by_node"] if n["hardware_endings"] or n["drains"] or n["flagged"]][:top_nodes]
    if nodes:
        out.append("")
        out += _table(["NODE", "JOBS", "NODE-HOURS", "HW-ENDINGS", "DRAINS", "HW/1000h", "DRAINS/1000h", "FLAG"],
                      [[n["node"], n["jobs"], f"{n['node_hours']:.1f}", n["hardware_endings"], n["drains"],
                        "-" if n["hardware_per_1000_node_hours"] is None else f"{n['hardware_per_1000_node_hours']:.1f}",
                        "-" if n["drains_per_1000_node_hours"] is None else f"{n['drains_per_1000_node_hours']:.1f}",
                        "REPEAT OFFENDER" if n["flagged"] else ""] for n in nodes],
                      right=(1, 2, 3, 4, 5, 6))
        for n in nodes:
            if n["flagged"]:
                out.append(terminal_safe(f"  {n['node']}: {n['why']}"))
    if report["by_xid"]:
        out.append("")
        out += _table(["XID", "JOBS", "GPU-HOURS", "NODES", "MEANING"],
                      [[x["xid"], x["jobs"], f"{x['gpu_hours']:.2f}", ",".join(list(x["nodes"])[:5]), x["mnemonic"]]
                       for x in report["by_xid"]], right=(0, 1, 2))
    out.append("")
    if report["drained"]:
        out += _table(["DRAINED NOW", "STATE", "OURS", "REASON"],
                      [[d["node"], d["state"], "yes" if d.get("ours") else "no", d["reason"]] for d in report["drained"]])
    elif report.get("drained_note"):
        out.append("Drained now: not known")
    else:
        out.append("Drained now: none")
    if report.get("remediation"):
        out.append("")
        out += _table(["REMEDIATED CAUSE", "DRAINS", "BACK", "INSPECT", "OPEN", "REBOOTS", "WORKED", "MEDIAN TO SERVICE"],
                      [[cause, r["drains"], r["back_in_service"], r["inspect"], r["open"], r["reboots"],
                        "-" if r["worked_share"] is None else _pct(r["worked_share"]),
                        "-" if r["median_drain_to_service_s"] is None else f"{r['median_drain_to_service_s']:.0f} s"]
                       for cause, r in report["remediation"].items()], right=(1, 2, 3, 4, 5, 6, 7))
    for note in report.get("notes", []):
        out.append(terminal_safe(f"note: {note}"))
    return "\n".join(out) + "\n"


# -- one row per job ---------------------------------------------------------------------------
JOB_COLUMNS = ("job", "name", "user", "account", "partition", "state", "exit_code", "cause", "source",
               "hardware", "gpus", "elapsed_s", "gpu_hours", "start", "end", "nodes", "culprits", "xids")


def job_row(view: JobView) -> Dict[str, Any]:
    f, verdict = view.fields, view.verdict
    return {"job": f[I_JOBID], "name": job_name(f), "user": f[I_USER], "account": f[I_ACCOUNT],
            "partition": f[I_PARTITION], "state": f[I_STATE], "exit_code": f[I_EXIT],
            "cause": verdict.cause, "source": verdict.source, "hardware": verdict.hardware,
            "gpus": view.gpus, "elapsed_s": view.elapsed_s,
            "gpu_hours": round(view.gpus * view.elapsed_s / 3600.0, 4),
            "start": f[I_START], "end": f[I_END], "nodes": f[I_NODELIST],
            "culprits": ",".join(c.node + (f":gpu{c.gpu}" if c.gpu is not None else "") for c in verdict.culprits),
            "xids": ",".join(str(x) for x in verdict.xids), "db_index": f[INDEX["DBIndex"]]}


def job_line(row: Dict[str, Any]) -> str:
    text = (f"{row['job']:>10} {row['user'][:12]:<12} {row['partition'][:10]:<10} "
            f"{row['cause'] + ('*' if row['source'] == 'sacct' else ''):<14} {row['gpus']:>4} "
            f"{row['elapsed_s']:>8} {row['gpu_hours']:>9.2f} {row['nodes'][:20]:<20} {row['name']}")
    return terminal_safe(text)


JOB_HEADER = (f"{'JOBID':>10} {'USER':<12} {'PARTITION':<10} {'CAUSE':<14} {'GPUS':>4} "
              f"{'ELAPSED':>8} {'GPU-HOURS':>9} {'NODES':<20} NAME")


# -- CSV -----------------------------------------------------------------------------------------
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """Control characters (ESC, NUL, ...) escaped as ``\\xNN``, as on the terminal; text a
    spreadsheet would run as a formula gets a leading apostrophe; numbers stay."""
    if isinstance(value, str):
        value = terminal_safe(value)
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        try:
            float(value)
            return value
        except ValueError:
            return "'" + value
    return value


class CsvWriter:
    def __init__(self, stream: TextIO, columns: Sequence[str]):
        self.columns = list(columns)
        self.writer = csv.writer(stream, quoting=csv.QUOTE_ALL, lineterminator="\n")
        self.writer.writerow(self.columns)

    def row(self, values: Dict[str, Any]) -> None:
        self.writer.writerow([csv_cell(values.get(column, "")) for column in self.columns])


CAUSE_COLUMNS = ("cause", "hardware", "jobs", "share_jobs", "gpu_hours", "share_gpu_hours", "from_accounting")
NODE_COLUMNS = ("node", "jobs", "node_hours", "hardware_endings", "drains", "drains_ours",
                "hardware_per_1000_node_hours", "drains_per_1000_node_hours", "flagged", "why")
XID_COLUMNS = ("xid", "jobs", "gpu_hours", "nodes", "mnemonic", "action")


def render_csv(report: Dict[str, Any], table: str) -> str:
    stream = io.StringIO()
    if table == "node":
        writer = CsvWriter(stream, NODE_COLUMNS)
        for row in report["by_node"]:
            writer.row(row)
    elif table == "xid":
        writer = CsvWriter(stream, XID_COLUMNS)
        for row in report["by_xid"]:
            writer.row(dict(row, nodes=",".join(row["nodes"])))
    else:
        writer = CsvWriter(stream, CAUSE_COLUMNS)
        for cause, row in report["by_cause"].items():
            writer.row(dict(row, cause=cause))
    return stream.getvalue()
