"""slurm_hooks/lab/statefs.py on a real tmpfs (mounted in a temporary directory, as root, as the
test command runs): the lab hooks' state dir becomes a filesystem of its own keeping what it
held; `lab up --clean` empties it and leaves it mounted; the soak's filler makes every write there
fail with ENOSPC and gives the space back."""
from __future__ import annotations

import errno
import os
import subprocess

import pytest

from slurm_hooks.lab import LabError, statefs


@pytest.fixture
def state(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("this test mounts a tmpfs: run it as root, as the test command does", pytrace=False)
    path = tmp_path / "state"
    path.mkdir()
    yield str(path)
    if os.path.ismount(path):
        subprocess.run(["/usr/bin/umount", str(path)], check=True)


def test_the_state_dir_becomes_a_tmpfs_of_its_own_keeping_what_it_held(state):
    os.makedirs(os.path.join(state, "jobs", "5"))
    with open(os.path.join(state, "jobs", "5", "gpu1.json"), "w") as handle:
        handle.write('{"class": "COMPLETED"}')
    said = []
    assert statefs.ensure(state, said.append) is True
    assert statefs.own_filesystem(state) and "filesystem of its own" in said[0]
    with open(os.path.join(state, "jobs", "5", "gpu1.json")) as handle:
        assert handle.read() == '{"class": "COMPLETED"}'
    assert not os.path.exists(state + ".moving")
    assert statefs.ensure(state, said.append) is False          # once
    statefs.clear(state)
    assert os.listdir(state) == [] and statefs.own_filesystem(state)


def test_a_mount_that_fails_keeps_the_plain_directory_and_what_it_held(state, monkeypatch):
    with open(os.path.join(state, "kept"), "w") as handle:
        handle.write("x")

    def refused(*args, **kwargs):
        raise LabError("mount: permission denied")

    monkeypatch.setattr(statefs, "run", refused)
    said = []
    assert statefs.ensure(state, said.append) is False
    assert not statefs.own_filesystem(state) and os.listdir(state) == ["kept"]
    assert "stays on this machine's disk" in said[0]
    with pytest.raises(LabError, match="not a filesystem of its own"):
        statefs.fill(state)


def test_the_filler_makes_every_write_fail_with_enospc_until_it_is_gone(state):
    assert statefs.ensure(state, lambda _: None)
    subprocess.run(["/usr/bin/mount", "-o", "remount,size=4m", state], check=True)
    assert statefs.fill(state) > 3 * 1024 * 1024
    assert statefs.free_bytes(state) == 0
    with pytest.raises(OSError) as raised:
        with open(os.path.join(state, "record.json"), "w") as handle:
            handle.write("x" * 8192)
    assert raised.value.errno == errno.ENOSPC
    assert statefs.empty(state) is True and statefs.empty(state) is False
    with open(os.path.join(state, "record.json"), "w") as handle:
        handle.write("x" * 8192)
