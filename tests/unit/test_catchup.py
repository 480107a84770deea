"""Catch-up then live on a real SQLite event store, with appends racing the handover.

The feed (one reader per worker) must never hand a stored chunk to a partition that has
gone live, and the handover must leave ``caught_up`` in the checkpoint, never before the
last replayed chunk is committed (a crash after an earlier chunk would restart as caught
up: live at once, its views answering from part of the history); a recording
transaction keeps every batch so that two batches in flight at once would show.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamapp import Event, FromEventStore, Table, TableView
from streamapp.agents.agent import Agent
from streamapp.catchup.feed import StoreFeed
from streamapp.engine.phase import Phase
from streamapp.engine.task import PartitionTask
from streamapp.eventstore import Append, open_store
from streamapp.tables.partition import spaces_for
from streamapp.tables.store import MemoryStore
from streamapp.topics import TopicSpec
from tests.support.doubles import MemoryPort, RecordingTransaction
from tests.support.tasks import feed_factory, until_live
from tests.support.waits import until

TABLE: Table[int] = Table("t")


async def test_appends_racing_the_handover_never_reach_a_live_partition(tmp_path: Path) -> None:
    applied: list[tuple[str, Phase]] = []
    task_ref: list[PartitionTask] = []

    async def handler(event: Event, view: TableView[int]) -> None:
        applied.append((event.id, task_ref[0].phase))
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + 1
        await asyncio.sleep(0)  # an await inside the handler, as real ones have

    agent = Agent("a", handler, TopicSpec("topic", 1), (TABLE,), history=FromEventStore())
    url = f"sqlite:///{tmp_path / 'events.db'}"
    store = await open_store(url)
    await store.append_many([Append(f"s{i % 7}", [_ev(f"h{i}", f"s{i % 7}")]) for i in range(300)])
    feed = StoreFeed(store, chunk=50, poll_s=0.01)
    memory = MemoryStore(spaces_for([TABLE]))
    changelog, port = RecordingTransaction(commit_s=0.002), MemoryPort()

    task = feed_factory(feed).create(
        agent,
        0,
        port,
        name="topic[0]",
        open_store=lambda agent, spaces: memory,
        transaction=changelog,
    )
    task_ref.append(task)
    feed.start()
    task.start()
    appended = 300

    async def raced() -> bool:  # appends race the catch-up and the handover
        nonlocal appended
        if task.phase is Phase.LIVE:
            return True
        await store.append_many([Append("late", [_ev(f"late{appended}", "late")])])
        appended += 1
        return False

    await until(  # the replay's count, not the appends: those move by themselves
        raced,
        what="the task live while appends race it",
        progress=lambda: (task.phase, task.counts.replayed),
        poll_s=0.001,
    )
    for _ in range(20):  # the feed keeps reading meanwhile: it must not feed a live task
        await store.append_many([Append("late", [_ev(f"late{appended}", "late")])])
        appended += 1
        await asyncio.sleep(0.005)
    try:
        assert task.phase is Phase.LIVE
        assert not [eid for eid, phase in applied if phase is not Phase.CATCHING_UP]
        assert changelog.overlaps == 0
        tables = task.tables
        assert tables is not None
        cp = tables.checkpoint
        assert cp.caught_up
        assert changelog.batches[-1].checkpoint.caught_up  # the marker is in the changelog
        replayed = cp.history
        assert replayed is not None
        # Chunk by chunk without the marker; it comes with the replay's end position only.
        marks = [(b.checkpoint.history, b.checkpoint.caught_up) for b in changelog.batches]
        assert len(marks) > 2, marks
        assert not marks[0][1], marks
        assert all(at == replayed for at, caught_up in marks if caught_up), marks
        assert len(applied) == replayed - 1  # each stored event below the position, once
        assert len({eid for eid, _ in applied}) == len(applied)
        counted = sum(v for _, v in tables.views[0].items())
        assert counted == replayed - 1
        assert port.begun == [None]  # no forwarder marks: from the topic's beginning
    finally:
        await task.close()
        await feed.stop()
        await store.close()


def _ev(eid: str, stream_id: str) -> Event:
    return Event.create("x", stream_id=stream_id, id=eid)


async def test_a_replayed_event_failing_mid_chunk_is_retried_from_it_and_applied_once(
    tmp_path: Path,
) -> None:
    """Two partitions share each chunk; an event of one fails twice under Redeliver. The
    reads that follow hand that partition only what follows its checkpoint, so every
    event is handled once (the failed one three times) and counted once."""
    from streamapp.failures.outcomes import Redeliver
    from streamapp.tables.store import RocksStore
    from streamapp.topics import partition_for

    streams = [f"s{i}" for i in range(12)]
    assert {partition_for(s.encode(), 2) for s in streams} == {0, 1}
    fails = {"left": 2}
    handled: list[str] = []

    async def handler(event: Event, view: TableView[int]) -> None:
        handled.append(event.id)
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + 1
        if event.id == "e150" and fails["left"]:
            fails["left"] -= 1
            raise RuntimeError("not yet")  # its write is rolled back

    agent = Agent(
        "a",
        handler,
        TopicSpec("topic", 2),
        (TABLE,),
        on_failure=Redeliver(pause_s=0.0),
        history=FromEventStore(),
    )
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    appends = [Append(streams[i % 12], [_ev(f"e{i}", streams[i % 12])]) for i in range(400)]
    await store.append_many(appends)
    feed = StoreFeed(store, chunk=100, poll_s=0.01)

    def opener(p: int) -> Callable[[Agent, list[str]], RocksStore]:
        return lambda agent, spaces: RocksStore(tmp_path / str(p), spaces)

    tasks = [
        feed_factory(feed).create(
            agent,
            p,
            MemoryPort(),
            name=f"topic[{p}]",
            open_store=opener(p),
        )
        for p in (0, 1)
    ]
    feed.start()
    for task in tasks:
        task.start()
    try:
        await until_live(tasks)
        assert all(t.phase is Phase.LIVE for t in tasks)
        assert fails["left"] == 0
        assert sorted(handled) == sorted([f"e{i}" for i in range(400)] + ["e150"] * 2)
        counts: dict[str, int] = {}
        for task in tasks:
            assert task.tables is not None
            assert task.tables.checkpoint.history == 401
            for key, value in task.tables.views[0].items():
                assert partition_for(key.encode(), 2) == task.partition
                counts[key] = value
        assert counts == {s: sum(1 for a in appends if a.stream_id == s) for s in streams}
    finally:
        for task in tasks:
            await task.close()
        await feed.stop()
        await store.close()


def test_a_share_iterates_indexes_and_slices_as_deliveries() -> None:
    from streamapp.engine.stored import Share, StoredDelivery

    rows = [(10, "a", 1, b"A"), (11, "b", 1, b"B"), (12, "c", 2, b"C"), (13, "d", 1, b"D")]
    share = Share(rows, [0, 2, 3], "topic", 5)
    assert len(share) == 3
    assert list(share) == [share[0], share[1], share[2]]
    assert share[1] == StoredDelivery(12, "c", 2, b"C", "topic", 5, ())
    assert share[1].version == 2
    assert share[1].key == b"c"
    assert share[1].headers == ()
    tail = share[1:]
    assert [d.position for d in tail] == [12, 13]
    assert tail[0].topic == "topic"
    assert tail[0].partition == 5


async def test_replay_parts_cut_by_the_budget_and_chunk_edges_apply_every_event_once(
    tmp_path: Path,
) -> None:
    """A zero time budget commits each stored event as a part of its own, and chunks of
    7 rows cut the store at odd places: every event is handled once, the store position
    reaches past the last, and the version of each stream is its event count."""
    handled: list[str] = []

    async def handler(event: Event, view: TableView[int]) -> None:
        handled.append(event.id)
        sid = event.stream_id
        assert sid is not None
        view[sid] = view.get(sid, 0) + 1

    agent = Agent("a", handler, TopicSpec("topic", 1), (TABLE,), history=FromEventStore())
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    appends = [Append(f"s{i % 5}", [_ev(f"e{i}", f"s{i % 5}")]) for i in range(60)]
    await store.append_many(appends)
    feed = StoreFeed(store, chunk=7, poll_s=0.01)
    changelog = RecordingTransaction()

    task = feed_factory(feed, batch_budget_s=0.0).create(
        agent,
        0,
        MemoryPort(),
        name="topic[0]",
        open_store=lambda agent, spaces: MemoryStore(spaces),
        transaction=changelog,
    )
    feed.start()
    task.start()
    try:
        await until_live([task])
        assert task.phase is Phase.LIVE
        assert handled == [f"e{i}" for i in range(60)]
        tables = task.tables
        assert tables is not None
        assert tables.checkpoint.history == 61
        assert dict(tables.views[0].items()) == {f"s{i}": 12 for i in range(5)}
        assert {tables.applied_version(f"s{i}") for i in range(5)} == {12}
        positions = [b.checkpoint.history for b in changelog.batches]
        assert positions == sorted(positions)  # each part's commit moves it forward
        assert len(changelog.batches) >= 60  # a part per event (the budget cut each)
        assert task.counts.replayed == 60
    finally:
        await task.close()
        await feed.stop()
        await store.close()


async def test_the_replay_skips_what_its_tables_applied_by_the_store_column_undecoded(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A replay reads each row's stream version from the store's column: an event its
    tables applied already (the per-key guard's skip, FILTERED) is passed over without
    its payload being decoded; the rest decode and apply once."""
    import streamapp.engine.replay as replay_module
    from streamapp.failures.outcomes import Outcome
    from streamapp.tables.partition import VERSIONS, encode_version

    decoded: list[int] = []
    decode = replay_module.decode_stored

    def counting(delivery: Any) -> Event:
        decoded.append(delivery.position)
        return decode(delivery)

    monkeypatch.setattr(replay_module, "decode_stored", counting)
    seen: list[str] = []

    async def handler(event: Event, view: TableView[int]) -> None:
        seen.append(event.id)

    agent = Agent("a", handler, TopicSpec("topic", 1), (TABLE,), history=FromEventStore())
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    await store.append_many(
        [Append("s", [Event.create("x", stream_id="s", id=f"s{v}")]) for v in range(1, 7)]
        + [Append("t", [Event.create("x", stream_id="t", id="t1")])]
    )
    memory = MemoryStore(spaces_for([TABLE]))
    memory.write({VERSIONS: {b"s": encode_version(4)}})  # s applied up to 4 (a handover)
    feed = StoreFeed(store, chunk=50, poll_s=0.01)
    task = feed_factory(feed).create(
        agent, 0, MemoryPort(), name="topic[0]", open_store=lambda agent, spaces: memory
    )
    feed.start()
    task.start()
    try:
        await until_live([task])
        assert seen == ["s5", "s6", "t1"]
        assert decoded == [5, 6, 7]  # positions 1-4 skipped by their column, undecoded
        outcomes = task.outcomes
        assert outcomes[Outcome.FILTERED] == 4
        assert outcomes[Outcome.DELIVERED] == 3
    finally:
        await task.close()
        await feed.stop()
        await store.close()
