"""The event store contract on PostgreSQL, and gap-free tailing under concurrent appends.

Each test gets a schema of its own (``search_path`` in the URL), so tests never share rows.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
from conftest import PgUrlFactory
from unit.test_eventstore import EventStoreContract, ev

from streamapp.eventstore import EventStoreBackend, open_store
from streamapp.eventstore.postgres.store import PostgresEventStore
from tests.support.waits import finished, until

pytestmark = pytest.mark.integration


@pytest.fixture
async def pg_url(pg_url_factory: PgUrlFactory) -> AsyncIterator[str]:
    async with pg_url_factory() as url:
        yield url


class TestPostgresEventStore(EventStoreContract):
    @pytest.fixture
    async def store(self, pg_url: str) -> AsyncIterator[EventStoreBackend]:
        store = await open_store(pg_url)
        yield store
        await store.close()


async def test_reopen_keeps_events(pg_url: str) -> None:
    first = await open_store(pg_url)
    await first.append("a", [ev("a", 1)])
    await first.close()
    again = await open_store(pg_url)  # the schema exists: opening is idempotent
    try:
        assert [(r.position, r.version) for r in await again.read_all(1, 10)] == [(1, 1)]
    finally:
        await again.close()


async def test_tailing_reader_never_skips_a_position_under_concurrent_appenders(
    pg_url: str,
) -> None:
    """4 appenders whose transactions overlap (some sleep before committing) and a reader
    tailing read_all: it must see every position exactly once, in order. With a SERIAL
    position a fast transaction would commit a higher position first and the reader,
    having moved past it, would skip the slow one's position."""
    rng = random.Random(11)

    async def stretch() -> None:
        if rng.random() < 0.3:
            await asyncio.sleep(rng.uniform(0.005, 0.03))

    appenders = [await PostgresEventStore.open(pg_url, before_commit=stretch) for _ in range(4)]
    reader = await open_store(pg_url)
    per_appender, batch = 60, 3
    done = asyncio.Event()

    async def append(i: int, store: PostgresEventStore) -> None:
        for n in range(per_appender):
            stream = f"w{i}-{n % 7}"
            await store.append(stream, [ev(stream, n) for _ in range(batch)])

    seen: list[int] = []

    async def tail() -> None:
        next_pos = 1

        async def at_head() -> bool:
            nonlocal next_pos
            finished = done.is_set()
            rows = await reader.read_all(next_pos, 50)
            for row in rows:
                assert row.position == next_pos, f"expected position {next_pos}, got {row}"
                seen.append(row.position)
                next_pos += 1
            return finished and not rows

        await until(
            at_head,
            what="the reader at the head once every append committed",
            progress=lambda: (next_pos, done.is_set()),
            poll_s=0.001,
        )

    async def appending() -> None:
        await asyncio.gather(*(append(i, s) for i, s in enumerate(appenders)))
        done.set()

    tailing = asyncio.create_task(tail())
    try:
        await asyncio.gather(appending(), tailing)  # a reader that stood still fails it
        total = 4 * per_appender * batch
        assert seen == list(range(1, total + 1))
        assert await reader.head() == total
    finally:
        tailing.cancel()
        for s in [*appenders, reader]:
            await s.close()


async def test_forwarder_lock_is_exclusive_and_freed_with_its_session(pg_url: str) -> None:
    first, second = await open_store(pg_url), await open_store(pg_url)
    try:
        a, b = first.forwarder_state("fwd"), second.forwarder_state("fwd")
        assert await a.load() == 1
        async with a.lock():
            await a.save(11, [("t", 0, 41, 10), ("t", 1, 7, 9)])
            b_lock = b.lock()
            waiting = asyncio.create_task(b_lock.__aenter__())
            await asyncio.sleep(1.0)
            assert not waiting.done(), "a second forwarder got the lock while the first held it"
        await finished(waiting, what="the lock taken once the first released it")
        await b.save(12, [("t", 0, 42, 11)])
        await b_lock.__aexit__(None, None, None)
        assert await a.load() == 12
    finally:
        await first.close()
        await second.close()
