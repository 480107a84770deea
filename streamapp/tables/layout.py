"""Where an app's table stores live under a data directory, and who holds them open.

The layout is the one :func:`streamapp.tables.rocksdb.store.rocks_opener` opens:
``{data_dir}/{app_id}/{agent}/{partition}/``, one RocksDB directory per partition of an
agent with tables. A process with a store open holds a POSIX lock on its ``LOCK`` file
(RocksDB's ``fcntl(F_SETLK)``), which :func:`lock_holders` reads from ``/proc/locks``
without opening the store or the file: closing any descriptor of a locked file would
drop the locks this process holds on it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

LOCK_FILE = "LOCK"
TABLE_SPACE = "t:"
"""How a table's data space starts (:attr:`streamapp.tables.table.Table.data_space`)."""
PROC_LOCKS = Path("/proc/locks")
COMMAND_CHARS = 160
"""How much of a holder's command line a message shows."""


DISK_FULL_BYTES = 1 << 20
"""Below this much space left under the data directory (to an unprivileged writer) its
disk is full: RocksDB's next write there (a log append, a flush) fails with ``No space
left on device``."""


def disk_full(data_dir: Path) -> str | None:
    """``disk full under DATA_DIR (...)`` when the file system of ``data_dir`` has less than
    :data:`DISK_FULL_BYTES` left; None when it has room (or cannot be asked). One
    ``statvfs``: cheap enough for each ``/readyz``."""
    probe = Path(data_dir)
    while not probe.exists() and probe.parent != probe:  # not made yet: its parent's disk
        probe = probe.parent
    try:
        stat = os.statvfs(probe)
    except OSError:
        return None
    free = stat.f_bavail * stat.f_frsize
    if free >= DISK_FULL_BYTES:
        return None
    return (
        f"disk full under {data_dir} ({free} bytes left): the table stores cannot be "
        "written; free space there (or give the worker a --data-dir on another disk)"
    )


def app_directory(data_dir: Path, app_id: str) -> Path:
    """The directory of every store of ``app_id`` under ``data_dir``."""
    return Path(data_dir) / app_id


def agent_directory(data_dir: Path, app_id: str, agent: str) -> Path:
    """The directory of every partition store of ``agent`` (see :func:`partition_stores`)."""
    return app_directory(data_dir, app_id) / agent


def partition_stores(directory: Path) -> list[Path]:
    """The partition stores found in an agent's directory, by partition number."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found, key=lambda p: int(p.name))


def table_spaces(store: Path) -> frozenset[str]:
    """The table labels whose data spaces the partition store ``store`` holds
    (``Table.label``: ``name`` or ``name@vN``), read from its column family list without
    opening it (no lock taken); empty when it has none or cannot be read."""
    from rocksdict import Rdict

    if not (store / "CURRENT").exists():
        return frozenset()
    try:
        families = Rdict.list_cf(str(store))
    except Exception:  # rocksdict raises plain Exception; opening it says what is wrong
        return frozenset()
    return frozenset(f[len(TABLE_SPACE) :] for f in families if f.startswith(TABLE_SPACE))


def lock_holders(stores: Iterable[Path]) -> dict[Path, int]:
    """The stores among ``stores`` that a process holds open, with its pid.

    Read from ``/proc/locks`` (Linux). Where it is missing, each ``LOCK`` file is probed
    with a non-blocking lock taken and dropped at once (pid unknown: 0); this process
    must then hold none of these stores itself.
    """
    locks = {store / LOCK_FILE: store for store in stores}
    present = {path: store for path, store in locks.items() if path.exists()}
    if not present:
        return {}
    if PROC_LOCKS.exists():
        return _from_proc_locks(present)
    return {store: 0 for path, store in present.items() if _probe_locked(path)}


def describe_process(pid: int) -> str:
    """``pid N (its command line)``, as far as this host can tell."""
    if pid <= 0:
        return "another process"
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {pid}"
    command = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    if len(command) > COMMAND_CHARS:
        command = command[: COMMAND_CHARS - 3] + "..."
    return f"pid {pid} ({command})" if command else f"pid {pid}"


def _from_proc_locks(files: dict[Path, Path]) -> dict[Path, int]:
    wanted: dict[tuple[int, int, int], Path] = {}
    for path, store in files.items():
        try:
            st = path.stat()
        except OSError:
            continue
        wanted[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = store
    out: dict[Path, int] = {}
    for line in PROC_LOCKS.read_text().splitlines():
        # "1: POSIX  ADVISORY  WRITE 9858 fe:00:9979016 0 EOF" (a "->" line waits for one)
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            key = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        held = wanted.get(key)
        if held is not None and held not in out:
            out[held] = pid
    return out


def _probe_locked(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False
