"""TOML reading (tomllib on 3.11+, tomli below) and writing (tomli_w), in one place."""
from __future__ import annotations

import errno
import os
import stat
import sys
from typing import Any, Dict


def _reader():
    """The TOML parser, imported when something is parsed (3-4 ms): a hook whose config comes
    from the compiled cache (``healthcheck.config``) never loads it."""
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    import tomli  # pragma: no cover - exercised on RHEL 9's Python 3.9
    return tomli


class TOMLDecodeError(ValueError):
    """Not valid TOML: the parser's own error (tomllib's or tomli's), with its message."""

# A config or profile is a few KiB; a FIFO, /dev/zero or a runaway file must not hang a hook or
# fill its memory.
MAX_TOML_BYTES = 4 * 1024 * 1024


class NestingError(TOMLDecodeError):
    """TOML nested past the parser's recursion limit: a syntax error like any other."""


class FileRefused(OSError):
    """The path is not a regular file, or is larger than MAX_TOML_BYTES; not even opened for long."""


def loads(text: str) -> Dict[str, Any]:
    reader = _reader()
    try:
        return reader.loads(text)
    except reader.TOMLDecodeError as exc:
        raise TOMLDecodeError(str(exc)) from None
    except RecursionError:
        # The parser recurses per nesting level: a few hundred "[" exhaust Python's stack.
        raise NestingError("values nest too deeply") from None


def read_bytes(path, limit: int = MAX_TOML_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; FileRefused for anything else
    (a FIFO or device is opened non-blocking and refused before any read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fsdecode(path))
            raise FileRefused(errno.EINVAL, "not a regular file", os.fsdecode(path))
        if info.st_size > limit:
            raise FileRefused(errno.EFBIG, f"larger than {limit} bytes", os.fsdecode(path))
        chunks = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise FileRefused(errno.EFBIG, f"larger than {limit} bytes", os.fsdecode(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_file(path) -> Dict[str, Any]:
    """A TOML file (see ``read_bytes`` for what is refused); UnicodeDecodeError for bad UTF-8."""
    return loads(read_bytes(path).decode("utf-8"))


def dumps(doc: Dict[str, Any]) -> str:
    import tomli_w  # only writers pay for it

    return tomli_w.dumps(doc)


def parse_value(text: str) -> Any:
    """A single TOML value, e.g. ``1``, ``[4,5]``, ``"1: DOWN"``, ``{ gen = 4 }``."""
    return loads(f"v = {text}")["v"]
