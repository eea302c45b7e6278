"""Property-based fuzzing (hypothesis) of every parser of outside input: kernel-log lines in every
source format, line prefixes, sysfs values, scontrol/sacct output, dcgmi JSON, config files and
simulator profiles. Each either gives a result or its own one-line error, never a crash; and a
malformed config never makes a hook fail (for the prolog: drain) or call scontrol.

Runs are kept short (``FAST``): the whole file takes a few seconds.
"""
from __future__ import annotations

import os
import string
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from healthcheck.safeio import tomlio
from healthcheck.config import Config, ConfigError
from healthcheck.facts import parse_numbered, parse_rate
from healthcheck.xid.events import XidEvent
from healthcheck.kernellog.parser import Companion, message_start, parse_line, parse_line_split
from healthcheck.kernellog.scanner import LineScanner
from healthcheck.kernellog.timestamps import PrefixClock
from healthcheck.probes import ib_sysfs
from healthcheck.probes.dcgm_diag import parse_diag
from healthcheck.sim import profile as profiles
from healthcheck.slurm.cli_backend import CliBackend, parse_scontrol_record

FAST = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

REAL_LINES = [
    b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    b"NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU.",
    b"NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=99, name=train.py, Graphics SM Warp Exception",
    b"NVRM: Xid (PCI:0000:04:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
    b"NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000)",
    b"NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
    b"NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-1234-4c1d-9e2b-8a6f3d0c0003",
    b"nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
]
PREFIXES = [b"", b"[ 8812.332117] ", b"[Sun Feb 23 16:24:18 2025] ", b"kern  :warn  : [ 1.5] ",
            b"Feb 23 16:24:18 gpu001 kernel: ", b"Feb 23 16:24:18 gpu001 kernel: [ 8812.332117] ",
            b"2025-02-23T16:24:18.500000+01:00 gpu001 kernel: ", b"1740324258.123456 gpu001 kernel: ",
            b"[ 8812.332117] gpu001 kernel: ", b"4,1234,8812332117,-;"]

real_lines = st.sampled_from(REAL_LINES)
prefixes = st.sampled_from(PREFIXES)


def mutate(data: bytes, draw) -> bytes:
    """Cut, splice or flip bytes of a real line."""
    kind = draw(st.sampled_from(["cut", "insert", "flip", "replace"]))
    at = draw(st.integers(0, len(data)))
    if kind == "cut":
        return data[:at]
    junk = draw(st.binary(min_size=1, max_size=20))
    if kind == "insert":
        return data[:at] + junk + data[at:]
    if kind == "flip" and data:
        index = min(at, len(data) - 1)
        return data[:index] + bytes([data[index] ^ draw(st.integers(1, 255))]) + data[index + 1:]
    return data[:at] + junk + data[at + len(junk):]


@st.composite
def log_lines(draw):
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(st.binary(max_size=300))
    prefix = draw(prefixes)
    if choice == 1:
        return prefix + draw(st.binary(max_size=200))
    return prefix + mutate(draw(real_lines), draw)


@FAST
@given(log_lines())
@example(b"\xff\xfe[1.0] NVRM: Xid (PCI:0000:3b:00): 79, x")
@example(b"4,1,2,-;" + b"9" * 5000)
def test_any_line_in_any_format_parses_or_is_ignored(line):
    parsed, start = parse_line_split(line, PrefixClock(reference=1.7e9, boot_time=1.6e9))
    assert parsed is None or isinstance(parsed, (XidEvent, Companion))
    if isinstance(parsed, XidEvent):
        # Whatever was accepted starts the kernel message, right after a kernel prefix.
        assert start == message_start(line) >= 0
        assert line[start:].startswith((b"NVRM: ", b"nvidia-nvswitch", b"SXid ("))
        assert 0 <= parsed.code < 10 ** 9 and len(parsed.message) <= 2000


@FAST
@given(prefixes, st.text(max_size=120).map(lambda s: s.encode("utf-8", "surrogatepass")), real_lines)
def test_user_chosen_text_in_a_kernel_message_is_never_an_event(prefix, user_text, real):
    # What the kernel logs with a user-chosen exec name or segfaulting comm and file name.
    chosen = user_text + real
    for body in (b"process 'sh' launched '" + chosen + b"' with NULL argv: empty string added",
                 chosen[:15] + b"[42]: segfault at 0 ip 0 sp 0 error 4 in " + chosen + b"[5000+1000]"):
        assert parse_line(prefix + body, PrefixClock()) is None


