"""The hook server (``healthcheck/watch/hookserver.py``) and the hooks as its clients
(``healthcheck/hooklib/client.py``): a hook with no server runs in its own process at once; a
served prolog, epilog and health check on a simulated node end as the in-process ones do (exit
status, baseline, record, journal, drain line); only root or the server's own user is served;
a client killed mid-run takes the server's child and its probe children with it; the server
never initialised NVML (and serves nothing if it had)."""
from __future__ import annotations

import configparser
import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from healthcheck.hooklib import client
from healthcheck.records import store
from healthcheck.watch import hookserver
from slurm_hooks import epilog, prolog

from .conftest import ROOT
from .test_job_hooks import inject, journal, node  # noqa: F401 - the hooks' simulated node and its helpers

# The server as slurm-gpu-watch forks it: the node's NVML binding (here the simulator's) imported.
SERVER = ("import sys; from healthcheck.config import Config; from healthcheck.sources import node_sources; "
          "from healthcheck.watch.hookserver import main_loop; "
          "sys.exit(main_loop(sys.argv[1]{allowed}, binding=node_sources(Config.load(None), 'gpu1').nvml.spec))")


@pytest.fixture(autouse=True)
def socket_dir(node, tmp_path):
    """The hooks' tests' simulated node (tests/test_job_hooks.py), and a short socket path for
    this test's server (a Unix socket's path is at most 107 bytes)."""
    run = f"/tmp/sgh-hs-{os.getpid()}-{tmp_path.name[-12:]}"
    node.update(tmp=tmp_path, socket=os.path.join(run, "hooks.sock"))
    yield
    shutil.rmtree(run, ignore_errors=True)


class Server:
    """``main_loop`` in its own process (as ``slurm-gpu-watch`` forks it), logging to a file."""

    def __init__(self, node, allowed=None):
        self.path, self.log = node["socket"], str(node["tmp"] / "server.log")
        code = SERVER.format(allowed="" if allowed is None else f", {allowed!r}")
        with open(self.log, "w") as out:
            self.process = subprocess.Popen([sys.executable, "-c", code, self.path], stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=out, env=dict(os.environ), start_new_session=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.path):
            assert self.process.poll() is None, self.text()
            assert time.monotonic() < deadline, self.text()
            time.sleep(0.05)
        node["env"].setenv(client.SOCKET_ENV, self.path)

    def text(self):
        with open(self.log) as handle:
            return handle.read()

    def children(self):
        return _descendants(self.process.pid)

    def stop(self):
        self.process.terminate()
        self.process.wait(30)


@pytest.fixture
def server(node):
    started = Server(node)
    yield started
    started.stop()


# -- no server ------------------------------------------------------------------------------------
def test_a_hook_with_no_server_runs_in_its_own_process_at_once(node, capfd):
    node["env"].setenv(client.SOCKET_ENV, node["socket"])          # nothing listens there
    assert client.served("prolog", []) is None
    assert prolog.main([]) == 0
    assert store.read_baseline(node["state"], "5", "gpu1")["gpus"] == [2, 3]
    assert journal(node)[-1]["result"] == "ok"
    assert "hook server" not in capfd.readouterr().err                # the usual case: silent


