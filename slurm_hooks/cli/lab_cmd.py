"""``slurm-gpu lab up | down | status | env | scenarios | alert``: a real Slurm cluster on this
machine with this project's hooks installed; the demo and the ground for the end-to-end
tests. These command names are a contract: tests outside the project call them."""
from __future__ import annotations

import functools
import json
from typing import Any, Callable, Optional, Tuple

import click

from .common import fail, versioned

EXIT_FAILED = 1


def _lab_paths(directory: Optional[str]):
    from slurm_hooks.lab.paths import LabPaths, lab_dir

    return LabPaths(lab_dir(directory))


def _guarded(action: Callable[..., Any]) -> Callable[..., Any]:
    """Every lab failure becomes one line on stderr and a non-zero exit, never a traceback."""
    @functools.wraps(action)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from slurm_hooks.lab import LabError

        try:
            return action(*args, **kwargs)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except LabError as exc:
            fail(f"lab: {exc}", EXIT_FAILED)
        except PermissionError as exc:
            fail(f"lab: permission denied: {exc.filename or exc}", EXIT_FAILED)
        except OSError as exc:
            fail(f"lab: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}", EXIT_FAILED)
        except KeyboardInterrupt:
            fail("lab: interrupted", 130)
        except Exception as exc:  # a bug still ends in one line, naming what broke
            fail(f"lab: unexpected {type(exc).__name__}: {exc}", EXIT_FAILED)
    return wrapper


dir_option = click.option(
    "--dir", "directory", metavar="DIR", default=None,
    help="Lab directory (default: $SLURM_GPU_LAB_DIR, else /var/tmp/slurm-gpu-lab).")


@click.group()
def lab() -> None:
    """A real Slurm cluster (slurmctld, slurmdbd, three slurmd gpu1..gpu3 with 8 fake GPUs
    each) on this machine, with this project's Prolog, Epilog, EpilogSlurmctld and
    HealthCheckProgram installed from the working tree. Debian 12, as root.

    Example: slurm-gpu lab up && eval "$(slurm-gpu lab env)" && sinfo
    """


@lab.command()
@dir_option
@click.option("--slurm", "version", metavar="VERSION", envvar="SLURM_GPU_LAB_RELEASE", default=None,
              help="The Slurm release to run: 22.05 (the host's Debian 12 packages), 24.11 (Debian 13) or "
                   "26.05 (Debian unstable), each from Debian's own packages; the newer ones in a root "
                   "filesystem built once with debootstrap. Default: $SLURM_GPU_LAB_RELEASE, else "
                   "the lab's default release. Another release than the lab ran starts it from nothing.")
@click.option("--health-interval", "health_interval", type=click.IntRange(min=0, max=86400), default=None,
              metavar="SECONDS", help="slurm.conf's HealthCheckInterval (default: 10, and 1 s per node for "
              "more than 10 nodes); a change restarts slurmctld and the slurmd, and the next `lab up` without "
              "it goes back to the default.")
@click.option("--nodes", "nodes", type=click.IntRange(min=1, max=256), default=None, metavar="N",
              help="How many nodes, gpu1..gpuN, each with its slurmd, its simulated GPUs (the shipped healthy "
                   "H100 profile) and its slurm-gpu-watch (default: 3). Another count than the running lab's "
                   "stops it first; the next `lab up` without it goes back to 3.")
@click.option("--stateless", "stateless_nodes", is_flag=True,
              help="The nodes boot as a diskless image does (Warewulf): the lab's RebootProgram empties a "
                   "rebooted node's state and runtime directories (its simulated GPUs stay). The next "
                   "`lab up` without it turns it off.")
@click.option("--gb200", "gb200", type=click.IntRange(min=0, max=255), default=0, metavar="N",
              help="The last N nodes are GB200 NVL72 compute trays: 4 GPUs each (Gres=gpu:4), the "
                   "gb200-nvl72-healthy profile, one multi-node NVLink domain, their own [[nodes]] group "
                   "(default 0; none again at the next `lab up` without it).")