@FAST
@given(st.binary(max_size=400))
def test_any_prefix_gives_a_time_or_nothing(prefix):
    wall, uptime = PrefixClock(reference=1.7e9, boot_time=1.6e9).parse(prefix)
    assert wall is None or isinstance(wall, float)
    assert uptime is None or isinstance(uptime, float)


@FAST
@given(st.lists(log_lines(), max_size=20), st.lists(st.integers(1, 64), min_size=1, max_size=10))
def test_the_scanner_hands_on_the_same_lines_however_the_bytes_are_chunked(lines, cuts):
    data = b"\n".join(lines) + b"\n"

    def scan(pieces):
        seen = []
        scanner = LineScanner(seen.append)
        for piece in pieces:
            scanner.feed(piece)
        scanner.finish()
        return seen

    pieces, position, index = [], 0, 0
    while position < len(data):
        step = cuts[index % len(cuts)]
        pieces.append(data[position:position + step])
        position += step
        index += 1
    assert scan(pieces) == scan([data])


# -- sysfs values --------------------------------------------------------------------------------

sysfs_values = st.one_of(st.binary(max_size=80), st.sampled_from([
    b"4: ACTIVE\n", b"5: LinkUp\n", b"400 Gb/sec (4X NDR)\n", b"N/A (no PMA)\n", b"18446744073709551615\n",
    b"1" + b"0" * 400 + b"\n", b"9" * 5000 + b": ACTIVE\n", b"-1\n", b"\xff\xfe\n", b"", b"RoCE v2\n", b"nan\n"]))


@FAST
@given(st.dictionaries(st.sampled_from(["state", "phys_state", "rate", "link_layer", "counters/symbol_error",
                                        "counters/link_downed", "gid_attrs/types/0", "gid_attrs/types/x"]),
                       sysfs_values))
def test_any_sysfs_port_contents_read_without_a_crash(tmp_path_factory, files):
    port_dir = tmp_path_factory.mktemp("port")
    for name, value in files.items():
        path = port_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)
    facts = ib_sysfs.read_port(str(port_dir), "mlx5_0", 1, ("symbol_error", "link_downed"))
    for value in facts.counters.values():
        assert value is None or isinstance(value, int)


@FAST
@given(st.text(max_size=200))
@example("9" * 5000 + ": ACTIVE")
def test_numbered_and_rate_values_parse_or_stay_text(text):
    number, rest = parse_numbered(text)
    assert number is None or isinstance(number, int)
    rate = parse_rate(text)
    assert rate is None or isinstance(rate, float)


# -- scontrol and sacct output -------------------------------------------------------------------

@FAST
@given(st.text(max_size=300))
def test_any_scontrol_record_parses_to_a_dict_of_strings(line):
    fields = parse_scontrol_record(line)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())


@FAST
@given(st.text(alphabet="gpu:h10a,()S-_n" + string.digits, max_size=80) | st.text(max_size=80))
@example("gpu:h100:8(S:0-1)")
def test_any_gres_gives_gpu_counts_or_a_value_error(text):
    from healthcheck.slurm.backend import gpu_gres

    try:
        gpus = gpu_gres(text)
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    assert all(isinstance(t, str) and isinstance(n, int) and n >= 0 for t, n in gpus.items())


class _Canned(CliBackend):
    def __init__(self, out: str):
        super().__init__(bin_dir="/nonexistent")
        self.out = out

    def run(self, name, args, timeout_s=None):
        return self.out


@FAST
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400))
def test_any_sacct_output_gives_rows_of_the_asked_width(out):
    fields = ["JobID", "State", "ExitCode", "AdminComment"]
    rows = _Canned(out).accounting(["1"], fields)
    assert all(list(row) == fields for row in rows)
    job = _Canned(out).job("1")
    assert job is None or job.job_id == "1"


# -- dcgmi JSON ----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["DCGM Diagnostic", "DCGM GPU Diagnostic", "test_categories", "tests", "results",
                         "category", "name", "status", "entity_id", "entity_group", "gpu_id", "gpu_ids",
                         "warnings", "warning", "error_id", "metadata", "version", "runtime_error", "x"]),
        children, max_size=5),
    max_leaves=25)


@FAST
@given(json_values)
def test_any_dcgmi_json_gives_results_or_a_value_error(doc):
    import json

    text = json.dumps(doc)
    try:
        version, results, runtime_error = parse_diag(text)
    except ValueError:
        return
    assert all(result.status in ("pass", "fail", "skip", "other") for result in results)


