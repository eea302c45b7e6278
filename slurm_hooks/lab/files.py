"""Files and directories of the lab directory: made without following links, refused when they
are not safe (the lab sits in world-writable /var/tmp), written only when their text changed."""
from __future__ import annotations

import os
import stat

from . import LabError


def _check_safe_dir(path: str) -> None:
    """Refuse a path that is a link, not ours, or writable by others (it sits in /var/tmp)."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise LabError(f"{path} is not a plain directory; refusing to use it")
    if info.st_uid != 0 and os.geteuid() == 0:
        raise LabError(f"{path} is owned by uid {info.st_uid}, not root; refusing to use it")
    if info.st_mode & 0o022:
        raise LabError(f"{path} is writable by group or others; refusing to use it")


def make_dir(path: str, mode: int = 0o755) -> str:
    if not os.path.lexists(path):
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o755, exist_ok=True)
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            pass
    _check_safe_dir(path)
    return path


def write_if_changed(path: str, text: str, mode: int) -> bool:
    from healthcheck.safeio.fsutil import atomic_write

    if os.path.lexists(path):
        if os.path.islink(path):
            os.unlink(path)
        else:
            with open(path, encoding="utf-8") as handle:
                if handle.read() == text:
                    os.chmod(path, mode)
                    return False
    atomic_write(path, text, mode=mode)
    os.chmod(path, mode)
    return True
