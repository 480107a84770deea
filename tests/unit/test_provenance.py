"""What a partition's state was made from: recorded, carried, checked, adopted once.

The refusals themselves run in worker processes on the real services
(tests/integration/test_state_provenance.py); here the pieces they rest on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from streamapp import Event, FromEventStore, Table, TableView
from streamapp.agents.agent import Agent
from streamapp.catchup.feed import StoreFeed
from streamapp.engine.phase import Phase
from streamapp.engine.task import PartitionTask
from streamapp.errors import APP_REF, StateMismatchError, StoreFormatError
from streamapp.eventstore import Append, open_store
from streamapp.eventstore.base import display_url
from streamapp.tables.checkpoint import Checkpoint
from streamapp.tables.partition import CHECKPOINT_KEY, META, spaces_for
from streamapp.tables.store import MemoryStore, RocksStore
from streamapp.topics import TopicSpec
from tests.support.doubles import MemoryPort
from tests.support.tasks import feed_factory

TABLE: Table[int] = Table("t")


def test_the_provenance_is_encoded_and_carried_by_the_changelog_record() -> None:
    cp = Checkpoint(live=3, history=9, caught_up=True, store="s1", partitions=4, tables=("t",))
    assert Checkpoint.decode(cp.encode()) == cp
    assert Checkpoint(changelog=7).with_positions(cp.positions()) == Checkpoint(
        live=3, history=9, caught_up=True, changelog=7, store="s1", partitions=4, tables=("t",)
    )


def test_a_checkpoint_of_an_older_streamapp_is_read_without_provenance() -> None:
    old = orjson.dumps({"format": 2, "live": 5, "history": 3, "caught_up": True})
    cp = Checkpoint.decode(old)
    assert (cp.live, cp.history, cp.caught_up) == (5, 3, True)
    assert (cp.store, cp.partitions, cp.tables) == (None, None, None)
    # An older changelog record keeps the provenance the store already has.
    mine = Checkpoint(store="s1", partitions=4, tables=("t",))
    assert mine.with_positions(old).store == "s1"
    assert mine.with_positions(old).partitions == 4


def test_urls_in_messages_leave_the_password_out() -> None:
    assert display_url("postgresql://app:s3cret@db:5432/es") == "postgresql://app@db:5432/es"
    assert display_url("postgresql://app@db/es?x=1") == "postgresql://app@db/es?x=1"
    assert display_url("sqlite:////tmp/e.db") == "sqlite:////tmp/e.db"


def test_the_fix_names_the_app_as_the_worker_was_started() -> None:
    exc = StateMismatchError(f"run `streamapp reset -A {APP_REF} --yes`")
    assert str(exc.for_app("shop.app:app")) == "run `streamapp reset -A shop.app:app --yes`"


async def test_a_sqlite_store_keeps_its_identity_and_a_new_file_gets_another(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    async with await open_store(url) as store:
        first = await store.store_id()
    async with await open_store(url) as store:
        assert await store.store_id() == first
    _remove(tmp_path / "events.db")
    async with await open_store(url) as store:
        assert await store.store_id() != first


def _remove(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def test_spaces_an_open_made_and_nothing_wrote_are_gone_after_close(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = RocksStore(path, ["meta", "t:a"])
    store.write({"meta": {b"k": b"v"}})
    store.close()
    RocksStore(path, ["meta", "t:a", "t:b"]).close()  # refused, say: t:b is not kept
    store = RocksStore(path, ["meta", "t:a"])  # the change undone: it opens
    assert store.get("meta", b"k") == b"v"
    store.close()
    written = RocksStore(path, ["meta", "t:a", "t:b"])
    written.write({"t:b": {b"x": b"1"}})
    written.close()
    with pytest.raises(StoreFormatError, match="t:b"):
        RocksStore(path, ["meta", "t:a"])


def _task(agent: Agent, memory: MemoryStore, feed: StoreFeed) -> PartitionTask:
    return feed_factory(feed).create(
        agent,
        0,
        MemoryPort(),
        name="topic[0]",
        open_store=lambda agent, spaces: memory,
    )


async def test_an_older_checkpoint_is_adopted_once_and_another_store_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def handler(event: Event, view: TableView[int]) -> None:
        pass

    agent = Agent("a", handler, TopicSpec("topic", 1), (TABLE,), history=FromEventStore())
    memory = MemoryStore(spaces_for([TABLE]))
    old: dict[str, Any] = {"format": 2, "live": 0, "history": 4, "caught_up": True}
    memory.write({META: {CHECKPOINT_KEY: orjson.dumps(old)}})
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    await store.append_many(
        [Append(f"s{i}", [Event.create("x", stream_id=f"s{i}")]) for i in range(3)]
    )
    feed = StoreFeed(store, poll_s=0.01)
    try:
        with caplog.at_level(logging.WARNING, "streamapp.partition"):
            task = _task(agent, memory, feed)
            await task.open()
            assert task.phase is Phase.LIVE
            await task.close()
        adopted = [r for r in caplog.records if "adopted" in r.getMessage()]
        assert len(adopted) == 1
        assert "partition count 1" in adopted[0].getMessage()
        recorded = Checkpoint.decode(memory.get(META, CHECKPOINT_KEY))
        assert recorded.store == await store.store_id()
        assert (recorded.partitions, recorded.tables) == (1, ("t",))
        caplog.clear()
        with caplog.at_level(logging.WARNING, "streamapp.partition"):
            task = _task(agent, memory, feed)
            await task.open()  # recorded now: no second adoption
            await task.close()
        assert not [r for r in caplog.records if "adopted" in r.getMessage()]

        other = recorded.advanced(store="another")
        memory.write({META: {CHECKPOINT_KEY: other.encode()}})
        with pytest.raises(StateMismatchError, match="made from event store another"):
            await _task(agent, memory, feed).open()
    finally:
        await feed.stop()
        await store.close()