@FAST
@given(st.text(max_size=300))
def test_any_dcgmi_text_gives_results_or_a_value_error(text):
    try:
        parse_diag(text)
    except ValueError:
        pass


# -- config files and simulator profiles ---------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats()
           | st.text(max_size=12) | st.sampled_from(["sim", "nvml", "drain", "warn", "auto", "gpu[1-3]", "x\0y"]))
KEYS = ["paths", "state_dir", "kernel_log", "gpu", "backend", "probe_timeout_s", "sim", "profile", "nodes", "match",
        "gpus", "thresholds", "actions", "tiers", "prolog", "health", "xid", "escalate", "13", "count", "window_s",
        "action", "drain", "reason_prefix", "max_reason_len", "dcgm", "timeout_s", "slurm", "logging", "level", "x"]
documents = st.recursive(scalars, lambda children: st.lists(children, max_size=3)
                         | st.dictionaries(st.sampled_from(KEYS), children, max_size=4), max_leaves=20)


@FAST
@given(st.dictionaries(st.sampled_from(KEYS), documents, max_size=5))
def test_any_config_document_validates_or_says_why(doc):
    try:
        config = Config.from_document(doc, "fuzz.toml")
    except ConfigError as exc:
        assert exc.lines() and all("\n" not in line for line in exc.lines())
        return
    assert isinstance(config.state_dir, str)


EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "etc", "slurm-gpu-hooks.toml")
with open(EXAMPLE, encoding="utf-8") as _handle:
    EXAMPLE_TEXT = _handle.read()


@FAST
@given(st.data())
def test_any_damaged_config_file_loads_or_gives_a_config_error(tmp_path_factory, data):
    raw = mutate(EXAMPLE_TEXT.encode(), data.draw)
    path = tmp_path_factory.mktemp("cfg") / "config.toml"
    path.write_bytes(raw)
    try:
        Config.load(str(path))
    except ConfigError as exc:
        assert exc.lines()


@FAST
@given(st.dictionaries(st.sampled_from(["node", "gpu", "ib", "kernel_log", "base", "overrides", "expect", "x"]),
                       documents, max_size=4))
def test_any_profile_document_completes_or_gives_a_profile_error(doc):
    try:
        profile = profiles.complete(doc, "fuzz.toml")
    except profiles.ProfileError as exc:
        assert str(exc)
        return
    assert isinstance(profile["gpu"], list)


@FAST
@given(st.text(alphabet=string.printable, max_size=60))
def test_any_inject_assignment_parses_or_gives_a_value_error(text):
    try:
        key, value = profiles.parse_assignment(text)
    except ValueError:
        return
    live = profiles.complete({"gpu": [{}], "ib": [{"hca": "mlx5_0", "port": 1}]}, "fuzz")
    try:
        profiles.apply_injection(live, [(key, value)], "fuzz")
    except (KeyError, profiles.ProfileError):
        pass


@FAST
@given(st.text(max_size=200))
def test_any_toml_text_parses_or_gives_a_decode_error(text):
    try:
        tomlio.loads(text)
    except tomlio.TOMLDecodeError:
        pass


# -- a malformed config never drains -------------------------------------------------------------

@FAST
@given(st.data())
def test_a_hook_with_a_malformed_config_exits_zero_and_calls_no_slurm_command(tmp_path_factory, monkeypatch, data):
    from .test_hooks_fail_open import HOOKS, entry_point

    raw = data.draw(st.one_of(st.binary(max_size=200), st.just(b"").map(lambda _: mutate(EXAMPLE_TEXT.encode(),
                                                                                         data.draw))))
    path = tmp_path_factory.mktemp("hook") / "config.toml"
    path.write_bytes(raw)
    calls = []
    real_popen = subprocess.Popen

    class Recording(real_popen):
        def __init__(self, args, *rest, **kwargs):
            calls.append(list(args) if not isinstance(args, (str, bytes)) else [args])
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Recording)
    monkeypatch.setenv("SLURM_GPU_HOOKS_CONFIG", str(path))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu1")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    state = {}
    try:
        Config.load(str(path))
        state["valid"] = True
    except ConfigError:
        state["valid"] = False
    assume(not state["valid"])
    for command in HOOKS:                     # what slurmd runs: each hook's console-script entry point
        monkeypatch.setattr(sys, "argv", [command])      # with no arguments (not pytest's)
        assert entry_point(command)() == 0
    assert not [call for call in calls if any(os.path.basename(str(a)) in ("scontrol", "sacctmgr") for a in call[:1])]
