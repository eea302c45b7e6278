"""A stand-in for Slurm's commands on a hook's [slurm] bin_dir, for unit-level fault tests.

One script serves ``scontrol``, ``sacct``, ``sacctmgr`` and ``sinfo`` (by the name it runs as).
It keeps one node's line (captured from the lab: tests/fixtures/slurm) in ``node.txt``, applies
``scontrol update ... state=drain|resume`` to it under a lock, and logs every call's argv to
``calls.jsonl``. The file ``mode`` says how Slurm behaves: ``up``; ``down`` (slurmctld and
slurmdbd do not answer: the real commands' error lines, exit 1); ``slow`` (every call sleeps
far past any hook deadline). ``set_lag`` makes ``scontrol show node`` answer late (a busy
slurmctld), which widens any read-then-drain race between hooks. ``set_hang`` makes one command
do its work and then never answer (slurmctld took the drain, the reply was lost). This proves argument building and the hooks' handling of a failing
or slow Slurm; the lab tests prove the hooks against the real one.
"""
from __future__ import annotations

import json
import os
import stat
import sys

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "slurm")
COMMANDS = ("scontrol", "sacct", "sacctmgr", "sinfo")

SCRIPT = r'''#!{python}
import fcntl, json, os, re, sys, time
here = os.path.dirname(os.path.abspath(__file__))
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.path.join(here, "mode")) as handle:
    mode = handle.read().strip()
with open(os.path.join(here, "calls.jsonl"), "a") as log:
    fcntl.flock(log, fcntl.LOCK_EX)
    log.write(json.dumps({{"command": name, "args": args, "mode": mode, "pid": os.getpid()}}) + "\n")
if mode == "slow":
    time.sleep(3600)
if mode == "down":
    if name in ("sacct", "sacctmgr"):
        print(f"{{name}}: error: Problem talking to the database: Connection refused", file=sys.stderr)
    else:
        print("slurm_load_node error: Unable to contact slurm controller (connect failure)", file=sys.stderr)
    sys.exit(1)
lag = os.path.join(here, "lag")
if name == "scontrol" and args[:2] == ["show", "node"] and os.path.exists(lag):
    with open(lag) as handle:
        time.sleep(float(handle.read()))     # a busy slurmctld: widens any read-then-drain race
node_file = os.path.join(here, "node.txt")
with open(os.path.join(here, "node.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    with open(node_file) as handle:
        line = handle.read().strip()
    if name == "scontrol" and args[:2] == ["show", "node"]:
        print(line)
    elif name == "scontrol" and args[:1] == ["update"]:
        fields = dict(arg.split("=", 1) for arg in args[1:])
        base = re.sub(r" Reason=.*$", "", line)
        if fields.get("state") == "drain":
            base = base.replace("State=IDLE ", "State=IDLE+DRAIN ")
            line = base + " Reason=" + fields["reason"] + " [root@2026-11-30T14:43:09]"
        elif fields.get("state") == "resume":
            line = base.replace("State=IDLE+DRAIN ", "State=IDLE ")
        with open(node_file + ".tmp", "w") as handle:
            handle.write(line + "\n")
        os.replace(node_file + ".tmp", node_file)
    elif name == "scontrol" and [a for a in args if a != "--local"][:2] == ["show", "job"]:
        print(f"slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        sys.exit(1)
    elif name == "sacct":
        pass                          # no job in accounting yet: the entry stays queued
    else:
        print(f"{{name}}: the stand-in does not serve {{args}}", file=sys.stderr)
        sys.exit(1)
hang = os.path.join(here, "hang")
if os.path.exists(hang):
    with open(hang) as handle:
        prefix = json.load(handle)
    if [name, *args][:len(prefix)] == prefix:
        time.sleep(3600)              # done, but the answer never comes
'''


class SlurmStandIn:
    def __init__(self, directory: str, mode: str = "up"):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        for command in COMMANDS:
            path = os.path.join(directory, command)
            with open(path, "w") as handle:
                handle.write(SCRIPT.format(python=sys.executable))
            os.chmod(path, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP)
        with open(os.path.join(FIXTURES, "scontrol-show-node-idle.txt")) as handle:
            self._write("node.txt", handle.read())
        self.set_mode(mode)

    def _write(self, name: str, text: str) -> None:
        with open(os.path.join(self.dir, name), "w") as handle:
            handle.write(text)

    def set_mode(self, mode: str) -> None:
        assert mode in ("up", "down", "slow"), mode
        self._write("mode", mode + "\n")

    def set_lag(self, seconds: float) -> None:
        """``scontrol show node`` answers only after ``seconds`` (a busy slurmctld)."""
        self._write("lag", f"{seconds}\n")

    def set_hang(self, *prefix: str) -> None:
        """A call whose argv starts with ``prefix`` (e.g. ``scontrol update``) does its work,
        then never answers."""
        self._write("hang", json.dumps(list(prefix)))

    def calls(self, command: str = "") -> list:
        path = os.path.join(self.dir, "calls.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as handle:
            calls = [json.loads(line) for line in handle]
        return [c for c in calls if not command or c["command"] == command]

    def drains(self) -> list:
        """The reasons of every ``scontrol update ... state=drain`` call that was made."""
        found = []
        for call in self.calls("scontrol"):
            fields = dict(arg.split("=", 1) for arg in call["args"][1:] if "=" in arg)
            if call["args"][:1] == ["update"] and fields.get("state") == "drain":
                found.append(fields.get("reason"))
        return found

    def node_line(self) -> str:
        with open(os.path.join(self.dir, "node.txt")) as handle:
            return handle.read().strip()