@click.option("--mig", "mig", type=click.IntRange(min=0, max=255), default=0, metavar="N",
              help="The last N H100 nodes are shared with MIG: the h100-mig profile (GPUs 0-2 cut into "
                   "MIG devices), each MIG device a GRES of its profile's type listed in gres.conf by its "
                   "GPU's and its capability's device files (default 0; none again at the next `lab up` "
                   "without it).")
@click.option("--hooks-off", "hooks_off", is_flag=True,
              help="The baseline bench/scale measures the hooks against: slurm.conf names no Prolog, Epilog, "
                   "EpilogSlurmctld, HealthCheckProgram or TaskProlog, and no slurm-gpu-watch runs. The next "
                   "`lab up` without it puts them back.")
@click.option("--clean", is_flag=True,
              help="Stop the lab and wipe what earlier runs left (the hooks' state and outbox, jobs' output, "
                   "slurmctld's state, the slurmd spools, the accounting database) before starting it.")
@_guarded
def up(directory: Optional[str], version: Optional[str], health_interval: Optional[int], nodes: Optional[int],
       stateless_nodes: bool, hooks_off: bool, clean: bool, gb200: int, mig: int) -> None:
    """Install what is missing, start every daemon and one slurm-gpu-watch per node, install the
    hooks (idempotent).

    Example: slurm-gpu lab up --slurm 24.11
    """
    from slurm_hooks.lab import cluster

    paths = _lab_paths(directory)
    cluster.up(paths, click.echo, version, health_interval=health_interval, clean=clean, nodes=nodes,
               stateless_nodes=stateless_nodes, hooks=not hooks_off, gb200=gb200, mig=mig)
    for line in cluster.describe_up(paths):
        click.echo(line)


@lab.command()
@dir_option
@_guarded
def down(directory: Optional[str]) -> None:
    """Cancel the lab's jobs and stop every lab daemon by PID; logs are kept.

    Example: slurm-gpu lab down
    """
    from slurm_hooks.lab import cluster

    cluster.down(_lab_paths(directory), click.echo)


@lab.command()
@dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_guarded
def status(directory: Optional[str], as_json: bool) -> None:
    """What runs (daemon, pid) and the node states. Exit 0 when all runs, 3 when nothing
    does, 1 when only part of it does.

    Example: slurm-gpu lab status --json
    """
    from slurm_hooks.lab import cluster, releases

    paths = _lab_paths(directory)
    rows, states, detail = cluster.status(paths)
    running = [name for name, pid in rows if pid]
    release = releases.current(paths)
    rss = {name: cluster.rss_kib(pid) for name, pid in rows if pid}
    if as_json:
        click.echo(json.dumps(versioned({"dir": paths.root, "daemons": {n: p for n, p in rows},
                                         "rss_kib": rss, "nodes": states, "slurm": release.version}),
                              indent=2, sort_keys=True))
    else:
        click.echo(f"lab directory: {paths.root}")
        click.echo(f"slurm: {release.describe()}")
        for name, pid in rows:
            click.echo(f"  {name:<12} {'running, pid ' + str(pid) if pid else 'stopped'}")
        if rss:
            click.echo(f"  resident memory: {sum(v for v in rss.values() if v) / 1024:.0f} MiB in all "
                       "(each daemon's: --json, rss_kib)")
        for line in detail:
            click.echo(f"  {line}")
    if len(running) == len(rows):
        return
    raise click.exceptions.Exit(3 if not running else EXIT_FAILED)


@lab.command()
@dir_option
@click.option("--out", "out", metavar="DIR", default=None,
              help="Where to write (default: the checkout's tests/fixtures/slurm/releases/VERSION).")
