"""The PostgreSQL store's session locks: the forwarder's and the embedded worker's.

Both are session advisory locks on connections of their own: PostgreSQL drops them when
that session ends, even by ``kill -9``, and with a server restart (PITFALLS: a process
that held one must assume it lost it after any reconnect). A forwarder watches its
lock's session and, when it is lost, is stopped at once (its publishing is cancelled);
it takes the lock again before it publishes again. A worker whose lock was taken over
while its session was lost stops, as it would have been refused at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg

from ...errors import ConfigError, LockLostError
from ...settings.store_url import SETTING
from ..base import worker_locked
from .session import Connection, Outage, Session, close_quietly, connect, lost, redacted

log = logging.getLogger("streamapp.eventstore.postgres")

SCHEMA_KEY, APPEND_KEY, FORWARDER_KEY, WORKER_KEY = 7401, 7402, 7403, 7404
"""Advisory lock keys (the second key; the first hashes the schema name, :data:`LOCK`)."""
LOCK = "hashtext(current_schema()), %s"
"""The arguments of a lock of this schema: stores in different schemas do not contend."""


class PostgresForwarderState:
    """A forwarder's checkpoint in the store's database, its lock a session advisory lock.

    Checkpoints are written through the lock's own session: had that session been lost
    (and the lock with it), the write fails instead of racing the forwarder that took over.
    While the lock is held, a watcher checks its session every ``poll_s``; when it is lost,
    the body of :meth:`lock` is cancelled at once and :meth:`lock` raises LockLostError.
    A new holder waits two checks before its body runs, so that a previous holder whose
    session ended (the reason the lock was free) has stopped publishing; a holder that
    lost the lock waits as long before it tries again, so a waiting forwarder goes first.
    """

    def __init__(self, session: Session, url: str, name: str, *, poll_s: float = 0.5) -> None:
        self.session, self.url = session, url
        self.name = name
        self.poll_s = poll_s
        self._conn: Connection | None = None
        self._lost: BaseException | None = None
        self._use = asyncio.Lock()  # one statement at a time on the lock's session

    @contextlib.asynccontextmanager
    async def lock(self) -> AsyncIterator[None]:
        if self.is_lost():  # lost it just now: let a forwarder that was waiting go first
            await asyncio.sleep(2 * self.poll_s)
        conn = await self._take()
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        self._conn, self._lost = conn, None
        watch = asyncio.create_task(self._watch(conn, task), name=f"forwarder lock {self.name}")
        try:
            # A previous holder whose session just ended notices within one check and
            # stops at once: give it that check (and a margin) before publishing.
            await asyncio.sleep(2 * self.poll_s)
            yield
        except asyncio.CancelledError:
            if self.is_lost() and task.uncancel() <= cancelling:
                raise self._lost_error() from None
            raise
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            self._conn = None
            await close_quietly(conn)  # ends the session: releases the lock

    async def load(self) -> int:
        async def load(conn: Connection) -> int:
            cur = await conn.execute(
                "SELECT next_position FROM streamapp_forwarder_checkpoints WHERE name = %s",
                (self.name,),
            )
            row = await cur.fetchone()
            return 1 if row is None else int(row[0])

        return await self.session.run(load, "loading the forwarder checkpoint")

    async def save(self, next_position: int, offsets: Sequence[tuple[str, int, int, int]]) -> None:
        conn = self._conn
        if conn is None:
            raise RuntimeError("save() needs the forwarder lock: call it inside lock()")
        if self._lost is not None:
            raise self._lost_error()
        try:
            async with self._use, conn.transaction(), conn.cursor() as cur:
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
        except Exception as exc:
            if not lost(exc, conn):
                raise
            self._lost = self._lost or exc
            raise self._lost_error() from exc

    async def _take(self) -> Connection:
        """A session holding the forwarder lock: waits while another holds it, and
        reconnects (logging once per outage) while the server does not answer."""
        me = f"streamapp-forwarder {self.name} pid {os.getpid()} on {socket.gethostname()}"
        outage = Outage(f"forwarder {self.name}: PostgreSQL {redacted(self.url)}")
        conn: Connection | None = None
        waited = False
        delay = 0.1
        try:
            while True:
                try:
                    if conn is None:
                        conn = await connect(self.url, me[:63])
                    cur = await conn.execute(
                        f"SELECT pg_try_advisory_lock({LOCK})", (FORWARDER_KEY,)
                    )
                    row = await cur.fetchone()
                    outage.up()
                    if row and row[0]:
                        log.info("forwarder %s holds the forwarder lock", self.name)
                        return conn
                    if not waited:
                        log.info(
                            "forwarder %s waits: the forwarder lock is held by %s",
                            self.name,
                            await _holder(conn),
                        )
                        waited = True
                    await asyncio.sleep(self.poll_s)
                except Exception as exc:
                    if not lost(exc, conn):
                        raise
                    await close_quietly(conn)
                    conn = None
                    outage.down(exc, "taking the forwarder lock")
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
        except BaseException:
            await close_quietly(conn)
            raise

    async def _watch(self, conn: Connection, holder: asyncio.Task[Any]) -> None:
        """Every ``poll_s``, a round trip on the lock's session; lost: cancel ``holder``."""
        while self._lost is None:
            await asyncio.sleep(self.poll_s)
            try:
                async with self._use:
                    await conn.execute("SELECT 1")
            except Exception as exc:
                if not lost(exc, conn):
                    log.debug("forwarder %s: lock check failed: %r", self.name, exc)
                    continue
                if self._lost is None:
                    self._lost = exc
                    holder.cancel()
                return

    def is_lost(self) -> bool:
        """True once the lock's session was found lost (until the lock is taken again)."""
        return self._lost is not None

    def _lost_error(self) -> LockLostError:
        return LockLostError(
            f"forwarder {self.name} lost the forwarder lock with its PostgreSQL session "
            f"({self._lost!r}) on {redacted(self.url)}"
        )