def test_a_socket_nobody_accepts_on_is_given_up_and_the_hook_runs_in_process(node, capfd):
    import socket

    os.makedirs(os.path.dirname(node["socket"]), mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(node["socket"])
    listener.listen(4)                    # connects, never answered (a hung server)
    node["env"].setenv(client.SOCKET_ENV, node["socket"])
    try:
        assert client.served("prolog", []) is None
        assert prolog.main([]) == 0
    finally:
        listener.close()
    assert journal(node)[-1]["result"] == "ok"
    assert "did not take the request" in capfd.readouterr().err


# -- served --------------------------------------------------------------------------------------
def test_a_served_prolog_and_epilog_end_as_in_process_ones(node, server, capfd):
    code = client.served("prolog", [])
    assert code == 0                                         # run by the server (None: in process)
    baseline = store.read_baseline(node["state"], "5", "gpu1")
    assert baseline["gpus"] == [2, 3] and len(baseline["gpu_facts"]) == 8
    assert journal(node)[-1]["result"] == "ok" and journal(node)[-1]["hook"] == "prolog"

    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    assert client.served("epilog", []) == 0
    served_record = store.read_record(node["state"], "5", "gpu1")
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "prolog_slurmd")
    node["env"].setenv("SLURM_JOB_ID", "6")
    node["env"].setenv(client.SOCKET_ENV, "")
    assert prolog.main([]) == 0
    node["env"].setenv("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    assert epilog.main([]) == 0
    local_record = store.read_record(node["state"], "6", "gpu1")
    assert served_record["class"] == local_record["class"]
    assert served_record["gpus"] == local_record["gpus"]
    served_runs = [(r["hook"], r["result"]) for r in journal(node) if r.get("job_id") == "5"]
    local_runs = [(r["hook"], r["result"]) for r in journal(node) if r.get("job_id") == "6"]
    assert served_runs == local_runs == [("prolog", "ok"), ("epilog", served_runs[1][1])]


def test_a_served_prolog_on_a_bad_gpu_stops_the_job_and_says_so_on_the_hooks_stderr(node, server, capfd):
    inject(node, "gpu.3.ecc.volatile_uncorrected=2")
    assert client.served("prolog", []) == 1
    served_err = capfd.readouterr().err
    assert journal(node)[-1]["result"] == "bad-node"
    node["env"].setenv(client.SOCKET_ENV, "")
    node["env"].setenv("SLURM_JOB_ID", "6")
    assert prolog.main([]) == 1
    local_err = capfd.readouterr().err
    assert journal(node)[-1]["result"] == "bad-node"
    # The child wrote to this process's own stderr (passed over the socket): the same lines.
    assert served_err.replace("job 5", "job 6") == local_err and "not drained" in served_err


def test_a_served_health_check_decides_as_the_in_process_one(node, server, capfd):
    from healthcheck import healthcheck

    inject(node, "gpu.1.ecc.volatile_uncorrected=2")
    node["env"].delenv("SLURM_JOB_ID")
    node["env"].delenv("SLURM_SCRIPT_CONTEXT")
    assert client.served("healthcheck", ["--dry-run", "--json"]) == 0
    served = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    node["env"].setenv(client.SOCKET_ENV, "")
    assert healthcheck.main(["--dry-run", "--json"]) == 0
    local = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    for key in ("decision", "reason", "rule", "status", "scontrol", "pending"):
        assert served[key] == local[key], key
    assert [f["check"] for f in served["findings"]] == [f["check"] for f in local["findings"]]
    assert any(f["status"] != "ok" and f.get("gpu") == 1 for f in served["findings"])


def test_the_server_serves_no_one_but_root_or_its_own_user(node):
    refused = Server(node, allowed=[os.geteuid() + 4242])
    try:
        assert client.served("prolog", []) is None             # closed unanswered: the hook runs here
        assert not os.path.exists(os.path.join(node["state"], "hook-runs", "gpu1.jsonl"))
        assert "refused a request from uid" in refused.text()
        assert refused.children() == []
    finally:
        refused.stop()


def test_the_socket_is_private_and_a_link_or_an_open_directory_is_refused(node, tmp_path):
    server = Server(node)
    try:
        folder = os.lstat(os.path.dirname(server.path))
        assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.geteuid()
        assert stat.S_IMODE(os.lstat(server.path).st_mode) == 0o600
    finally:
        server.stop()
    assert not os.path.exists(server.path)                    # gone with the server
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o755)
    with pytest.raises(ValueError, match="mode 0700"):
        hookserver.listen(str(open_dir / "hooks.sock"))
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(ValueError, match="link"):
        hookserver.listen(str(tmp_path / "link" / "hooks.sock"))
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "hooks.sock").write_text("not a socket")
    with pytest.raises(ValueError, match="not a socket"):
        hookserver.listen(str(private / "hooks.sock"))


