"""``slurm-gpu summary``: why jobs ended over a window, joined with this tool's AdminComment
entries; by cause, node, GPU and Xid; as a table, JSON, CSV or an HTML report."""
from __future__ import annotations

import json
import sys
import time
from typing import Dict, IO, Iterable, List, Optional, Tuple

import click

from .common import JSON_VERSION, config_option, fail, load_config, versioned
from ..summary.text import terminal_safe
from .xid_cmd import parse_time

EXIT_UNREADABLE = 1
DEFAULT_SINCE = "7d"


def _local_iso(epoch: float) -> str:
    """sacct's own time form (local time, no zone): what its -S/-E take and its columns show."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def _values(options: Tuple[str, ...]) -> List[str]:
    """Repeated and comma-separated option values, in order, without duplicates."""
    seen: List[str] = []
    for option in options:
        for value in option.split(","):
            value = value.strip()
            if value and value not in seen:
                seen.append(value)
    return seen


def _expand_nodes(expressions: Tuple[str, ...]) -> List[str]:
    """Each --node value read as Slurm reads a hostlist: commas inside brackets belong to the
    range (gpu[0042,0314]), commas outside separate names (gpu1,gpu[3-4])."""
    import hostlist

    nodes: List[str] = []
    for expression in expressions:
        try:
            expanded = hostlist.expand_hostlist(expression.strip())
        except hostlist.BadHostlist:
            fail(f"--node {terminal_safe(expression)!s}: not a node name or hostlist such as gpu[1-4]")
        nodes += [node for node in expanded if node not in nodes]
    return nodes


def _open_input(path: str) -> IO[bytes]:
    """Binary: lines are cut with a cap (``LineCap``) before they are decoded."""
    if path == "-":
        return open(sys.stdin.fileno(), "rb", closefd=False)
    try:
        if path.endswith(".gz"):
            import gzip

            return gzip.open(path, "rb")
        return open(path, "rb")
    except OSError as exc:
        fail(terminal_safe(f"--input {path}: {exc.strerror}"), EXIT_UNREADABLE)
        raise


def json_document(doc: Dict) -> str:
    """``doc`` as JSON, a top-level key a line, each value compact: json's C encoder writes it
    (with ``indent`` json encodes in Python, 5x slower on a month's 1 MB report)."""
    encode = json.JSONEncoder().encode
    return "{\n" + ",\n".join(f" {encode(key)}: {encode(value)}" for key, value in doc.items()) + "\n}"


class JobOutput:
    """Per-job rows (``--jobs``), written while the accounting streams by."""

    def __init__(self, mode: str, stream: IO[str], cap: int):
        from slurm_hooks.summary import text

        self.text, self.mode, self.stream, self.count = text, mode, stream, 0
        self.cap = cap                   # [summary] max_line_bytes: a row's text, escaped, at most this
        if mode == "csv":
            self.csv = text.CsvWriter(stream, text.JOB_COLUMNS)
        elif mode == "json":
            stream.write(f'{{"v": {JSON_VERSION}, "job_rows": [')
        else:
            stream.write(text.JOB_HEADER + "\n")

    def __call__(self, view) -> None:
        row = self.text.bounded_row(self.text.job_row(view), self.cap, self.mode)
        if self.mode == "csv":
            self.csv.row(row)
        elif self.mode == "json":
            self.stream.write(("," if self.count else "") + "\n" + json.dumps(row))
        else:
            self.stream.write(self.text.job_line(row) + "\n")
        self.count += 1

    def finish(self, report: Dict) -> None:
        if self.mode == "json":
            self.stream.write("\n],\n" + json_document(report)[1:].lstrip() + "\n")


@click.command()
@config_option
@click.option("--since", "since_text", metavar="TIME",
              help="Jobs that ended from TIME on: 2026-11-01T00:00:00, @EPOCH, or 7d / 12h ago "
                   "(default: 7d; with --input: the whole file).")
@click.option("--until", "until_text", metavar="TIME", help="... and before TIME (default: now; with --input: no limit).")
@click.option("--user", "users", multiple=True, metavar="NAME[,NAME]", help="Only these users' jobs.")
@click.option("--account", "accounts", multiple=True, metavar="NAME[,NAME]", help="Only these accounts.")
@click.option("--partition", "partitions", multiple=True, metavar="NAME[,NAME]", help="Only these partitions.")
@click.option("--node", "nodes", multiple=True, metavar="HOSTLIST", help="Only jobs that ran on these nodes: a Slurm hostlist such as gpu[0042,0314] or gpu1,gpu[3-4] (repeatable).")
@click.option("--state", "states", multiple=True, metavar="STATE[,STATE]",
              help="Only jobs whose sacct State starts with this word (FAILED, CANCELLED, ...).")
@click.option("--cause", "causes", multiple=True, metavar="CAUSE[,CAUSE]",
              help="Only jobs with this cause (GPU_LOST, NODE_FAIL, ...).")
@click.option("--job", "job_ids", multiple=True, metavar="ID[,ID]", help="Only these jobs (every incarnation).")
@click.option("--input", "input_path", metavar="FILE",
              help="Read saved sacct output (see --sacct-format; - for stdin, .gz too) instead of running sacct.")
@click.option("--sinfo-json", "sinfo_path", metavar="FILE",
              help="With --input: saved `sinfo --json` output, for the nodes drained now.")
@click.option("--events", "events_path", metavar="FILE",
              help="With --input: saved `sacctmgr -P show event format=...` output (see --sacct-format), for drains.")
@click.option("--sacct-format", "print_format", is_flag=True,
              help="Print the sacct --format field list this command reads, and exit.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV (every field quoted).")
@click.option("--by", "csv_table", type=click.Choice(["cause", "node", "xid"]), default="cause", show_default=True,
              help="Which table --csv prints.")
@click.option("--jobs", "per_job", is_flag=True, help="One row per job (as a table, --csv rows, or --json \"job_rows\").")
@click.option("--html", "html_path", metavar="FILE", help="Also write a self-contained HTML report to FILE.")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Processes reading a large --input file (default: one per CPU, at most 3).")
@click.option("--top", "top_nodes", type=click.IntRange(min=1), default=15, show_default=True,
              help="Nodes in the terminal table.")
def summary(config_path, since_text, until_text, users, accounts, partitions, nodes, states, causes,
            job_ids, input_path, sinfo_path, events_path, print_format, as_json, as_csv, csv_table, per_job, html_path,
            workers, top_nodes) -> None:
    """Why jobs ended, which hardware hurt them, and which nodes keep doing it.

    Reads `sacct -a -D -X -P` over the window (every incarnation of a requeued job counts),
    joins each job with this tool's AdminComment entries (SGH1:...), and classifies the rest
    from sacct's State alone (marked *). GPU-hours are allocated GPUs x elapsed time.

    \b
    Example: slurm-gpu summary --since 30d --html report.html"""
    from slurm_hooks.summary.accounting import SACCT_FORMAT
    from slurm_hooks.summary.drains import EVENT_FORMAT

    if print_format:
        click.echo(SACCT_FORMAT)
        if input_path or as_json or as_csv or html_path:
            click.echo(f"slurm-gpu: summary: events for --events: sacctmgr -P show event format={EVENT_FORMAT}", err=True)
        return
    if as_json and as_csv:
        fail("summary: --json and --csv exclude each other")
    if (sinfo_path or events_path) and not input_path:
        fail("summary: --sinfo-json and --events go with --input (without it, sinfo and sacctmgr are asked)")
    now = time.time()
    try:
        since = parse_time(since_text, now) if since_text else (None if input_path else parse_time(DEFAULT_SINCE, now))
    except ValueError as exc:
        fail(terminal_safe(f"summary: {exc}"))
    try:
        until = parse_time(until_text, now) if until_text else (None if input_path else now)
    except ValueError as exc:
        fail(terminal_safe("summary: " + str(exc).replace("--since", "--until", 1)))
    if since is not None and until is not None and since >= until:
        fail("summary: --since must be before --until")
    cfg = load_config(config_path)
    _run(cfg, since, until, _values(users), _values(accounts), _values(partitions),
         _expand_nodes(nodes), _values(states), _values(causes), _values(job_ids), input_path, sinfo_path, events_path,
         "json" if as_json else ("csv" if as_csv else "text"), csv_table, per_job, html_path, top_nodes, workers)


def _run(cfg, since, until, users, accounts, partitions, nodes, states, causes, job_ids, input_path, sinfo_path,
         events_path, mode, csv_table, per_job, html_path, top_nodes, workers=None) -> None:
    from healthcheck.safeio import programs
    from healthcheck.slurm import SlurmError
    from slurm_hooks.summary.accounting import (LIVE_DELIMITER, AccountingError, LineCap, LineFeed,
                                                impossible_problem, read_rows, row_blocks, sacct_arguments)
    from healthcheck.config.settings import DrainSettings, SummarySettings
    from slurm_hooks.summary.parallel import tally_file, workers_for
    from slurm_hooks.summary.report import build
    from slurm_hooks.summary.tally import Filters, Tally

    since_iso = _local_iso(since) if since is not None else ""
    until_iso = _local_iso(until) if until is not None else ""
    filters = Filters(since=since_iso, until=until_iso, users=frozenset(users), accounts=frozenset(accounts),
                      partitions=frozenset(partitions), nodes=frozenset(nodes),
                      states=frozenset(s.upper() for s in states), causes=frozenset(c.upper() for c in causes),
                      job_ids=frozenset(job_ids))
    out = sys.stdout
    summary = cfg.typed(SummarySettings)
    jobs_out = JobOutput(mode, out, summary.max_line_bytes) if per_job else None
    tally = Tally(filters, on_job=jobs_out)
    problems: List[str] = []
    notes: List[str] = []
    prefix = cfg.typed(DrainSettings).reason_prefix
    backend = None
    cap = LineCap(summary.max_line_bytes)
    # The saved documents first: one that cannot be read safely stops the command before the
    # accounting is read, not after.
    sinfo_document = _document("--sinfo-json", sinfo_path) if sinfo_path else None
    events_document = _document("--events", events_path) if events_path else None
    try:
        if input_path and not per_job and workers_for(input_path, workers) > 1:
            tally = tally_file(input_path, filters, workers_for(input_path, workers), problems, cap)
        elif input_path:
            with _open_input(input_path) as handle:
                tally.add_chunks(row_blocks(handle, cap, problems))
        else:
            backend = _backend(cfg)
            try:
                sacct = backend.binary("sacct")
            except SlurmError as exc:
                fail(terminal_safe(f"summary: {exc}"), EXIT_UNREADABLE)
            feed = LineFeed(lambda lines: tally.add(read_rows(lines, problems, LIVE_DELIMITER)), cap)
            argv = [sacct] + sacct_arguments(since_iso, until_iso, users, accounts, partitions, nodes, job_ids)
            try:
                code, errors = programs.stream(argv, summary.sacct_timeout_s,
                                              feed.feed, env=backend.env)
            except programs.CommandError as exc:
                fail(terminal_safe(f"summary: {exc}"), EXIT_UNREADABLE)
            feed.close()
            if code != 0:
                detail = [line for line in errors.decode("utf-8", "replace").splitlines() if line.strip()]
                fail(terminal_safe(f"summary: sacct failed: {detail[-1] if detail else 'exit ' + str(code)}"),
                     EXIT_UNREADABLE)
    except AccountingError as exc:
        fail(terminal_safe(f"summary: {exc}"), EXIT_UNREADABLE)
    except BrokenPipeError:
        _reader_went_away()
    except OSError as exc:
        fail(terminal_safe(f"summary: reading {input_path or 'sacct'}: {exc}"), EXIT_UNREADABLE)

    problems += [problem for problem in (cap.problem(), impossible_problem(tally.rejected, tally.set_aside)) if problem]
    drained, drain_note = _drained(backend, sinfo_path, sinfo_document, input_path, prefix)
    if drain_note:
        notes.append(drain_note)
    for node, ours in _drain_events(backend, events_path, events_document, input_path, since_iso, until_iso,
                                    prefix, notes):
        tally.add_drain(node, ours)
    notes += problems
    window = {"since": since_iso or None, "until": until_iso or None}
    report = build(tally, window, drained, notes, summary.offenders,
                   source=f"file {input_path}" if input_path else "sacct")
    if drain_note:
        report["drained_note"] = drain_note
    from slurm_hooks.summary.remediation import load_ledgers, rows as remediation_rows

    report["remediation"] = remediation_rows(load_ledgers(cfg.state_dir), since, until)
    try:
        _write(report, mode, csv_table, jobs_out, html_path, top_nodes, out)
        out.flush()
    except BrokenPipeError:
        _reader_went_away()
    for problem in problems:
        click.echo(terminal_safe(f"slurm-gpu: summary: {problem}"), err=True)
    if problems:
        raise click.exceptions.Exit(EXIT_UNREADABLE)


def _reader_went_away() -> None:
    """stdout closed early (``| head``): stop quietly, as other Unix tools do."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise click.exceptions.Exit(EXIT_UNREADABLE)


def _backend(cfg):
    from healthcheck.slurm import backend_from_config

    return backend_from_config(cfg)


def _document(option: str, path: str):
    """A saved ``--sinfo-json`` / ``--events`` file's bytes (``drains.read_document``: a regular
    file, at most ``MAX_DOCUMENT_BYTES``), or the OSError that made it unreadable (a missing file
    is a note in the report, as before). A FIFO, a device or a file over the cap is one line and
    exit 1, whatever the memory limit: nothing past the cap is read."""
    from healthcheck.safeio.tomlio import FileRefused
    from slurm_hooks.summary.drains import MAX_DOCUMENT_BYTES, read_document

    try:
        return read_document(path)
    except FileRefused as exc:
        fail(terminal_safe(f"summary: {option} {path}: {exc.strerror} (a saved file of at most "
                           f"{MAX_DOCUMENT_BYTES} bytes is read)"), EXIT_UNREADABLE)
    except OSError as exc:
        return exc
    except MemoryError:
        fail(terminal_safe(f"summary: {option} {path}: out of memory reading it"), EXIT_UNREADABLE)


def _first_line(exc: BaseException) -> str:
    """An exception as one line; its type when it says nothing (``MemoryError()``)."""
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__


def _drained(backend, sinfo_path: Optional[str], document, input_path: Optional[str], prefix: str):
    from slurm_hooks.summary.drains import drained_from_sinfo, fetch_sinfo, parse_sinfo_document

    try:
        if isinstance(document, OSError):
            raise document
        if sinfo_path:
            return drained_from_sinfo(parse_sinfo_document(document, sinfo_path), prefix), ""
        if input_path:
            return [], "nodes drained now: not known (--input without --sinfo-json)"
        return drained_from_sinfo(fetch_sinfo(backend), prefix), ""
    except OSError as exc:
        return [], f"nodes drained now: not known ({sinfo_path}: {exc.strerror})"
    except Exception as exc:  # SlurmError, a document that is not sinfo's, MemoryError: a note, not a failure
        return [], f"nodes drained now: not known (sinfo --json: {_first_line(exc)})"


def _drain_events(backend, events_path, document, input_path, since_iso, until_iso, prefix, notes
                  ) -> Iterable[Tuple[str, bool]]:
    from slurm_hooks.summary.drains import drain_events, fetch_events

    try:
        if isinstance(document, OSError):
            raise document
        if events_path:
            lines = document.decode("utf-8", "replace").split("\n")
            return list(drain_events(lines, since_iso, until_iso, prefix))
        if input_path:
            notes.append("drains per node: not counted (--input without --events)")
            return []
        return list(drain_events(fetch_events(backend, since_iso, until_iso), since_iso, until_iso, prefix))
    except OSError as exc:
        notes.append(f"drains per node: not counted ({events_path}: {exc.strerror})")
    except Exception as exc:  # SlurmError, MemoryError: a note, not a failure
        notes.append(f"drains per node: not counted (sacctmgr show event: {_first_line(exc)})")
    return []


def _write(report, mode, csv_table, jobs_out, html_path, top_nodes, out) -> None:
    from slurm_hooks.summary import text

    if html_path:
        from slurm_hooks.summary.html import render_html

        page = render_html(report, time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        try:
            with open(html_path, "w", encoding="utf-8") as handle:
                handle.write(page)
        except OSError as exc:
            fail(terminal_safe(f"summary: --html {html_path}: {exc.strerror}"), EXIT_UNREADABLE)
    if jobs_out is not None:
        jobs_out.finish(report)
        return
    if mode == "json":
        out.write(json_document(versioned(report)) + "\n")
    elif mode == "csv":
        out.write(text.render_csv(report, csv_table))
    else:
        out.write(text.render_text(report, top_nodes))
