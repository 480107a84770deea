"""Appends skip an event whose (source, id) is already stored, on SQLite and PostgreSQL:
the quick start's file appended twice stores it once, ``--on-duplicate=fail`` stops at
the first duplicate, stores made before the index get it at open, and an append whose
COMMIT reply is lost is neither stored twice nor counted as duplicates of itself."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from click.testing import CliRunner
from conftest import PgUrlFactory, Services

from streamapp import Event
from streamapp.cli import main
from streamapp.codecs.structured import to_json
from streamapp.errors import DuplicateEventError
from streamapp.eventstore import Append, open_store
from streamapp.eventstore.postgres.store import PostgresEventStore

from .harness import Proxy

pytestmark = [pytest.mark.integration]

QUICK_START = (
    b'{"specversion":"1.0","id":"e1","source":"shop","type":"order.placed",'
    b'"streamid":"order-17","datacontenttype":"application/json","data":{"total":12}}\n'
    b'{"specversion":"1.0","id":"e2","source":"shop","type":"order.paid",'
    b'"streamid":"order-17","datacontenttype":"application/json","data":{"total":12}}\n'
)
OLD_EVENTS_TABLE = (
    "CREATE TABLE streamapp_events (position {pk} PRIMARY KEY, stream_id TEXT NOT NULL, "
    "version INTEGER NOT NULL, payload {blob} NOT NULL, UNIQUE (stream_id, version))"
)
"""The events table as stores made before the (source, id) index have it."""


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store URL: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'events.db'}"
        return
    services: Services = request.getfixturevalue("services")
    schema = f"es_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(services.postgres, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{services.postgres}?options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(services.postgres, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _event(event_id: str, stream: str = "s-1", source: str = "shop") -> Event:
    return Event.create("order.placed", stream_id=stream, source=source, id=event_id, data={})


async def _ids(url: str) -> list[tuple[int, str, int, str]]:
    store = await open_store(url)
    try:
        return [
            (r.position, r.stream_id, r.version, r.event().id)
            for r in await store.read_all(1, 1000)
        ]
    finally:
        await store.close()


def test_the_quick_start_file_appended_twice_is_stored_once(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMAPP_BROKER", "none")
    monkeypatch.setenv("STREAMAPP_EVENT_STORE", store_url)
    orders = tmp_path / "orders.jsonl"
    orders.write_bytes(QUICK_START)
    append = ["store", "append", "-A", "agents.orders:app", str(orders)]
    first = CliRunner().invoke(main, append)
    assert first.exit_code == 0, first.output
    assert first.output.strip() == "appended 2 events; head position 2"
    again = CliRunner().invoke(main, append)
    assert again.exit_code == 0, again.output
    assert again.output.strip() == "appended 0 events, skipped 2 already stored; head position 2"

    # A new event after an old one: the old is skipped, the new gets the next version.
    orders.write_bytes(QUICK_START + QUICK_START.splitlines()[0].replace(b'"e1"', b'"e3"'))
    more = CliRunner().invoke(main, append)
    assert more.output.strip() == "appended 1 events, skipped 2 already stored; head position 3"

    # --on-duplicate=fail: a bad line naming the event; lines before it stay appended.
    orders.write_bytes(QUICK_START.replace(b'"e1"', b'"e4"'))
    failed = CliRunner().invoke(main, [*append, "--on-duplicate=fail"])
    assert failed.exit_code == 1
    assert "appended 1 events; head position 4" in failed.output
    assert "line 2: event 'e2' of source 'shop' (stream 'order-17') is already in the store" in (
        failed.output
    )
    assert "at position 2" in failed.output
    rows = asyncio.run(_ids(store_url))
    assert [(r[2], r[3]) for r in rows] == [(1, "e1"), (2, "e2"), (3, "e3"), (4, "e4")]


async def test_the_store_api_skips_or_refuses_stored_events(store_url: str) -> None:
    store = await open_store(store_url)
    try:
        await store.append("s-1", [_event("a"), _event("b")])
        # Same id from another source is another event; a repeat within the batch is one.
        result = await store.append_many(
            [
                Append("s-1", [_event("a"), _event("c")]),
                Append("s-2", [_event("a", "s-2", source="other")]),
                Append("s-2", [_event("c", "s-2")]),
                Append("s-1", [_event("b")], expected_version=0),  # all skipped: no check
            ]
        )
        assert result.error is None
        assert result.skipped == 3
        assert [(r.position, r.version) for r in result.results] == [(3, 3), (4, 1), (3, 1), (2, 3)]
        with pytest.raises(DuplicateEventError, match=r"'b' of source 'shop'.*at position 2"):
            await store.append("s-1", [_event("d"), _event("b")], on_duplicate="fail")
        refused = await store.append_many(
            [Append("s-3", [_event("e", "s-3")]), Append("s-3", [_event("e", "s-3")])],
            on_duplicate="fail",
        )
        assert isinstance(refused.error, DuplicateEventError)
        assert len(refused.results) == 1  # the batch stops there, as at a version conflict
        assert await store.head() == 5
    finally:
        await store.close()
    assert [r[1:] for r in await _ids(store_url)] == [
        ("s-1", 1, "a"),
        ("s-1", 2, "b"),
        ("s-1", 3, "c"),
        ("s-2", 1, "a"),
        ("s-3", 1, "e"),
    ]


async def test_a_store_made_before_the_index_gets_it_at_open(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Old rows get their (source, id) from their payloads; two rows that already share
    one stay (the store never deletes), the open says how many, appends skip that id."""
    rows = [("s-1", 1, _event("a")), ("s-1", 2, _event("b")), ("s-2", 1, _event("a", "s-2"))]
    if store_url.startswith("sqlite"):
        path = store_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            conn.execute(OLD_EVENTS_TABLE.format(pk="INTEGER", blob="BLOB"))
            conn.executemany(
                "INSERT INTO streamapp_events (stream_id, version, payload) VALUES (?, ?, ?)",
                [(s, v, to_json(e)) for s, v, e in rows],
            )
    else:
        async with await psycopg.AsyncConnection.connect(store_url, autocommit=True) as conn:
            await conn.execute(OLD_EVENTS_TABLE.format(pk="BIGINT", blob="BYTEA"))
            for position, (s, v, e) in enumerate(rows, start=1):
                await conn.execute(
                    "INSERT INTO streamapp_events VALUES (%s, %s, %s, %s)",
                    (position, s, v, to_json(e)),
                )
    with caplog.at_level(logging.INFO, logger="streamapp"):
        store = await open_store(store_url)
    try:
        assert "1 events (source, id) were already stored more than once" in caplog.text
        assert "these rows stay" in caplog.text
        result = await store.append_many(
            [
                Append("s-1", [_event("a"), _event("b"), _event("z")]),
                Append("s-3", [_event("x", "s-3")]),
            ]
        )
        assert (result.skipped, await store.head()) == (2, 5)
    finally:
        await store.close()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="streamapp"):
        await (await open_store(store_url)).close()
    assert "indexed" not in caplog.text  # once


