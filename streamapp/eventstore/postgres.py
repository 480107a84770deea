"""The shared event store in PostgreSQL (psycopg 3, async).

Gap-free tailing. With a plain SERIAL position, transaction A can take position 10, B
take 11 and commit first: a reader that sees 11 moves on and never sees 10 when A commits.
Here every append transaction first takes one transaction-scoped advisory lock
(``pg_advisory_xact_lock``), then numbers its events ``max(position) + 1 ...``. The lock
is held until the transaction ends, and PostgreSQL releases a transaction's locks only
after its commit is visible to other sessions; so the next appender numbers after every
committed event, positions become visible in position order, and a reader that has seen
position n will see n + 1 next, whenever it commits. Rolled-back appends consume no
position, so positions are dense too. The price is that appends are serialised (each
holds the lock for a few round trips); batch them (:meth:`append_many`) for throughput.

The lock keys hash the schema name, so stores in different schemas of one database do not
contend. One store object holds one connection and runs one call at a time; open more
store objects for parallel appends. The forwarder lock is a session advisory lock on a
connection of its own: PostgreSQL drops it when that session ends, even by ``kill -9``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC
from typing import Any

from ..errors import ConfigError
from ..events import Event
from .base import (
    LIVE_OFFSET_SQL,
    SETTING,
    Append,
    AppendResult,
    BatchResult,
    ParkedRecord,
    StoredEvent,
    StoredRow,
    decode_headers,
    encode_headers,
    plan_batch,
    results_of,
    worker_locked,
)

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ConfigError(
        f"setting {SETTING} names a PostgreSQL store, but psycopg is not installed: "
        "install it with pip install 'streamapp[postgres]'"
    ) from exc

log = logging.getLogger(__name__)

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS streamapp_events (
        position BIGINT PRIMARY KEY,
        stream_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        payload BYTEA NOT NULL,
        UNIQUE (stream_id, version))""",
    """CREATE TABLE IF NOT EXISTS streamapp_forwarder_checkpoints (
        name TEXT PRIMARY KEY,
        next_position BIGINT NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS streamapp_forwarder_marks (
        name TEXT NOT NULL,
        topic TEXT NOT NULL,
        kafka_partition INTEGER NOT NULL,
        kafka_offset BIGINT NOT NULL,
        position BIGINT NOT NULL,
        PRIMARY KEY (topic, kafka_partition, kafka_offset, name))""",
    """CREATE TABLE IF NOT EXISTS streamapp_parked (
        id BIGSERIAL PRIMARY KEY,
        destination TEXT NOT NULL,
        key BYTEA,
        value BYTEA,
        headers TEXT NOT NULL,
        parked_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    """CREATE INDEX IF NOT EXISTS streamapp_parked_destination
        ON streamapp_parked (destination, id)""",
]
# Advisory lock keys (int4, int4): the schema's hash and one of these.
SCHEMA_KEY, APPEND_KEY, FORWARDER_KEY, WORKER_KEY = 7401, 7402, 7403, 7404
_LOCK = "hashtext(current_schema()), %s"
_COLUMNS = "position, stream_id, version, payload"

Hook = Callable[[], Awaitable[None]]


class PostgresEventStore:
    """The event store in PostgreSQL. Open with :meth:`open` (or ``open_store``).

    ``before_commit`` (tests only) runs inside every append transaction, after the
    inserts, before the commit: a test stretches transactions with it to make them overlap.
    """

    def __init__(
        self, url: str, conn: psycopg.AsyncConnection[Any], before_commit: Hook | None = None
    ) -> None:
        self.url = url
        self.reads = 0
        self.before_commit = before_commit
        self._conn = conn
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str, *, before_commit: Hook | None = None) -> PostgresEventStore:
        """Connect to ``url`` and create the schema if missing (safe to race)."""
        conn = await _connect(url, "streamapp-eventstore")
        try:
            async with conn.transaction():
                await conn.execute(f"SELECT pg_advisory_xact_lock({_LOCK})", (SCHEMA_KEY,))
                for statement in SCHEMA:
                    await conn.execute(statement)
        except BaseException:
            await conn.close()
            raise
        return cls(url, conn, before_commit)

    async def __aenter__(self) -> PostgresEventStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def append(
        self, stream_id: str, events: Sequence[Event], expected_version: int | None = None
    ) -> AppendResult:
        return (await self.append_many([Append(stream_id, events, expected_version)])).one()

    async def append_many(self, appends: Sequence[Append]) -> BatchResult:
        async with self._lock, self._conn.transaction(), self._conn.cursor() as cur:
            await cur.execute(f"SELECT pg_advisory_xact_lock({_LOCK})", (APPEND_KEY,))
            await cur.execute(
                "SELECT stream_id, max(version) FROM streamapp_events "
                "WHERE stream_id = ANY(%s) GROUP BY stream_id",
                (list({a.stream_id for a in appends}),),
            )
            versions: dict[str, int] = dict(await cur.fetchall())
            planned, error = plan_batch(appends, versions)
            await cur.execute("SELECT coalesce(max(position), 0) FROM streamapp_events")
            row = await cur.fetchone()
            head = int(row[0]) if row else 0
            rows = [
                (head + i, sid, version, payload)
                for i, (sid, version, payload) in enumerate(
                    (r for rs, _ in planned for r in rs), start=1
                )
            ]
            if rows:
                async with cur.copy(f"COPY streamapp_events ({_COLUMNS}) FROM STDIN") as copy:
                    for item in rows:
                        await copy.write_row(item)
            if self.before_commit is not None:
                await self.before_commit()
        return BatchResult(results_of(planned, head), error)

    async def read_all(self, from_position: int, limit: int) -> list[StoredEvent]:
        self.reads += 1
        return await self._select(
            f"SELECT {_COLUMNS} FROM streamapp_events WHERE position >= %s "
            "ORDER BY position LIMIT %s",
            (from_position, limit),
        )

    async def read_rows(self, from_position: int, limit: int) -> list[StoredRow]:
        self.reads += 1
        async with self._lock:
            cur = await self._conn.execute(
                "SELECT position, stream_id, payload FROM streamapp_events "
                "WHERE position >= %s ORDER BY position LIMIT %s",
                (from_position, limit),
                binary=True,
            )
            rows: list[StoredRow] = await cur.fetchall()
        return rows

    async def read_stream(self, stream_id: str) -> list[StoredEvent]:
        return await self._select(
            f"SELECT {_COLUMNS} FROM streamapp_events WHERE stream_id = %s ORDER BY version",
            (stream_id,),
        )

    async def head(self) -> int:
        async with self._lock:
            cur = await self._conn.execute(
                "SELECT coalesce(max(position), 0) FROM streamapp_events"
            )
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def close(self) -> None:
        async with self._lock:
            await self._conn.close()

    async def live_offset(self, topic: str, partition: int, position: int) -> int | None:
        """The first offset of ``topic[partition]`` that may carry a position >= ``position``
        (see :func:`streamapp.eventstore.base.LIVE_OFFSET_SQL`); None: no mark yet."""
        async with self._lock:
            cur = await self._conn.execute(
                LIVE_OFFSET_SQL.replace("?", "%s"), (topic, partition, position)
            )
            row = await cur.fetchone()
        return None if row is None or row[0] is None else int(row[0]) + 1

    @contextlib.asynccontextmanager
    async def worker_lock(self, app_id: str) -> AsyncIterator[None]:
        """Held for a store-only worker's life; a second worker of the app is refused."""
        me = f"streamapp-worker {app_id} pid {os.getpid()} on {socket.gethostname()}"
        conn = await _connect(self.url, me[:63])
        try:
            cur = await conn.execute(
                "SELECT pg_try_advisory_lock(hashtext(current_schema() || %s), %s)",
                (app_id, WORKER_KEY),
            )
            row = await cur.fetchone()
            if not (row and row[0]):
                raise worker_locked(app_id, self.url, "another session")
            yield
        finally:
            await conn.close()  # ends the session: releases the lock

    async def park(
        self,
        destination: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        async with self._lock:  # autocommit: the INSERT is committed when it returns
            await self._conn.execute(
                "INSERT INTO streamapp_parked (destination, key, value, headers) "
                "VALUES (%s, %s, %s, %s)",
                (destination, key, value, encode_headers(headers)),
            )

    async def parked(self, destination: str) -> list[ParkedRecord]:
        async with self._lock:
            cur = await self._conn.execute(
                "SELECT id, destination, key, value, headers, parked_at FROM streamapp_parked "
                "WHERE destination = %s ORDER BY id",
                (destination,),
            )
            rows = await cur.fetchall()
        return [
            ParkedRecord(
                i,
                d,
                None if k is None else bytes(k),
                None if v is None else bytes(v),
                decode_headers(h),
                at.astimezone(UTC),
            )
            for i, d, k, v, h, at in rows
        ]

    def forwarder_state(self, name: str) -> PostgresForwarderState:
        """The lock (a session advisory lock) and checkpoint of forwarder ``name``."""
        return PostgresForwarderState(self, name)

    async def _select(self, query: str, params: tuple[Any, ...]) -> list[StoredEvent]:
        async with self._lock:
            cur = await self._conn.execute(query, params, binary=True)
            rows = await cur.fetchall()
        return [StoredEvent(p, s, v, bytes(b)) for p, s, v, b in rows]


class PostgresForwarderState:
    """A forwarder's checkpoint in the store's database, its lock a session advisory lock.

    Checkpoints are written through the lock's own session: had that session been lost
    (and the lock with it), the write fails instead of racing the forwarder that took over.
    """

    def __init__(self, store: PostgresEventStore, name: str, *, poll_s: float = 0.5) -> None:
        self.store = store
        self.name = name
        self.poll_s = poll_s
        self._conn: psycopg.AsyncConnection[Any] | None = None

    @contextlib.asynccontextmanager
    async def lock(self) -> AsyncIterator[None]:
        me = f"streamapp-forwarder {self.name} pid {os.getpid()} on {socket.gethostname()}"
        conn = await _connect(self.store.url, me[:63])
        try:
            waited = False
            while True:
                cur = await conn.execute(f"SELECT pg_try_advisory_lock({_LOCK})", (FORWARDER_KEY,))
                row = await cur.fetchone()
                if row and row[0]:
                    break
                if not waited:
                    log.info(
                        "forwarder %s waits: the forwarder lock is held by %s",
                        self.name,
                        await _holder(conn),
                    )
                    waited = True
                await asyncio.sleep(self.poll_s)
            log.info("forwarder %s holds the forwarder lock", self.name)
            self._conn = conn
            yield
        finally:
            self._conn = None
            await conn.close()  # ends the session: releases the lock

    async def load(self) -> int:
        async with self.store._lock:
            cur = await self.store._conn.execute(
                "SELECT next_position FROM streamapp_forwarder_checkpoints WHERE name = %s",
                (self.name,),
            )
            row = await cur.fetchone()
        return 1 if row is None else int(row[0])

    async def save(self, next_position: int, offsets: Sequence[tuple[str, int, int, int]]) -> None:
        conn = self._conn
        if conn is None:
            raise RuntimeError("save() needs the forwarder lock: call it inside lock()")
        async with conn.transaction(), conn.cursor() as cur:
            await cur.execute(
                "INSERT INTO streamapp_forwarder_checkpoints (name, next_position) "
                "VALUES (%s, %s) ON CONFLICT (name) DO UPDATE "
                "SET next_position = excluded.next_position, updated_at = now()",
                (self.name, next_position),
            )
            await cur.executemany(
                "INSERT INTO streamapp_forwarder_marks VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                [(self.name, *row) for row in offsets],
            )


async def _connect(url: str, application_name: str) -> psycopg.AsyncConnection[Any]:
    try:
        return await psycopg.AsyncConnection.connect(
            url, autocommit=True, application_name=application_name, connect_timeout=10
        )
    except psycopg.Error as exc:
        raise ConfigError(
            f"setting {SETTING}: cannot connect to the PostgreSQL store: {exc}".strip()
        ) from exc


async def _holder(conn: psycopg.AsyncConnection[Any]) -> str:
    cur = await conn.execute(
        "SELECT a.application_name, a.client_addr FROM pg_locks l "
        "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
        "AND l.granted AND l.objsubid = 2 AND l.objid = %s AND a.pid <> pg_backend_pid()",
        (FORWARDER_KEY,),
    )
    row = await cur.fetchone()
    return f"{row[0]} ({row[1] or 'local'})" if row else "another session"
