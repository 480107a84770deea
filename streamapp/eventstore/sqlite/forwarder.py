"""A forwarder's checkpoint and lock in the embedded SQLite store (:mod:`.sqlite`)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

log = logging.getLogger("streamapp.eventstore.sqlite")  # the store's own logger

T = TypeVar("T")


class SqliteFile(Protocol):
    """What the forwarder state needs of its store
    (:class:`~streamapp.eventstore.sqlite.store.SqliteEventStore`, which makes it: a
    protocol, so that this module does not import the store back)."""

    @property
    def path(self) -> Path:
        """The store's database file (the forwarder lock is next to it)."""
        ...

    async def with_connection(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` in the store's thread, one call at a time."""
        ...


class SqliteForwarderState:
    """A forwarder's checkpoint in the store file, its lock on ``<db>.forwarder.lock``.

    The lock is ``flock``: the kernel drops it when the holder dies, even by ``kill -9``,
    so a waiting forwarder takes over within one poll.
    """

    def __init__(self, store: SqliteFile, name: str, *, poll_s: float = 0.5) -> None:
        self.store = store
        self.name = name
        self.poll_s = poll_s
        self.lock_path = store.path.with_name(store.path.name + ".forwarder.lock")

    @contextlib.asynccontextmanager
    async def lock(self) -> AsyncIterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            waited = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waited:
                        holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                        log.info(
                            "forwarder %s waits: the forwarder lock %s is held by %s",
                            self.name,
                            self.lock_path,
                            holder or "another process",
                        )
                        waited = True
                    await asyncio.sleep(self.poll_s)
            me = f"forwarder {self.name} pid {os.getpid()} on {socket.gethostname()}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, me.encode(), 0)
            log.info("forwarder %s holds the forwarder lock %s", self.name, self.lock_path)
            yield
        finally:
            os.close(fd)  # releases the lock

    async def load(self) -> int:
        def load(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT next_position FROM streamapp_forwarder_checkpoints WHERE name = ?",
                (self.name,),
            ).fetchone()
            return 1 if row is None else int(row[0])

        return await self.store.with_connection(load)

    async def save(self, next_position: int, offsets: Sequence[tuple[str, int, int, int]]) -> None:
        def save(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT INTO streamapp_forwarder_checkpoints VALUES (?, ?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET next_position = excluded.next_position, "
                    "updated_at = excluded.updated_at",
                    (self.name, next_position, time.time()),
                )
                conn.executemany(
                    "INSERT OR IGNORE INTO streamapp_forwarder_marks VALUES (?, ?, ?, ?, ?)",
                    [(self.name, *row) for row in offsets],
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        await self.store.with_connection(save)