@_guarded
def capture(directory: Optional[str], out: Optional[str]) -> None:
    """Run a few jobs on the running lab and write what its Slurm release prints (scontrol,
    squeue, sacct, sinfo, text and JSON; AdminComment as sacctmgr stores it; each hook's
    environment) as the backend's test fixtures. scripts/capture-slurm-fixtures does every release.

    Example: slurm-gpu lab up --slurm 24.11 && slurm-gpu lab capture
    """
    from slurm_hooks.lab.capture import capture as run_capture

    run_capture(_lab_paths(directory), out, click.echo)


@lab.command()
@click.argument("alertname")
@click.argument("node")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0, max=3600), default=0, metavar="SECONDS",
              help="Ask the lab's Prometheus again every second until it fires, at most this long.")
@_guarded
def alert(alertname: str, node: str, wait_s: float) -> None:
    """Print ALERTNAME firing for NODE in the lab's Prometheus (exit 0), or say it is not (exit 1).
    Only that node's alert: another node's (one resumed minutes ago) is not printed.

    Example: slurm-gpu lab alert SlurmGpuNodeDrained gpu2 --wait 90
    """
    import os

    from slurm_hooks.lab import monitoring

    base = os.environ.get(monitoring.PROMETHEUS_ENV) or monitoring.prometheus_url()
    found = monitoring.wait_firing(base, alertname, node, wait_s)
    for item in found:
        click.echo(monitoring.alert_line(item))
    if not found:
        fail(f"lab: {alertname} is not firing for {node} (see {base}/alerts)", EXIT_FAILED)


@lab.command()
@dir_option
@_guarded
def env(directory: Optional[str]) -> None:
    """Print export lines: eval "$(slurm-gpu lab env)" points sbatch, sinfo, sacct and
    slurm-gpu sim at the lab.

    Example: eval "$(slurm-gpu lab env)"
    """
    from slurm_hooks.lab import cluster

    for line in cluster.env_lines(_lab_paths(directory)):
        click.echo(line)


@lab.command()
@dir_option
@click.option("--only", "only", multiple=True, metavar="NAME",
              help="Run only these scenarios (repeatable); see --list.")
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--timeout", "timeout", type=click.FloatRange(min=30), default=600, show_default=True,
              help="Give up on the whole run after this many seconds.")
@_guarded
def scenarios(directory: Optional[str], only: Tuple[str, ...], list_only: bool, as_json: bool,
              timeout: float) -> None:
    """Submit jobs that end every way (COMPLETED, FAILED, CANCELLED, TIMEOUT, PREEMPTED,
    requeued, NODE_FAIL, OUT_OF_MEMORY, 3 nodes, GPU/NVLink/IB faults injected mid-job),
    wait for them and print per job the id, the scenario and what sacct says. Exit 1 when
    a job did not end as its scenario expects.

    Example: slurm-gpu lab scenarios --only completed --json
    """
    from slurm_hooks.lab import scenarios as S

    table = S.load_table()
    if list_only:
        for scenario in table:
            click.echo(f"{scenario.name:<16} {scenario.expect_state:<14} {scenario.title}")
        return
    unknown = [name for name in only if name not in {s.name for s in table}]
    if unknown:
        fail(f"lab: unknown scenario {', '.join(unknown)} (see: slurm-gpu lab scenarios --list)")
    chosen = [s for s in table if not only or s.name in only]
    paths = _lab_paths(directory)
    results = S.run_scenarios(paths, chosen, echo=(lambda _m: None) if as_json else click.echo,
                              timeout=timeout)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in results], indent=2, sort_keys=True))
    else:
        click.echo("")
        for line in S.format_results(results):
            click.echo(line)
        click.echo("")
        click.echo("what an admin would look at next:")
        for hint in S.ADMIN_HINTS:
            click.echo("  " + hint.replace("$LAB", paths.root))
    if not all(r.ok for r in results):
        raise click.exceptions.Exit(EXIT_FAILED)