def test_a_client_killed_mid_run_takes_the_servers_child_and_its_probes_with_it(node, server):
    inject(node, 'node.nvml="hang"')                          # the NVML probe blocks in the driver
    with open(node["config"], "a") as handle:
        handle.write("[prolog]\ndeadline_s = 120\n")
    text = node["tmp"] / "config.toml"
    text.write_text(text.read_text().replace("probe_timeout_s = 2.0", "probe_timeout_s = 30.0"))
    hook = subprocess.Popen([sys.executable, "-c", "import sys; from slurm_hooks.prolog import main; sys.exit(main())"],
                            env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(node["tmp"] / "hook.err", "w"))
    deadline = time.monotonic() + 60
    while not server.children() or not _descendants(server.children()[0]):
        assert hook.poll() is None and time.monotonic() < deadline, \
            server.text() + (node["tmp"] / "hook.err").read_text()
        time.sleep(0.05)
    child = server.children()[0]
    probes = _descendants(child)                              # the hung NVML probe's child
    hook.kill()                                               # slurmd's kill at PrologEpilogTimeout
    hook.wait()
    deadline = time.monotonic() + 20                          # the probe's own timeout is 30 s
    # The server says so after its kill: on a busy machine the group can be seen dead first.
    while any(_alive(pid) for pid in [child, *probes]) or "went away: killed its process group" not in server.text():
        assert time.monotonic() < deadline, server.text()
        time.sleep(0.05)
    assert server.process.poll() is None                      # the server goes on


