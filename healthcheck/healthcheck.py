"""``slurm-gpu-healthcheck``: Slurm's HealthCheckProgram.

Slurm gives it no environment but SLURMD_NODENAME (no PATH, no SLURM_CONF) and ignores its
exit status, so anything it concludes must be acted on by the program itself: it runs the
health tier, decides (``healthcheck.actions``) and drains or resumes its own node
(``healthcheck.health.run``). The whole run has a deadline below slurmd's 60-second kill.

It fails open: a broken config, a bug or the watchdog firing is one loud line and exit 0,
never a drain. Bad command-line input is one line and exit 2. Kept lean: no click, no jinja2.
"""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace
TYPE_CHECKING = False       # typing.TYPE_CHECKING without importing typing (2 ms) before main
if TYPE_CHECKING:
    from typing import Optional, Sequence

PROG = "slurm-gpu-healthcheck"
HEALTH_TIER = "health"        # health.run.TIER (run_checks refuses probes started for another tier)


def parse(argv: Optional[Sequence[str]]):
    """The options; slurmd passes none, and then argparse is not even loaded (every node, every
    few minutes)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return SimpleNamespace(config=None, node=None, dry_run=False, json=False)
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:          # one line, exit 2; never argparse's usage dump
            print(f"{PROG}: {message}", file=sys.stderr)
            sys.exit(2)

    from .hooklib.skeleton import admin_help

    parser = _Parser(prog=PROG, description=admin_help("healthcheck", "Check this node's GPUs and links; drain or "
                                                                     "resume it in Slurm."),
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="Example:\n  slurm-gpu-healthcheck --dry-run --json   # what this node's next run would do")
    parser.add_argument("--config", help="config file (default: $SLURM_GPU_HOOKS_CONFIG, else /etc/slurm-gpu-hooks/config.toml)")
    parser.add_argument("--node", help="node name (default: $SLURMD_NODENAME, else the short hostname)")
    parser.add_argument("--dry-run", action="store_true", help="decide and print the scontrol call; change nothing")
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    return parser.parse_args(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .hooklib.nogc import short_process

    with short_process():      # before the imports: a hook is one short process
        from .hooklib.skeleton import serve

        return serve("healthcheck", argv, _body, start=_start, deadline=_deadline,
                     on_watchdog=_stopped_by_watchdog, on_error=_tool_error)


def _deadline(config) -> float:
    from .config.settings import HealthSettings

    return config.typed(HealthSettings).deadline_s


def _start(argv: Optional[Sequence[str]]):
    """The options and the node (bad ones: one line, exit 2), the config (the default one not
    usable: exit 0; a --config that is not: exit 2)."""
    from .config import node_name
    from .hooklib.skeleton import start

    args = parse(argv)
    try:
        node = node_name(args.node, os.environ)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    run = start("healthcheck", os.environ, node=node, config_path=args.config)
    if not isinstance(run, int):
        run.options, run.job_id = args, None
    return run


def _body(run):
    from .hooklib.skeleton import Ending

    args = run.options
    result = _run(run.config, run.node, args.dry_run)
    if args.json:
        import json

        print(json.dumps(result.to_json(), sort_keys=True))
    elif args.dry_run or sys.stdout.isatty():
        print(_human(result))
    if args.dry_run:
        return Ending(0)
    return Ending(0, {"result": result.decision.kind, "rule": result.decision.rule, "status": result.report.status,
                      "pending": len(result.tally.pending), "committed": result.committed})


def _stopped_by_watchdog(run, deadline: float, where: str):
    from .hooklib.skeleton import Ending
    from .hooklib.watchdog import done_so_far, progress

    done, changed = progress(), done_so_far("nothing drained")
    print(f"{PROG}: {run.node}: the run took longer than {deadline:g} s ([health] deadline_s) and was stopped "
          f"at {where or 'an unknown step'}; {changed}, nothing committed: the next run decides again",
          file=sys.stderr)
    return Ending(0, {"result": "watchdog", "at": where, "done": done})


def _tool_error(run, exc: Exception):
    """The tool being broken is never the node being broken: nothing done, exit 0."""
    from .hooklib.skeleton import Ending
    from .safeio.fsutil import NewerFormat

    if isinstance(exc, NewerFormat):
        # A rollback: a newer version's state file, left as it is until that version is back.
        print(f"{PROG}: {run.node}: nothing done: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return Ending(0, {"result": "newer-state", "error": f"{exc.filename}: {exc.strerror}"})
    print(f"{PROG}: {run.node}: internal error, nothing done: {type(exc).__name__}: {exc}", file=sys.stderr)
    return Ending(0, {"result": "error", "error": f"{type(exc).__name__}: {exc}"})


def _run(config, node: str, dry_run: bool):
    from .remediate import health_reads
    from .runner import start_probes
    from .sources import node_sources

    sources = node_sources(config, node)
    # The probes' children start first; the decision's code (the Actions layer, the Slurm
    # backend, the outputs) is loaded while they run.
    probes = start_probes(config, node, HEALTH_TIER, sources=sources, extra_reads=health_reads(config))
    probes.load_checks()
    from .health.outputs import write_all
    from .health.policy import HealthPolicy
    from .health.run import POST_DECISION_STEPS, run_health
    from .slurm import backend_from_config

    policy = config.typed(HealthPolicy)
    result = run_health(config, node, backend_from_config(config), sources, dry_run=dry_run, probes=probes)
    for finding in result.report.findings:
        if finding.status == "error" and finding.action != "drain":
            # The tool could not look (a probe timed out, the kernel log is unreadable): said
            # every run it lasts, never a drain unless the config makes a timeout one.
            print(f"{PROG}: {node}: {finding.check}: {finding.message}", file=sys.stderr)
    if dry_run:
        return result
    for problem in write_all(result, sources.state_dir, policy.textfile_dir, policy.syslog):
        print(f"{PROG}: {node}: {problem}", file=sys.stderr)
    for step in POST_DECISION_STEPS:
        try:
            step(result, config)
        except Exception as exc:  # noqa: BLE001 - a later step never undoes the decision
            print(f"{PROG}: {node}: post-decision step {getattr(step, '__name__', step)} failed: {exc}",
                  file=sys.stderr)
    return result


def _human(result) -> str:
    import json

    decision = result.decision
    lines = [f"{result.node}: {decision.kind} [{decision.rule}] {decision.why}"]
    if decision.reason:
        lines.append(f"  reason:   {decision.reason}")
    if result.applied.argv:
        lines.append("  scontrol: " + " ".join(json.dumps(arg) if " " in arg else arg for arg in result.applied.argv))
    for finding in result.report.findings:
        lines.append(f"  {finding.status:5} {finding.check}: {finding.message}")
    for cause, count, needed in result.tally.pending:
        lines.append(f"  pending  {cause.key}: failing {count} of {needed} runs needed to drain")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
