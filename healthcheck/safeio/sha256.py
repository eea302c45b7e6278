"""SHA-256 for the hooks' own bookkeeping (cursor tails, file names, cache keys).

CPython's built-in implementation gives the same digests as ``hashlib.sha256`` without
loading OpenSSL, which ``import hashlib`` does: 3 ms on every hook's path.
"""
from __future__ import annotations

try:
    from _sha256 import sha256           # CPython <= 3.11
except ImportError:  # pragma: no cover - depends on the interpreter
    try:
        from _sha2 import sha256         # CPython >= 3.12
    except ImportError:
        from hashlib import sha256       # a build without them: hashlib's

__all__ = ["sha256"]