def _descendants(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- NVML and fork ----------------------------------------------------------------------------------
def test_a_server_that_initialised_nvml_serves_nothing(node):
    code = ("import sys; from healthcheck.config import Config; from healthcheck.sources import node_sources; "
            "nvml = node_sources(Config.load(None), 'gpu1').nvml; nvml.nvmlInit(); "
            "from healthcheck.watch.hookserver import main_loop; sys.exit(main_loop(sys.argv[1], binding=nvml.spec))")
    done = subprocess.run([sys.executable, "-c", code, node["socket"]], env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "NVML is initialised in this process" in done.stderr
    assert not os.path.exists(node["socket"])


def test_the_hook_socket_names_the_watchers_node(monkeypatch):
    """``[watch] hook_socket`` with ``{node}``: several nodes on one host (the lab) serve apart."""
    from healthcheck.watch import service

    asked = []
    monkeypatch.setattr(hookserver, "start", lambda path, binding=None: asked.append(path) or 4242)
    settings = service.WatchSettings(serve_hooks=True, hook_socket="/run/sgh/{node}/hooks-{node}.sock")
    assert service.start_hook_server(settings, None, "gpu2") == 4242
    assert asked == ["/run/sgh/gpu2/hooks-gpu2.sock"]
    assert service.hook_socket(service.WatchSettings(), "gpu2") == client.DEFAULT_SOCKET


def test_only_a_served_run_says_so_in_the_journal(node, server):
    assert client.served("prolog", []) == 0
    assert journal(node)[-1]["served"] is True
    node["env"].setenv(client.SOCKET_ENV, "")
    node["env"].setenv("SLURM_JOB_ID", "6")
    assert prolog.main([]) == 0
    assert "served" not in journal(node)[-1]


# -- the protocol and the table -------------------------------------------------------------------
def test_a_request_holds_the_hooks_arguments_and_environment_as_data(node):
    node["env"].setenv("ODD", "a b; $(rm -rf /) 'x'\n")
    body = client.encode("healthcheck", ["--dry-run", "--node", "gpu 1"])
    hook, cwd, mask, args, env = client.decode(body[4:])
    assert (hook, args) == ("healthcheck", ["--dry-run", "--node", "gpu 1"])
    assert env[b"ODD"] == b"a b; $(rm -rf /) 'x'\n" and cwd == os.getcwd()
    with pytest.raises(ValueError):
        client.decode(b"something else\0x")


def test_the_servers_hooks_are_the_console_scripts_slurm_runs():
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    scripts = dict(line.replace(" ", "").split("=", 1)
                   for line in parser["options.entry_points"]["console_scripts"].strip().splitlines())
    assert {f"slurm-gpu-{hook}": spec for hook, spec in hookserver.HOOKS.items()} == \
        {name: scripts[name] for name in ("slurm-gpu-prolog", "slurm-gpu-epilog", "slurm-gpu-healthcheck")}


def test_the_client_imports_nothing_the_interpreter_does_not_hold():
    code = ("import sys; before = set(sys.modules); import healthcheck.hooklib.client as c; "
            "print(sorted(set(sys.modules) - before - {'healthcheck', 'healthcheck.hooklib', c.__name__}))")
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_hook_started_without_stdin_is_served_all_the_same(node, server):
    """slurmd may start a hook with descriptor 0 closed: /dev/null goes in its place."""
    code = ("import os, sys; os.close(0); from healthcheck.hooklib.client import served; "
            "rc = served('prolog', []); sys.exit(99 if rc is None else rc)")
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "hook server" not in done.stderr
    assert journal(node)[-1]["result"] == "ok"


def test_a_served_health_check_decides_as_an_in_process_one_run_after_run_as_counters_change(node):
    """Two identical simulated nodes (the benchmark's, with its Slurm stand-ins: the runs commit
    their counter history), the same ECC counts injected before each run; one node's health
    checks served (the server keeps its history parsed between them), the other's in process.
    Each run decides the same; the growth the history holds drains both at the same run."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import workloads as W

    served_node, local_node = (W.HookNode(str(node["tmp"] / name), sys.executable, ROOT) for name in ("a", "b"))
    env = dict(os.environ, **served_node.healthcheck_env())
    code = SERVER.format(allowed="")
    with open(node["tmp"] / "server.log", "w") as out:
        process = subprocess.Popen([sys.executable, "-c", code, node["socket"]], stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=out, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(node["socket"]):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        decided = []
        for count in (0, 400, 1500, 1500, 2600):
            runs = []
            for hook_node, socket in ((served_node, node["socket"]), (local_node, "")):
                done = subprocess.run(["slurm-gpu", "sim", "inject", "--config", hook_node.config, W.NODE,
                                       f"gpu.1.ecc.volatile_corrected={count}"], capture_output=True, text=True,
                                      env=dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
                                               + os.environ.get("PATH", "")))
                assert done.returncode == 0, done.stderr
                hook_env = dict(hook_node.healthcheck_env(), **{client.SOCKET_ENV: socket})
                done = subprocess.run(hook_node.hook_argv("healthcheck") + ["--json"], capture_output=True,
                                      text=True, env=hook_env, timeout=120)
                assert done.returncode == 0 and "hook server" not in done.stderr, done.stderr
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            served, local = runs
            for key in ("decision", "reason", "rule", "status", "pending", "committed"):
                assert served[key] == local[key], (count, key)
            assert ([(f["check"], f["status"], f.get("gpu")) for f in served["findings"]]
                    == [(f["check"], f["status"], f.get("gpu")) for f in local["findings"]]), count
            decided.append(served["decision"])
        assert decided[:2] == ["none", "none"] and "drain" in decided, decided
        with open(os.path.join(served_node.state_dir, "counters", f"{W.NODE}.json")) as handle:
            kept = json.load(handle)["series"]
        assert [value for _, value in next(v for k, v in kept.items() if k.endswith("ecc.volatile_corrected")
                                           and "0001" in k)][-1] == 2600.0
    finally:
        process.terminate()
        process.wait(30)
