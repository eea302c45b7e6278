"""The lab hooks' state directory (``$LAB/state``) as a filesystem of its own: a tmpfs with a size,
as a node's ``/var/lib`` can be a small partition of its own. Only so can `slurm-gpu lab soak`
fill it ("the state disk is full for a minute") without filling the machine's disk, where the
lab's MariaDB and slurmctld keep their own state.

``lab up`` mounts it while nothing of the lab runs, moving what the directory held onto it;
``lab down`` leaves it mounted (the state outlives the lab's daemons, as before); ``lab up
--clean`` empties it. A machine that cannot mount (no CAP_SYS_ADMIN) keeps a plain directory:
the lab runs as before and the soak says it cannot fill the disk.
"""
from __future__ import annotations

import errno
import os
import shutil
from typing import Callable

from . import LabError
from .commands import run

SIZE_MIB = 1024                     # a bound, not a reservation: tmpfs uses what it holds
FILLER = ".lab-state-disk-full"     # the soak's: holds every free byte while the disk is "full"
SOURCE = "slurm-gpu-lab-state"      # the mount's source name, as /proc/mounts shows it

Say = Callable[[str], None]


def own_filesystem(path: str) -> bool:
    return os.path.ismount(path)


def ensure(path: str, say: Say) -> bool:
    """Make ``path`` (an existing directory of a stopped lab) a tmpfs of its own, keeping what it
    holds. True when it mounted now; False when it already was one, or the mount failed (said)."""
    if own_filesystem(path):
        return False
    aside = path + ".moving"
    if os.path.lexists(aside):
        raise LabError(f"{aside} is left from an interrupted move of the hooks' state: "
                       f"move its contents back into {path} and remove it")
    held = os.listdir(path)
    if held:
        os.rename(path, aside)
        os.mkdir(path, 0o755)
    try:
        run(["/usr/bin/mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m,mode=0755,nosuid,nodev", SOURCE, path], timeout=30)
    except LabError as exc:
        if held:
            os.rmdir(path)
            os.rename(aside, path)
        say(f"the hooks' state dir stays on this machine's disk (no filesystem of its own: {exc}); "
            f"the soak cannot fill it")
        return False
    if held:
        shutil.copytree(aside, path, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(aside)
    say(f"the hooks' state dir {path} is a filesystem of its own (tmpfs, {SIZE_MIB} MiB at most)")
    return True


def clear(path: str) -> None:
    """Remove everything ``path`` holds, never the directory (a mount point) itself."""
    for name in os.listdir(path):
        entry = os.path.join(path, name)
        if os.path.isdir(entry) and not os.path.islink(entry):
            shutil.rmtree(entry)
        else:
            os.unlink(entry)


def free_bytes(path: str) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill(path: str) -> int:
    """Take every free byte of ``path``'s filesystem into one file (``FILLER``): from then on a
    write there fails with ENOSPC. Returns the bytes taken."""
    if not own_filesystem(path):
        raise LabError(f"{path} is not a filesystem of its own (see `slurm-gpu lab up`'s output): "
                       f"filling it would fill this machine's disk")
    filler = os.path.join(path, FILLER)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    taken, chunk = 0, 1 << 26
    try:
        # In chunks, halved at each ENOSPC down to a page: what statvfs says is free is not
        # always what a file can take (the filesystem's own blocks).
        offset = os.fstat(fd).st_size
        while chunk >= 4096:
            try:
                os.posix_fallocate(fd, offset, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk //= 2
                continue
            offset += chunk
            taken += chunk
    finally:
        os.close(fd)
    return taken


def empty(path: str) -> bool:
    """Give the filler's bytes back; True when there was one."""
    try:
        os.unlink(os.path.join(path, FILLER))
    except FileNotFoundError:
        return False
    return True