def _write_results(path: str, doc: dict) -> None:
    """The results file, 0644 whatever the umask, replaced whole (never half written)."""
    from healthcheck.safeio.fsutil import atomic_write

    atomic_write(path, json.dumps(doc, indent=2, sort_keys=True) + "\n", mode=0o644)


@lab.command()
@dir_option
@click.option("--minutes", "minutes", type=click.FloatRange(min=0, max=7 * 24 * 60), default=0,
              metavar="M", help="How long faults are injected and jobs submitted (added to --hours).")
@click.option("--hours", "hours", type=click.FloatRange(min=0, max=7 * 24), default=0, metavar="H",
              help="How long, in hours (added to --minutes).")
@click.option("--seed", "seed", type=click.IntRange(min=0, max=2 ** 31 - 1), default=None, metavar="S",
              help="The schedule's seed: the same seed, the same jobs, faults, restarts and kills at the "
                   "same times (default: drawn, and written in the results).")
@click.option("--faults", "max_faults", type=click.IntRange(min=0, max=100000), default=None, metavar="N",
              help="Inject at most N hardware faults (default: as many as the schedule draws).")
@click.option("--settle-seconds", "settle_s", type=click.FloatRange(min=30, max=3600), default=180,
              show_default=True, help="After a fault is mended, how long its node has to be back in service "
                                      "(a drain that starts by then is the fault's).")
@click.option("--disk-full-seconds", "disk_full_s", type=click.FloatRange(min=10, max=3600), default=60,
              show_default=True, help="How long the hooks' state disk stays full each time it is filled "
                                      "(every 15 to 30 minutes, the first within the soak's first quarter).")
@click.option("--sample-seconds", "sample_s", type=click.FloatRange(min=1, max=600), default=10,
              show_default=True, help="How often each watcher's RSS and open descriptors are read.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of the table.")
@click.option("--out", "out", metavar="FILE", default=None, help="Also write the results JSON to FILE.")
@_guarded
def soak(directory: Optional[str], minutes: float, hours: float, seed: Optional[int], max_faults: Optional[int],
         settle_s: float, disk_full_s: float, sample_s: float, as_json: bool, out: Optional[str]) -> None:
    """Run the lab that is up under faults for a while (remediation on): jobs of every shape end
    continuously, hardware faults of every kind the simulator has are injected on random nodes
    and mended, slurmdbd and slurmctld are restarted and watchers killed at random, the hooks' state
    disk is filled for a while (--disk-full-seconds). Prints what
    it saw (docs/reliability.md). Exit 1 when a job's record was lost, a node drained with no
    fault injected, or an injected fault was not drained with its cause.

    Example: slurm-gpu lab soak --hours 2 --seed 7 --out soak.json
    """
    import random
    import time

    from slurm_hooks.lab import soak as S

    seconds = hours * 3600 + minutes * 60
    if seconds < 60:
        fail("lab: soak: give --minutes and/or --hours, one minute at least")
    if seed is None:
        seed = random.SystemRandom().randrange(2 ** 31)
    paths = _lab_paths(directory)
    # The H100 nodes: the soak's faults name GPUs 0-7 (a GB200 tray has 4).
    nodes = tuple(node for node in paths.nodes() if node not in paths.gb200_nodes())
    plan = S.Plan(seconds=seconds, nodes=nodes, settle_s=settle_s, max_faults=max_faults,
                  disk_for=(disk_full_s, disk_full_s))
    began = time.time()
    doc = versioned(S.run_soak(paths, plan, seed, echo=(lambda _m: None) if as_json else click.echo,
                               sample_s=sample_s))
    doc["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began))
    if out:
        _write_results(out, doc)
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        click.echo("")
        for line in S.format_table(doc):
            click.echo(line)
    if S.verdict(doc):
        for problem in S.verdict(doc):
            click.echo(f"slurm-gpu: lab: soak: {problem}", err=True)
        raise click.exceptions.Exit(EXIT_FAILED)