async def test_an_append_whose_commit_reply_is_lost_keeps_its_skip_count(
    services: Services, pg_url_factory: PgUrlFactory
) -> None:
    """The retry finds the rows the cut-off COMMIT stored and returns that attempt's
    result: one skipped (stored before), not four (its own rows, had it looked again)."""
    async with pg_url_factory() as url:
        await _lose_a_commit_reply(services, url)


async def _lose_a_commit_reply(services: Services, store_url: str) -> None:
    port = int(services.postgres.rsplit(":", 1)[1].split("/")[0])
    proxy = Proxy("127.0.0.1", port)
    proxy_port = await proxy.start()
    via = store_url.replace(f"127.0.0.1:{port}/", f"127.0.0.1:{proxy_port}/")
    assert via != store_url
    store = await PostgresEventStore.open(via)
    try:
        await store.append("s-1", [_event("a")])
        armed = [True]

        async def lose_the_commit_reply() -> None:
            if armed.pop() if armed else False:
                proxy.cut_at_reply()

        store.before_commit = lose_the_commit_reply
        result = await store.append_many(
            [Append("s-1", [_event("a"), _event("b"), _event("c"), _event("d")])]
        )
    finally:
        await store.close()
        await proxy.stop()
    assert (proxy.replies_dropped, store.session.reconnects) == (1, 1)
    assert result.skipped == 1
    assert [(r.position, r.version) for r in result.results] == [(4, 4)]
    assert [r[3] for r in await _ids(store_url)] == ["a", "b", "c", "d"]
