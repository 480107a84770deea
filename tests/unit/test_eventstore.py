"""Event store contract (one harness, one subclass per store), SQLite here, plus URLs.

The PostgreSQL subclass lives in tests/integration/test_eventstore_pg.py.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from streamapp import ConfigError, Event
from streamapp.eventstore import (
    Append,
    ConcurrencyError,
    EventStoreBackend,
    InvalidEventError,
    open_store,
    parse_url,
)
from streamapp.eventstore.sqlite.store import SqliteEventStore, _same_file


def ev(stream: str, n: int = 0, version: int | None = None, **ext: str) -> Event:
    return Event.create(
        "thing.happened", stream_id=stream, data={"n": n}, version=version, extensions=ext
    )


class EventStoreContract:
    """Every store passes these; a subclass gives the ``store`` fixture."""

    async def test_empty(self, store: EventStoreBackend) -> None:
        assert await store.head() == 0
        assert await store.read_all(1, 10) == []
        assert await store.read_stream("nope") == []

    async def test_append_sets_positions_versions_and_payload(
        self, store: EventStoreBackend
    ) -> None:
        first = await store.append("a", [ev("a", 1), ev("a", 2)], expected_version=0)
        assert (first.position, first.version) == (2, 2)
        second = await store.append("b", [ev("b", 3)])
        assert (second.position, second.version) == (3, 1)
        third = await store.append("a", [ev("a", 4)], expected_version=2)
        assert (third.position, third.version) == (4, 3)
        assert await store.head() == 4
        rows = await store.read_all(1, 100)
        assert [(r.position, r.stream_id, r.version) for r in rows] == [
            (1, "a", 1),
            (2, "a", 2),
            (3, "b", 1),
            (4, "a", 3),
        ]
        for row in rows:
            body = orjson.loads(row.payload)
            assert body["streamid"] == row.stream_id
            assert body["streamversion"] == str(row.version)
            event = row.event()
            assert event.stream_id == row.stream_id
            assert event.stream_version == row.version
        assert [r.event().data["n"] for r in rows] == [1, 2, 3, 4]

    async def test_stream_id_is_set_when_the_event_has_none(self, store: EventStoreBackend) -> None:
        bare = Event(id="e1", source="tests", type="t", subject="other")
        await store.append("s", [bare])
        (row,) = await store.read_stream("s")
        assert row.event().stream_id == "s"
        assert row.event().subject == "other"

    async def test_conflict_names_stream_expected_actual_and_appends_nothing(
        self, store: EventStoreBackend
    ) -> None:
        await store.append("a", [ev("a"), ev("a")])
        with pytest.raises(ConcurrencyError) as info:
            await store.append("a", [ev("a"), ev("a")], expected_version=1)
        err = info.value
        assert (err.stream_id, err.expected, err.actual) == ("a", 1, 2)
        for part in ("'a'", "expected version 1", "actual version 2", "nothing appended"):
            assert part in str(err)
        with pytest.raises(ConcurrencyError, match="actual version 2"):
            await store.append("a", [ev("a")], expected_version=0)
        with pytest.raises(ConcurrencyError, match="actual version 0"):
            await store.append("new", [ev("new")], expected_version=3)
        assert await store.head() == 2
        assert len(await store.read_stream("a")) == 2

    async def test_carried_stream_version_is_the_expected_version(
        self, store: EventStoreBackend
    ) -> None:
        await store.append("a", [ev("a", version=1), ev("a", version=2)])
        with pytest.raises(ConcurrencyError, match="streamversion 2"):
            await store.append("a", [ev("a", version=2)])
        with pytest.raises(ConcurrencyError, match="carries streamversion 4"):
            await store.append("a", [ev("a", version=4)], expected_version=2)
        with pytest.raises(ConcurrencyError):  # versions inside one append must be a run
            await store.append("a", [ev("a", version=3), ev("a", version=5)])
        result = await store.append("a", [ev("a", version=3), ev("a")], expected_version=2)
        assert result.version == 4
        assert [r.version for r in await store.read_stream("a")] == [1, 2, 3, 4]

    async def test_an_event_of_another_stream_is_refused(self, store: EventStoreBackend) -> None:
        with pytest.raises(InvalidEventError, match=r"streamid 'b'.*stream 'a'"):
            await store.append("a", [ev("a"), ev("b")])
        assert await store.head() == 0

    async def test_read_all_from_and_limit(self, store: EventStoreBackend) -> None:
        for i in range(10):
            await store.append(f"s{i % 3}", [ev(f"s{i % 3}", i)])
        assert [r.position for r in await store.read_all(1, 3)] == [1, 2, 3]
        assert [r.position for r in await store.read_all(4, 3)] == [4, 5, 6]
        assert [r.position for r in await store.read_all(9, 100)] == [9, 10]
        assert await store.read_all(11, 100) == []
        assert [r.position for r in await store.read_all(0, 2)] == [1, 2]
        reads = store.reads
        await store.read_all(1, 1)
        assert store.reads == reads + 1

    async def test_read_rows_are_read_all_as_plain_tuples(self, store: EventStoreBackend) -> None:
        for i in range(7):
            await store.append(f"s{i % 3}", [ev(f"s{i % 3}", i)])
        assert await store.read_rows(8, 10) == []
        for start, limit in ((1, 100), (3, 2), (6, 5)):
            rows = await store.read_rows(start, limit)
            assert all(type(row) is tuple for row in rows)  # not NamedTuples: see StoredRow
            events = await store.read_all(start, limit)
            assert rows == [(r.position, r.stream_id, r.version, r.payload) for r in events]
        reads = store.reads
        await store.read_rows(1, 1)
        assert store.reads == reads + 1

    async def test_read_stream_in_version_order(self, store: EventStoreBackend) -> None:
        await store.append("a", [ev("a", 1)])
        await store.append("b", [ev("b", 2)])
        await store.append("a", [ev("a", 3), ev("a", 4)])
        rows = await store.read_stream("a")
        assert [(r.version, r.position) for r in rows] == [(1, 1), (2, 3), (3, 4)]

    async def test_append_many_stops_at_the_first_failure(self, store: EventStoreBackend) -> None:
        await store.append("x", [ev("x")])
        result = await store.append_many(
            [
                Append("a", [ev("a", 1)], 0),
                Append("a", [ev("a", 2)], 1),
                Append("x", [ev("x")], 0),  # x is at 1
                Append("b", [ev("b")]),
            ]
        )
        assert [(r.position, r.version) for r in result.results] == [(2, 1), (3, 2)]
        assert isinstance(result.error, ConcurrencyError)
        assert result.error.stream_id == "x"
        assert await store.head() == 3
        assert await store.read_stream("b") == []

    async def test_append_says_how_many_it_skipped_as_duplicates(
        self, store: EventStoreBackend
    ) -> None:
        first, second = ev("d", 1), ev("d", 2)
        assert (await store.append("d", [first])).skipped == 0
        again = await store.append("d", [first, second, second])  # stored, new, repeated
        assert (again.position, again.version, again.skipped) == (2, 2, 2)
        only_stored = await store.append("d", [first])
        assert (only_stored.position, only_stored.version, only_stored.skipped) == (1, 2, 1)

    async def test_concurrent_appends_to_one_stream_conflict(
        self, store: EventStoreBackend
    ) -> None:
        outcomes = await asyncio.gather(
            *(store.append("race", [ev("race", i)], expected_version=0) for i in range(5)),
            return_exceptions=True,
        )
        assert sum(not isinstance(o, BaseException) for o in outcomes) == 1
        assert all(isinstance(o, ConcurrencyError) for o in outcomes if isinstance(o, Exception))
        assert len(await store.read_stream("race")) == 1

    async def test_parked_records_round_trip_exactly_in_park_order(
        self, store: EventStoreBackend
    ) -> None:
        """Bytes that are not UTF-8 (and NUL, and empty) come back as they went in; a
        destination reads only its own records, in park order; parking is no event."""
        headers = [
            ("ce_id", b"e-1"),
            ("x-bin", b"\xff\x00\xfe"),
            ("x-bin", b""),  # repeated names and empty values are kept, in order
            ("streamapp-park-reason", "caf\u00e9: boom".encode()),
        ]
        before = datetime.now(UTC) - timedelta(seconds=1)
        await store.park("p.one", b"\x00\xffraw\n", key=b"\xfek", headers=headers)
        await store.park("p.two", b"other")
        await store.park("p.one", None)  # a tombstone-like record: no key, value, headers
        await store.park("p.one", b"")
        after = datetime.now(UTC) + timedelta(seconds=1)

        one = await store.parked("p.one")
        assert [(r.destination, r.key, r.value, r.headers) for r in one] == [
            ("p.one", b"\xfek", b"\x00\xffraw\n", headers),
            ("p.one", None, None, []),
            ("p.one", None, b"", []),
        ]
        assert one[0].reason == "caf\u00e9: boom"
        assert one[0].header("x-bin") == b""  # the last of a repeated name
        assert one[1].reason == ""
        assert [r.id for r in one] == sorted(r.id for r in one)
        assert all(before <= r.parked_at <= after for r in one)
        assert all(r.parked_at.utcoffset() == timedelta(0) for r in one)
        (two,) = await store.parked("p.two")
        assert (two.value, one[0].id < two.id < one[1].id) == (b"other", True)
        assert await store.parked("p.none") == []
        assert await store.head() == 0  # parked copies are not events

    async def test_a_park_is_committed_when_it_returns(self, store: EventStoreBackend) -> None:
        """Another connection (another process) sees a park as soon as park() returned."""
        other = await open_store(store.url)
        try:
            assert await other.parked("p") == []  # the schema exists for a second opener
            await store.park("p", b"v", key=b"k", headers=[("h", b"\x80")])
            (seen,) = await other.parked("p")
            assert (seen.key, seen.value, seen.headers) == (b"k", b"v", [("h", b"\x80")])
        finally:
            await other.close()


class TestSqliteEventStore(EventStoreContract):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[EventStoreBackend]:
        store = await open_store(f"sqlite:///{tmp_path}/events.db")
        yield store
        await store.close()


# --- SQLite only ------------------------------------------------------------------


async def test_sqlite_reopen_keeps_events_and_shares_the_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/events.db"
    first = await open_store(url)
    second = await open_store(url)  # another process would do the same
    await first.append("a", [ev("a", 1)])
    await second.append("a", [ev("a", 2)], expected_version=1)
    with pytest.raises(ConcurrencyError):
        await first.append("a", [ev("a", 3)], expected_version=1)
    await first.close()
    await second.close()
    again = await open_store(url)
    try:
        assert [(r.position, r.version) for r in await again.read_all(1, 10)] == [(1, 1), (2, 2)]
        assert await again.head() == 2
    finally:
        await again.close()


async def test_sqlite_relative_url_is_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = await open_store("sqlite:///sub/dir/events.db?create=1")
    try:
        assert isinstance(store, SqliteEventStore)
        assert store.path == tmp_path / "sub" / "dir" / "events.db"
        assert store.path.exists()
    finally:
        await store.close()


def test_parse_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_url("sqlite:///rel/x.db").path == tmp_path / "rel" / "x.db"
    assert parse_url("sqlite:////abs/x.db").path == Path("/abs/x.db")
    pg = parse_url("postgresql://u@h:5432/db")
    assert (pg.kind, pg.dsn) == ("postgresql", "postgresql://u@h:5432/db")
    assert parse_url("postgres://h/db").kind == "postgresql"


@pytest.mark.parametrize(
    "url",
    ["sqlite://x.db", "sqlite:///", "sqlite:///:memory:", "sqlite:///x.db?mode=ro", "mysql://h/d"],
)
def test_bad_url_names_the_setting(url: str) -> None:
    with pytest.raises(ConfigError, match=r"event_store \(STREAMAPP_EVENT_STORE\)"):
        parse_url(url)


async def test_an_unopenable_file_names_the_setting(tmp_path: Path) -> None:
    (tmp_path / "not-a-db").write_bytes(b"x" * 4096)
    with pytest.raises(ConfigError, match=r"STREAMAPP_EVENT_STORE.*cannot open"):
        await open_store(f"sqlite:///{tmp_path}/not-a-db")


async def test_the_worker_lock_file_goes_with_its_holder_and_a_removed_one_is_no_lock(
    tmp_path: Path,
) -> None:
    """The holder removes the lock file as it lets go; a descriptor opened on the file
    before it went (a taker that lost that race) locks a file that is no longer the lock,
    and the take checks for it, so two holders never overlap."""
    first, second = await open_store(f"sqlite:///{tmp_path}/e.db"), None
    path = tmp_path / "e.db.worker-app.lock"
    try:
        second = await open_store(f"sqlite:///{tmp_path}/e.db")
        async with first.worker_lock("app"):
            assert path.exists()
            stale = os.open(path, os.O_RDWR)  # a taker between its open and its lock
            with pytest.raises(ConfigError, match="another worker of app 'app'"):
                async with second.worker_lock("app"):
                    pass
        assert not path.exists()
        async with second.worker_lock("app"):
            fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the old file: not the lock
            assert not _same_file(stale, path)
            os.close(stale)
        assert not path.exists()
    finally:
        await first.close()
        if second is not None:
            await second.close()