class PostgresWorkerLock:
    """An embedded worker's lock: a session advisory lock on a connection of its own.

    When that session is lost (a server restart), a watcher reconnects and takes the
    lock again. Should another worker have taken it meanwhile, ``taken_over`` is set
    (``error`` says who and what to do): the worker must stop, as it would have been
    refused at start.
    """

    def __init__(self, url: str, application_name: str, app_id: str, poll_s: float = 0.5):
        self.url, self.application_name, self.app_id = url, application_name, app_id
        self.poll_s = poll_s
        self.taken_over = asyncio.Event()
        self.error: ConfigError | None = None
        self._conn: Connection | None = None
        self._watch: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        try:
            taken = await self._take()
        except psycopg.Error as exc:
            await self._release()
            raise ConfigError(
                f"setting {SETTING}: cannot take the worker lock on the PostgreSQL store: {exc}"
            ) from exc
        if not taken:
            await self._release()
            raise worker_locked(self.app_id, self.url, "another session")
        self._watch = asyncio.create_task(self._watching(), name=f"worker lock {self.app_id}")

    async def __aexit__(self, *exc: object) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        await self._release()

    async def _release(self) -> None:
        conn, self._conn = self._conn, None
        await close_quietly(conn)  # ends the session: releases the lock

    async def _take(self) -> bool:
        """Connect if needed and try the lock once; psycopg errors go out."""
        if self._conn is None:
            self._conn = await connect(self.url, self.application_name)
        cur = await self._conn.execute(
            "SELECT pg_try_advisory_lock(hashtext(current_schema() || %s), %s)",
            (self.app_id, WORKER_KEY),
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    async def _watching(self) -> None:
        outage = Outage(f"worker lock of app {self.app_id!r}: PostgreSQL {redacted(self.url)}")
        held = True
        while True:
            await asyncio.sleep(self.poll_s)
            conn = self._conn
            try:
                if held:
                    assert conn is not None
                    await conn.execute("SELECT 1")
                    continue
                held = await self._take()
                outage.up()
            except Exception as exc:
                if not lost(exc, conn):
                    raise
                await self._release()
                held = False
                outage.down(exc, "holding the worker lock")
                continue
            if not held:
                holder = "another session"
                with contextlib.suppress(Exception):
                    holder = await _holder(self._conn, WORKER_KEY) if self._conn else holder
                self.error = worker_locked(
                    self.app_id,
                    self.url,
                    f"{holder}, which took the lock while this worker's session was lost",
                )
                log.error("%s", self.error)
                self.taken_over.set()
                return


async def _holder(conn: psycopg.AsyncConnection[Any], key: int = FORWARDER_KEY) -> str:
    cur = await conn.execute(
        "SELECT a.application_name, a.client_addr FROM pg_locks l "
        "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
        "AND l.granted AND l.objsubid = 2 AND l.objid = %s AND a.pid <> pg_backend_pid()",
        (key,),
    )
    row = await cur.fetchone()
    return f"{row[0]} ({row[1] or 'local'})" if row else "another session"
