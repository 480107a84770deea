"""Deliveries fetched ahead (engine/ahead.py): a prefetching source (Kafka) keeps
fetching a partition while its batch runs and commits; what arrives meanwhile runs next,
once and in order, and is dropped (fetched again) whenever the task rewinds or must end
its batch (a redelivery, a building lane waiting to join)."""

from __future__ import annotations

import asyncio

from streamapp import App, Event, FencedError, Table, TableView
from streamapp.engine.ahead import Ahead
from streamapp.engine.task import PartitionTask
from streamapp.tables.store import Store
from tests.support.doubles import MemoryPort as Port
from tests.support.doubles import RecordingTransaction as Transaction
from tests.unit.test_commit import records, task


def _app(calls: list[str], gate: asyncio.Event, fail: str = "") -> App:
    """``keep`` counts events in a table; it waits for ``gate`` on event ``e0`` (a batch
    in hand while more is fetched) and raises on event ``fail``."""
    app = App("t")
    kept: Table[int] = Table("kept")

    @app.agent(app.topic("in", partitions=1), tables=[kept])
    async def keep(event: Event, kept: TableView[int]) -> None:
        if event.id == "e0":
            await gate.wait()
        if event.id == fail:
            raise RuntimeError("keep fails")
        calls.append(event.id)
        kept["n"] = kept.get("n", 0) + 1

    return app


async def _live(app: App, port: Port, txn: Transaction) -> PartitionTask:
    stores: dict[str, Store] = {}
    t = task(app, port, stores, transaction=txn)
    await t.open()
    return t


async def test_what_is_fetched_while_a_batch_runs_runs_next_once_in_order_unpaused() -> None:
    calls: list[str] = []
    gate, port, txn = asyncio.Event(), Port(), Transaction()
    t = await _live(_app(calls, gate), port, txn)
    t.feed(records("e0", "e1"), prefetch=True)
    assert t.busy
    assert not port.paused
    await asyncio.sleep(0)
    assert t.queueing
    t.ahead.add(records("e2", "e3", start=2))
    t.ahead.add(records("e3", "e4", start=3))  # e3 again (a refetch): taken once
    gate.set()
    assert t._batch is not None
    await t._batch
    assert calls == ["e0", "e1", "e2", "e3", "e4"]
    assert [settled for settled, _ in port.settled] == [2, 5]  # two batches, two commits
    assert len(txn.commits) == 2
    assert not t.busy
    assert not port.paused
    assert not t.queueing
    assert not t.ahead.waiting
    assert port.rewound == []  # nothing was dropped, nothing fetched twice
    await t.close()


async def test_a_redelivery_drops_what_was_fetched_ahead_and_rewinds_to_the_failed_one() -> None:
    calls: list[str] = []
    gate, port, txn = asyncio.Event(), Port(), Transaction()
    t = await _live(_app(calls, gate, fail="e1"), port, txn)
    t.feed(records("e0", "e1"), prefetch=True)
    await asyncio.sleep(0)
    t.ahead.add(records("e2", "e3", start=2))
    gate.set()
    assert t._batch is not None
    await t._batch
    assert calls == ["e0"]  # e1 failed; e2 and e3 are not run past it
    assert port.rewound == [1]
    assert not t.ahead.waiting
    assert not t.queueing
    assert not port.paused  # resumed after the (zero) redelivery pause
    await t.close()


async def test_a_lane_waiting_to_join_ends_the_batch_after_itself() -> None:
    calls: list[str] = []
    gate, port, txn = asyncio.Event(), Port(), Transaction()
    t = await _live(_app(calls, gate), port, txn)
    t.feed(records("e0", "e1"), prefetch=True)
    await asyncio.sleep(0)
    t.ahead.add(records("e2", start=2))
    t.joining = 1  # a building lane waits for the task to be idle (engine.build)
    gate.set()
    assert t._batch is not None
    await t._batch
    assert calls == ["e0", "e1"]
    assert port.rewound == [2]  # e2 is fetched again once the lane joined
    assert not t.busy
    await t.close()


def test_a_full_queue_pauses_the_partition_until_it_is_taken() -> None:
    port = Port()
    ahead = Ahead(port, limit=3)
    ahead.start(prefetch=True)
    assert ahead.taking
    assert not port.paused
    ahead.add(records("a", "b"))
    assert not port.paused
    ahead.add(records("c", start=2))
    assert port.paused  # 3 waiting: no more fetched meanwhile
    assert [d.position for d in ahead.take()] == [0, 1, 2]
    assert not port.paused
    assert ahead.waiting == []
    ahead.add(records("d", start=3))
    assert ahead.hold() is True  # dropped: the task rewinds before it resumes
    assert port.paused
    assert not ahead.taking
    assert ahead.waiting == []
    assert ahead.hold() is False


def test_a_source_that_cannot_prefetch_pauses_for_each_batch() -> None:
    port = Port()
    ahead = Ahead(port, limit=3)
    ahead.start(prefetch=False)
    assert port.paused
    assert not ahead.taking


async def test_a_partition_lost_while_its_batch_runs_is_left_paused() -> None:
    calls: list[str] = []
    gate, port, txn = asyncio.Event(), Port(), Transaction()
    t = await _live(_app(calls, gate), port, txn)
    t.feed(records("e0", "e1"), prefetch=True)
    await asyncio.sleep(0)
    assert not port.paused
    t.mark_lost(FencedError("another worker took the partition over"))  # e.g. a build fenced
    gate.set()
    assert t._batch is not None
    await t._batch
    assert port.paused  # not fetched on for a partition this worker gave up
    assert not t.queueing
    await t.close()
