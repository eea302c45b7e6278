"""The CLI never answers bad input with a traceback: a symlink loop, a path through a file
(ENOTDIR), an over-long name, a simulator profile that is a directory, a FIFO or /dev/zero as
the config, a damaged .gz log (whose events before the damage are still reported)."""
from __future__ import annotations

import gzip
import os

import pytest

from .conftest import run_cli

LONG = "x" * 300


@pytest.fixture
def odd_paths(tmp_path):
    os.symlink("loop", tmp_path / "loop")
    (tmp_path / "afile").write_text("x\n")
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    return tmp_path


def one_line_error(result) -> None:
    assert result.exit_code != 0, result.stdout
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2 and all(len(line) < 600 for line in lines), lines


PATHS = ["loop", "afile/x", LONG, "adir", "fifo", "/dev/zero"]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p[:10])
@pytest.mark.parametrize("command", [["config", "check", "{p}"], ["check", "--config", "{p}", "--node", "gpu1"],
                                     ["check", "--sim", "./{p}", "--node", "gpu1"], ["xid", "scan", "{p}"],
                                     ["sim", "show", "--config", "{p}", "gpu1"],
                                     ["genconf", "--config", "{p}"], ["genconf", "--sim", "./{p}"]], ids=" ".join)
def test_odd_paths_give_one_line(odd_paths, monkeypatch, command, path):
    monkeypatch.chdir(odd_paths)
    one_line_error(run_cli([part.replace("./{p}", path if path.startswith("/") else "./" + path).replace("{p}", path)
                            for part in command]))


@pytest.mark.parametrize("state_dir", ["loop", "afile", "afile/x", LONG, "fifo"], ids=lambda p: p[:10])
@pytest.mark.parametrize("command", [["check", "--config", "c.toml", "--node", "gpu1"],
                                     ["sim", "show", "--config", "c.toml", "gpu1"],
                                     ["sim", "inject", "--config", "c.toml", "gpu1", "gpu.0.state=lost"]],
                         ids=lambda c: c[0] + " " + c[1])
def test_an_unusable_state_dir_gives_one_line(odd_paths, sim_config, monkeypatch, command, state_dir):
    monkeypatch.chdir(odd_paths)
    with open(sim_config, encoding="utf-8") as handle:
        text = handle.read().replace('state_dir = "state"', f'state_dir = "{odd_paths / state_dir}"')
    (odd_paths / "c.toml").write_text(text.replace('"sim/', f'"{os.path.dirname(sim_config)}/sim/'))
    one_line_error(run_cli(command))


def test_a_sim_nodes_entry_that_is_a_directory_gives_one_line(sim_config, tmp_path):
    (tmp_path / "sim" / "adir.toml").mkdir()
    with open(sim_config, encoding="utf-8") as handle:
        text = handle.read().replace("gpu2 = ", 'gpu4 = "sim/adir.toml", gpu2 = ')
    config = tmp_path / "dir.toml"
    config.write_text(text)
    for command in (["check", "--config", str(config), "--node", "gpu4"], ["sim", "show", "--config", str(config), "gpu4"],
                    ["config", "check", str(config)]):
        result = run_cli(command)
        one_line_error(result)
        assert "adir.toml" in result.stderr and "directory" in result.stderr.lower()


LINES = b"".join(b"[%d.0] NVRM: Xid (PCI:0000:3b:00): %d, pid=1, name=x, m\n" % (i, 48 if i < 60 else 79)
                 for i in range(100)) * 300


@pytest.mark.parametrize("damage", ["truncated", "bad-crc", "garbage-after"])
def test_a_damaged_gz_keeps_the_events_before_the_damage(tmp_path, damage):
    data = gzip.compress(LINES)
    if damage == "truncated":
        data = data[:len(data) * 2 // 3]
    elif damage == "bad-crc":
        data = data[:-8] + b"\0" * 8
    else:
        data = data + b"\x1f\x8b\x08\x00junk"
    path = tmp_path / "kern.log.2.gz"
    path.write_bytes(data)
    result = run_cli(["xid", "scan", "--json", str(path)])
    assert "Traceback" not in result.stderr
    assert "damaged gzip data" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert '"code": 48' in result.stdout, "the events read before the damage are reported"


def test_an_intact_multi_member_gz_reads_every_member(tmp_path):
    path = tmp_path / "kern.log.gz"
    path.write_bytes(gzip.compress(b"[1.0] NVRM: Xid (PCI:0000:3b:00): 48, a\n")
                     + gzip.compress(b"[2.0] NVRM: Xid (PCI:0000:3b:00): 79, b\n"))
    result = run_cli(["xid", "scan", "--json", str(path)])
    assert result.exit_code == 0 and result.stderr == ""
    assert '"code": 48' in result.stdout and '"code": 79' in result.stdout
