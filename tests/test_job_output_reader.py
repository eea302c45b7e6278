"""The privilege-dropped reader of a job's output (healthcheck/probes/job_output.py). Run as root,
it becomes ``nobody`` before it opens anything: root-only files, links to them, a directory on the
path swapped for a link, and FIFOs yield nothing, and only the tail of a file is read."""
import os
import pwd
import shutil
import stat
import struct
import tempfile

import pytest

from healthcheck.probes import job_output as jo
from healthcheck.probes.deadline import run_raw_with_deadline

OOM = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity\n"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root (the epilog runs as root)")


def nobody():
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def place():
    """A directory every user can traverse (pytest's tmp_path is 0700 to root)."""
    path = tempfile.mkdtemp(prefix="sgh-job-output-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write(path, data, mode):
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)
    return path


def read_as_nobody(paths, max_bytes=4096):
    uid, gid = nobody()
    return jo.read_tails_as(paths, uid, gid, max_bytes, timeout_s=5)


@as_root
def test_a_file_the_user_may_read_is_read(place):
    path = write(os.path.join(place, "job.err"), b"hello\n" + OOM, 0o644)
    [tail], problem = read_as_nobody([path])
    assert problem is None and tail.error is None and tail.data == b"hello\n" + OOM and not tail.truncated


@as_root
def test_a_root_only_file_is_not_read(place):
    path = write(os.path.join(place, "secret"), OOM, 0o600)
    [tail], problem = read_as_nobody([path])
    assert problem is None and tail.data == b"" and tail.error == "Permission denied"


@as_root
def test_a_link_is_not_followed_even_to_a_readable_file(place):
    target = write(os.path.join(place, "readable"), OOM, 0o644)
    root_only = write(os.path.join(place, "secret"), OOM, 0o600)
    for name, to in (("to-readable", target), ("to-secret", root_only)):
        os.symlink(to, os.path.join(place, name))
    tails, problem = read_as_nobody([os.path.join(place, "to-readable"), os.path.join(place, "to-secret")])
    assert problem is None and [t.error for t in tails] == ["symbolic link, not followed"] * 2
    assert all(t.data == b"" for t in tails)


@as_root
def test_a_directory_on_the_path_swapped_for_a_link_to_a_root_only_one_gives_nothing(place):
    hidden = os.path.join(place, "root-only-dir")
    os.mkdir(hidden, 0o700)
    write(os.path.join(hidden, "job.out"), OOM, 0o644)    # readable, but its directory is not
    os.symlink(hidden, os.path.join(place, "jobdir"))
    [tail], problem = read_as_nobody([os.path.join(place, "jobdir", "job.out")])
    assert problem is None and tail.data == b"" and tail.error == "Permission denied"


@as_root
def test_a_fifo_is_refused_without_blocking(place):
    fifo = os.path.join(place, "job.out")
    os.mkfifo(fifo, 0o666)
    [tail], problem = read_as_nobody([fifo])
    assert problem is None and tail.error == "not a regular file"


@as_root
def test_only_the_tail_of_a_large_file_is_read(place):
    body = b"".join(b"line %06d\n" % i for i in range(20000)) + OOM
    path = write(os.path.join(place, "big.err"), body, 0o644)
    [tail], problem = read_as_nobody([path], max_bytes=1024)
    assert problem is None and tail.truncated and tail.size == len(body)
    assert len(tail.data) == 1024 and tail.data == body[-1024:]


@as_root
def test_the_child_cannot_become_root_again():
    uid, gid = nobody()

    def probe(fd):
        jo.drop_privileges(uid, gid)
        try:
            os.setuid(0)
            regained = 1
        except PermissionError:
            regained = 0
        effective, permitted = jo._capabilities()
        os.write(fd, struct.pack("!7iQQ", *os.getresuid(), *os.getresgid(), regained, effective, permitted))

    outcome = run_raw_with_deadline(probe, 5, 4096)
    assert outcome.complete, outcome
    values = struct.unpack("!7iQQ", outcome.data)
    assert values[:6] == (uid, uid, uid, gid, gid, gid)
    assert values[6:] == (0, 0, 0)


@pytest.mark.parametrize("uid,gid", [(0, 0), (0, 65534), (65534, 0)])
def test_a_job_of_root_is_not_read_at_all(place, uid, gid):
    path = write(os.path.join(place, "job.err"), OOM, 0o644)
    tails, problem = jo.read_tails_as([path], uid, gid, 4096, timeout_s=5)
    assert tails == [] and "only as an unprivileged user" in problem


def test_the_reader_is_bounded_in_time():
    outcome = run_raw_with_deadline(lambda fd: __import__("time").sleep(60), 0.3, 1024)
    assert outcome.timed_out and not outcome.complete and outcome.data == b""


def test_a_reader_that_sends_more_than_asked_is_cut_off():
    outcome = run_raw_with_deadline(lambda fd: os.write(fd, b"x" * 9000), 5, 100)
    assert outcome.overflow and len(outcome.data) == 100


def _frame(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("!II", len(header), len(data)) + header + data


@pytest.mark.parametrize("payload", [
    _frame(b'{"path":"/etc/shadow","size":1,"truncated":false,"error":null}', b"x"),   # not asked for
    _frame(b"not json"),
    _frame(b"[1]"),
    struct.pack("!II", 10, 1 << 30),                                                   # more than asked
])
def test_a_malformed_answer_yields_no_evidence(payload):
    tails, problem, complete = jo.parse_frames(payload, ["/tmp/job.err"], 4096)
    assert tails == [] and problem == "the reader's answer is malformed" and not complete


def test_a_well_formed_answer_parses():
    payload = (_frame(b'{"path":"/tmp/job.err","size":3,"truncated":false,"error":null}', b"abc")
               + _frame(b'{"problem":null,"done":true}'))
    [tail], problem, complete = jo.parse_frames(payload, ["/tmp/job.err"], 4096)
    assert complete and problem is None and tail.data == b"abc" and tail.size == 3


def test_read_tail_refuses_relative_paths_and_links_as_any_user(place):
    write(os.path.join(place, "f"), OOM, 0o644)
    os.symlink(os.path.join(place, "f"), os.path.join(place, "l"))
    assert jo.read_tail("f", 100).error == "not an absolute path"
    assert jo.read_tail(os.path.join(place, "l"), 100).error == "symbolic link, not followed"
    assert stat.S_ISLNK(os.lstat(os.path.join(place, "l")).st_mode)
