"""The embedded event store: one SQLite file in WAL mode, shared by several processes.

Workers, the forwarder and ``streamapp store append`` may open the same file at once:
appends take the write lock up front (``BEGIN IMMEDIATE``) and wait for it up to the busy
timeout, so the stream-version check and the insert see the same state; readers never
block writers (WAL). Positions are the table's rowid: appends are serialised and a rolled
back one consumes nothing, so positions are dense. Commits use ``synchronous=FULL``: the
store is the source of truth, an acknowledged append survives a power loss.

The stdlib driver blocks, so every call runs in a thread (``asyncio.to_thread``), one at a
time per store object.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from ...errors import ConfigError
from ...settings.store_url import SETTING, parse_url
from ..append import EventKey, SqlEventStore, event_keys, plan_batch
from ..base import worker_locked
from ..model import (
    PENDING,
    RELEASE_RUN,
    Append,
    BatchResult,
    OnDuplicate,
    ParkedRecord,
    Resent,
    StoredEvent,
    StoredRow,
    decode_headers,
    encode_headers,
)
from ..sql import LIVE_OFFSET_SQL, SAMPLE_STREAMS_SQL, STREAM_IDS_SQL
from .forwarder import SqliteForwarderState
from .schema import connect

log = logging.getLogger("streamapp.eventstore.sqlite")
T = TypeVar("T")

_KEYS_CHUNK = 400  # (source, id) pairs per lookup: two variables each
_VERSIONS_CHUNK = 500  # stream ids per IN (...) query, well below SQLite's variable limit
_make = StoredEvent._make


class SqliteEventStore(SqlEventStore):
    """The event store in one SQLite file. Open with :meth:`open` (or ``open_store``)."""

    system = "sqlite"

    def __init__(self, url: str, conn: sqlite3.Connection, path: Path) -> None:
        self.url = url
        self.path = path
        self.reads = 0
        self._conn = conn
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str, *, busy_timeout_s: float = 30.0) -> SqliteEventStore:
        """Open (and create) the store file of ``url``; the schema is made if missing.

        A missing directory is a ConfigError (a mistyped path would otherwise give an
        empty store elsewhere), unless the URL ends with ``?create=1``."""
        parsed = parse_url(url)
        path = parsed.path
        if path is None:
            raise ConfigError(f"setting {SETTING} = {url!r} is not a sqlite:/// URL")
        if not parsed.create and not path.parent.is_dir():
            raise ConfigError(
                f"setting {SETTING} = {url!r}: the directory {path.parent} of the SQLite "
                "store does not exist. Check the path for a typo (sqlite:///relative.db is "
                "from the working directory, sqlite:////absolute.db from the root), or add "
                f"?create=1 to make it: {url}?create=1"
            )
        conn = await asyncio.to_thread(connect, path, busy_timeout_s, url, parsed.create)
        return cls(url, conn, path)

    async def write_many(self, appends: Sequence[Append], on_duplicate: OnDuplicate) -> BatchResult:
        return await self._run(self._append_many, appends, on_duplicate)

    async def read_all(self, from_position: int, limit: int) -> list[StoredEvent]:
        self.reads += 1
        return await self._run(self._read_all, from_position, limit)

    async def read_rows(self, from_position: int, limit: int) -> list[StoredRow]:
        self.reads += 1
        return await self._run(self._read_rows, from_position, limit)

    async def read_stream(self, stream_id: str) -> list[StoredEvent]:
        def read() -> list[StoredEvent]:
            rows = self._conn.execute(
                "SELECT position, stream_id, version, payload FROM streamapp_events "
                "WHERE stream_id = ? ORDER BY version",
                (stream_id,),
            ).fetchall()
            return list(map(_make, rows))

        return await self._run(read)

    async def stream_ids(self, after: str, limit: int) -> list[str]:
        def read() -> list[str]:
            rows = self._conn.execute(STREAM_IDS_SQL, (after, limit)).fetchall()
            return [str(r[0]) for r in rows]

        return await self._run(read)

    async def sample_streams(self, k: int) -> list[str]:
        def read() -> list[str]:
            return [str(r[0]) for r in self._conn.execute(SAMPLE_STREAMS_SQL, (k,)).fetchall()]

        return await self._run(read)

    async def head(self) -> int:
        def head() -> int:
            row = self._conn.execute("SELECT max(position) FROM streamapp_events").fetchone()
            return int(row[0] or 0)

        return await self._run(head)

    async def store_id(self) -> str:
        def read() -> str:
            (found,) = self._conn.execute("SELECT id FROM streamapp_store").fetchone()
            return str(found)

        return await self._run(read)

    async def close(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self._conn.close)

    async def live_offset(self, topic: str, partition: int, position: int) -> int | None:
        """The first offset of ``topic[partition]`` that may carry a position >= ``position``
        (see :data:`streamapp.eventstore.sql.LIVE_OFFSET_SQL`); None: no mark yet."""

        def find() -> int | None:
            row = self._conn.execute(LIVE_OFFSET_SQL, (topic, partition, position)).fetchone()
            return None if row is None or row[0] is None else int(row[0]) + 1

        return await self._run(find)

    @contextlib.asynccontextmanager
    async def worker_lock(self, app_id: str) -> AsyncIterator[None]:
        """Held for an embedded worker's life (``flock``, dropped by the kernel when the
        holder dies, even by kill -9); a second worker of the app is refused at once.

        The holder removes the file as it lets go (one killed leaves it, harmless: the
        next one locks it). Only a holder removes it, and a taker checks that the file
        it locked is still the one at the path (not one removed meanwhile), so two
        processes never hold the lock at once."""
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in app_id)
        path = self.path.with_name(f"{self.path.name}.worker-{safe}.lock")
        fd = _take_file_lock(path, app_id, self.url)
        try:
            me = f"worker pid {os.getpid()} on {socket.gethostname()}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, me.encode(), 0)
            yield
        finally:
            if _same_file(fd, path):  # held: nobody else can have put another one there
                os.unlink(path)
            os.close(fd)

    async def park(
        self,
        destination: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        row = (destination, key, value, encode_headers(headers), time.time())

        def park() -> None:
            with _immediate(self._conn) as conn:
                conn.execute(
                    "INSERT INTO streamapp_parked (destination, key, value, headers, parked_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    row,
                )

        await self._run(park)

    async def parked(self, destination: str) -> list[ParkedRecord]:
        def read() -> list[ParkedRecord]:
            rows = self._conn.execute(
                "SELECT id, destination, key, value, headers, parked_at FROM streamapp_parked "
                "WHERE destination = ? ORDER BY id",
                (destination,),
            ).fetchall()
            return [
                ParkedRecord(i, d, k, v, decode_headers(h), datetime.fromtimestamp(at, UTC))
                for i, d, k, v, h, at in rows
            ]

        return await self._run(read)

    async def resend(
        self, app_id: str, run: str, parked_ids: Sequence[int], *, again: bool = False
    ) -> int:
        now = time.time()
        sql = (
            "INSERT OR IGNORE INTO streamapp_resent (app_id, run, parked_id, sent_at) "
            "SELECT ?, ?, ?, ? WHERE ? OR NOT EXISTS (SELECT 1 FROM streamapp_resent "
            "WHERE app_id = ? AND parked_id = ?)"
        )

        def resend() -> int:
            with _immediate(self._conn) as conn:  # one writer: numbered in commit order
                before = conn.total_changes
                conn.executemany(sql, [(app_id, run, i, now, again, app_id, i) for i in parked_ids])
                return conn.total_changes - before

        return await self._run(resend)

    async def resent(self, app_id: str, after: int, limit: int) -> list[Resent]:
        def read() -> list[Resent]:
            rows = self._conn.execute(
                "SELECT r.id, p.id, p.destination, p.key, p.value, p.headers, p.parked_at, "
                "r.outcome FROM streamapp_resent r JOIN streamapp_parked p ON p.id = r.parked_id "
                "WHERE r.app_id = ? AND r.id > ? ORDER BY r.id LIMIT ?",
                (app_id, after, limit),
            ).fetchall()
            return [
                Resent(
                    r,
                    ParkedRecord(i, d, k, v, decode_headers(h), datetime.fromtimestamp(at, UTC)),
                    o,
                )
                for r, i, d, k, v, h, at, o in rows
            ]

        return await self._run(read)

    async def resent_through(self, app_id: str, destination: str) -> int:
        sql = (
            "SELECT max(r.parked_id) FROM streamapp_resent r JOIN streamapp_parked p "
            "ON p.id = r.parked_id WHERE r.app_id = ? AND p.destination = ? "
            "AND r.run NOT LIKE ?"
        )
        args = (app_id, destination, RELEASE_RUN + "%")
        row = await self._run(lambda: self._conn.execute(sql, args).fetchone())
        return int(row[0] or 0)

    async def record_resent(self, app_id: str, outcomes: Mapping[int, str]) -> None:
        sql = (
            "UPDATE streamapp_resent SET outcome = ? "
            "WHERE app_id = ? AND id = ? AND outcome IS NULL"
        )

        def record() -> None:
            with _immediate(self._conn) as conn:
                conn.executemany(sql, [(o, app_id, i) for i, o in outcomes.items()])

        if outcomes:
            await self._run(record)

    async def resent_outcomes(self, app_id: str, destination: str) -> dict[int, str]:
        sql = (
            "SELECT r.parked_id, r.outcome FROM streamapp_resent r WHERE r.id IN ("
            "SELECT max(l.id) FROM streamapp_resent l JOIN streamapp_parked p "
            "ON p.id = l.parked_id WHERE l.app_id = ? AND p.destination = ? "
            "GROUP BY l.parked_id)"
        )
        rows = await self._run(lambda: self._conn.execute(sql, (app_id, destination)).fetchall())
        return {int(i): o or PENDING for i, o in rows}

    async def ledger_records(self, app_id: str) -> list[tuple[str, bytes | None]]:
        sql = "SELECT key, value FROM streamapp_ledger WHERE app_id = ? ORDER BY key"
        return await self._run(lambda: self._conn.execute(sql, (app_id,)).fetchall())

    async def put_ledger_record(self, app_id: str, key: str, value: bytes) -> None:
        sql = "INSERT OR REPLACE INTO streamapp_ledger (app_id, key, value) VALUES (?, ?, ?)"
        await self._run(self._conn.execute, sql, (app_id, key, value))  # autocommit

    def forwarder_state(self, name: str) -> SqliteForwarderState:
        """The lock (a file lock next to the store) and checkpoint of forwarder ``name``."""
        return SqliteForwarderState(self, name)

    async def with_connection(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` run in the store's thread, one call at a time with every
        other of this store (its forwarder state's reads and writes)."""
        return await self._run(fn, self._conn)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            return await asyncio.to_thread(fn, *args)

    def _read_all(self, from_position: int, limit: int) -> list[StoredEvent]:
        rows = self._conn.execute(
            "SELECT position, stream_id, version, payload FROM streamapp_events "
            "WHERE position >= ? ORDER BY position LIMIT ?",
            (from_position, limit),
        ).fetchall()
        return list(map(_make, rows))

    def _read_rows(self, from_position: int, limit: int) -> list[StoredRow]:
        rows: list[StoredRow] = self._conn.execute(
            "SELECT position, stream_id, version, payload FROM streamapp_events "
            "WHERE position >= ? ORDER BY position LIMIT ?",
            (from_position, limit),
        ).fetchall()
        return rows

    def _append_many(self, appends: Sequence[Append], on_duplicate: OnDuplicate) -> BatchResult:
        with _immediate(self._conn) as conn:
            versions = _versions(conn, {a.stream_id for a in appends})
            known = _known(conn, event_keys(appends))
            (head,) = conn.execute(
                "SELECT coalesce(max(position), 0) FROM streamapp_events"
            ).fetchone()
            rows, result = plan_batch(appends, versions, known, int(head), on_duplicate)
            conn.executemany(
                "INSERT INTO streamapp_events (stream_id, version, payload, source, event_id) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )
        return result


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction on ``conn`` that takes the write lock up front (waiting up to
    the busy timeout); committed at the end, rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _versions(conn: sqlite3.Connection, stream_ids: set[str]) -> dict[str, int]:
    ids = list(stream_ids)
    out: dict[str, int] = {}
    for start in range(0, len(ids), _VERSIONS_CHUNK):
        chunk = ids[start : start + _VERSIONS_CHUNK]
        marks = ",".join("?" * len(chunk))
        out.update(
            conn.execute(
                f"SELECT stream_id, max(version) FROM streamapp_events "
                f"WHERE stream_id IN ({marks}) GROUP BY stream_id",
                chunk,
            ).fetchall()
        )
    return out


def _known(conn: sqlite3.Connection, keys: list[EventKey]) -> dict[EventKey, int]:
    """The stored position of each of ``keys`` that the store holds (the first copy)."""
    out: dict[EventKey, int] = {}
    for start in range(0, len(keys), _KEYS_CHUNK):
        chunk = keys[start : start + _KEYS_CHUNK]
        values = ",".join(["(?, ?)"] * len(chunk))
        found = conn.execute(
            "SELECT e.source, e.event_id, min(e.position) "
            f"FROM (VALUES {values}) AS k JOIN streamapp_events AS e "
            "ON e.source = k.column1 AND e.event_id = k.column2 GROUP BY e.source, e.event_id",
            [part for key in chunk for part in key],
        ).fetchall()
        out.update(((s, i), p) for s, i, p in found)
    return out


def _take_file_lock(path: Path, app_id: str, url: str) -> int:
    """The descriptor of ``path`` locked (``flock``), or the refusal naming its holder."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            raise worker_locked(app_id, url, holder or "another process") from None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            return fd
        os.close(fd)  # its holder removed it between our open and our lock: again


def _same_file(fd: int, path: Path) -> bool:
    """``fd`` is the file at ``path`` now (not one removed from it)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False
