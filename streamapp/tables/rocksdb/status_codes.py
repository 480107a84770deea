"""RocksDB's statuses as typed streamapp errors, at the tables boundary.

rocksdict raises a plain ``Exception`` whose message is RocksDB's ``Status::ToString()``:
a fixed code prefix (``Corruption: ``, ``IO error: ``, ...), then the detail. The error
is classified by that prefix, never by a word somewhere in the message ("block checksum
mismatch" contains "lock"). A lock held by another process is an ``IO error`` about the
store's ``LOCK`` file (``While lock file: <dir>/LOCK: Resource temporarily unavailable``;
in this process: ``lock hold by current process ... <dir>/LOCK: No locks available``).
"""

from __future__ import annotations

import re

from ...errors import StoreCorruptError, StoreError, StoreIOError, StoreLockedError

CODES = (
    "NotFound",
    "Corruption",
    "Not implemented",
    "Invalid argument",
    "IO error",
    "Merge in progress",
    "Result incomplete",
    "Shutdown in progress",
    "Operation timed out",
    "Operation aborted",
    "Resource busy",
    "Operation expired",
    "Operation failed. Try again.",
    "Compaction too large",
    "Column family dropped",
)
"""The code prefixes of RocksDB's ``Status::ToString()`` (``util/status.cc``)."""

_STATUS = re.compile("^(" + "|".join(re.escape(code) for code in CODES) + r"): (.*)$", re.S)
_LOCK_FILE = re.compile(r"(?:^|/)LOCK: ")
"""The store's ``LOCK`` file named as the subject of an IO error (``<dir>/LOCK: why``)."""


def status_of(exc: BaseException) -> tuple[str, str] | None:
    """RocksDB's (code, detail) of a rocksdict exception; None when it is no status."""
    if type(exc) is not Exception:  # rocksdict's statuses are plain Exceptions
        return None
    match = _STATUS.match(str(exc))
    return None if match is None else (match.group(1), match.group(2))


def is_lock(code: str, detail: str) -> bool:
    """The status says the store's LOCK file is held (by another process or this one)."""
    return code == "IO error" and _LOCK_FILE.search(detail) is not None


def store_error(exc: BaseException, path: str, doing: str) -> StoreError | None:
    """The typed error for a rocksdict exception raised while ``doing`` something to the
    store at ``path`` (None: not a RocksDB status; let it go as it is)."""
    status = status_of(exc)
    if status is None:
        return None
    code, detail = status
    line = f"{code}: {detail}".strip()
    if code == "Corruption":
        return StoreCorruptError(
            f"table store {path} is corrupt ({line}), found while {doing}",
            path=path,
            status=line,
        )
    if is_lock(code, detail):
        return StoreLockedError(f"table store {path} is locked ({line})", path=path, status=line)
    if code == "IO error":
        return StoreIOError(
            f"table store {path}: the disk failed while {doing} ({line}); check the disk "
            "and its free space under the data directory",
            path=path,
            status=line,
        )
    return StoreError(f"table store {path}: {doing} failed ({line})", path=path, status=line)
