"""A lane behind builds on its own inside a live partition task (engine/build.py):
the task is live, the lane ``catching_up``; live deliveries run through the live lane
and settle while the build replays; then the lane goes live at the position noted
before its last read (the partition rewinds there) and holds every event once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from streamapp import Event, FromEventStore, Table, TableView
from streamapp.agents.agent import Agent
from streamapp.catchup.feed import StoreFeed
from streamapp.codecs import kafka as codec
from streamapp.engine.phase import Phase
from streamapp.errors import PhaseTransitionError
from streamapp.eventstore import Append, open_store
from streamapp.eventstore.base import EventStoreBackend
from streamapp.records import DeliveryRecord
from streamapp.tables.checkpoint import Checkpoint
from streamapp.tables.partition import CHECKPOINT_KEY, META, spaces_for
from streamapp.tables.store import MemoryStore
from streamapp.topics import TopicSpec
from tests.support.doubles import MemoryPort
from tests.support.tasks import feed_factory, until_live
from tests.support.waits import until

V1: Table[int] = Table("counts")
V2: Table[int] = Table("counts", version=2)
TOPIC = TopicSpec("orders", 1)


def _event(i: int) -> Event:
    return Event.create("x", stream_id=f"s{i % 5}", id=f"e{i}", extensions={})


async def test_a_new_version_builds_while_the_live_lane_settles(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    await store.append_many([Append(f"s{i % 5}", [_event(i)]) for i in range(200)])

    async def v1(event: Event, counts: TableView[int]) -> None:
        sid = event.stream_id or ""
        counts[sid] = counts.get(sid, 0) + 1

    async def v2(event: Event, counts: TableView[int]) -> None:
        await asyncio.sleep(0.002)  # slower than live: the build lasts
        sid = event.stream_id or ""
        counts[sid] = counts.get(sid, 0) + 1

    one = Agent("v1", v1, TOPIC, (V1,), history=FromEventStore())
    two = Agent("v2", v2, TOPIC, (V2,), history=FromEventStore())
    stores = {"v1": MemoryStore(spaces_for([V1])), "v2": MemoryStore(spaces_for([V2]))}
    held = Checkpoint(live=0, history=201, caught_up=True, partitions=1, tables=("counts",))
    stores["v1"].write({META: {CHECKPOINT_KEY: held.encode()}})  # v1 live, all applied
    stores["v1"].write({"t:counts": {f"s{k}".encode(): b"40" for k in range(5)}})
    feed = StoreFeed(store, poll_s=0.01)
    port = MemoryPort()

    task = feed_factory(feed).create(
        [one, two], 0, port, name="orders[0]", open_store=lambda a, s: stores[a.name]
    )
    lane1, lane2 = task.lanes
    feed.start()
    task.start()
    try:
        await until_live([task])
        assert (task.phase, lane1.phase, lane2.phase) == (
            Phase.LIVE,
            Phase.LIVE,
            Phase.CATCHING_UP,
        )
        assert task.status()["agents"]["v2"]["phase"] == "catching_up"  # type: ignore[index]
        with pytest.raises(PhaseTransitionError, match="of agent v2"):
            task.transition_lane(lane2, Phase.SUSPENDED)
        assert not await task.suspend()  # a building task is not kept over a rebalance

        # live events (stored first, as the forwarder publishes only what is stored)
        live = [_event(i) for i in range(200, 230)]
        await store.append_many([Append(e.stream_id or "", [e]) for e in live])
        for offset, event in enumerate(live):
            key, value, headers = codec.encode(event)
            port.records.append(DeliveryRecord("orders", 0, offset, key, value, headers))
        await _accepting(task)
        task.feed(port.pending())
        await until(
            lambda: task.next_position == 30 and not task.busy,
            what="the live batch settled",
            progress=lambda: task.next_position,
            poll_s=0.005,
        )
        assert lane2.phase is Phase.CATCHING_UP, "the build ended before the live batch"
        assert port.settled[-1][0] == 30  # settled by the live lane alone
        assert lane1.tables is not None
        assert sum(v for _, v in lane1.tables.views[0].items()) == 230

        await until(
            lambda: _phase(lane2) is Phase.LIVE,
            what="v2's lane live",
            progress=lambda: (_phase(lane2), lane2.history_position()),
            poll_s=0.01,
        )
        assert _phase(lane2) is Phase.LIVE
        # joined where the live lanes stood before its last read (rewound there if below)
        assert lane2.next is not None
        assert lane2.next <= 30
        assert lane2.next == 30 or port.rewound[-1] == lane2.next
        await _accepting(task)
        task.feed(port.pending())  # what the rewind gives again: v1 skips it
        await until(
            lambda: not task.busy and lane2.next == 30,
            what="the rewound records settled",
            progress=lambda: lane2.next,
            poll_s=0.005,
        )
        assert lane2.tables is not None
        assert dict(lane2.tables.views[0].items()) == {f"s{k}": 46 for k in range(5)}
        assert dict(lane1.tables.views[0].items()) == {f"s{k}": 46 for k in range(5)}
        assert lane2.tables.checkpoint.caught_up
    finally:
        await task.close()
        await feed.stop()
        await store.close()


def _phase(lane: Any) -> Phase:
    """A lane's phase now (it changes under the test's awaits)."""
    phase: Phase = lane.phase
    return phase


async def _accepting(task: Any) -> None:
    for _ in range(1000):
        if task.accepting:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{task.name} never took deliveries: {task.phase}")


async def _v2_behind_v1(
    tmp_path: Path,
) -> tuple[EventStoreBackend, Agent, Agent, dict[str, MemoryStore]]:
    """300 events in a SQLite store over 5 streams; v1 and v2 of one count, v1 applied up
    to store position 200 and v2 up to 100 (both caught up): a build behind the live lane."""
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    await store.append_many([Append(f"s{i % 5}", [_event(i)]) for i in range(300)])

    async def fold(event: Event, counts: TableView[int]) -> None:
        sid = event.stream_id or ""
        counts[sid] = counts.get(sid, 0) + 1

    one = Agent("v1", fold, TOPIC, (V1,), history=FromEventStore())
    two = Agent("v2", fold, TOPIC, (V2,), history=FromEventStore())
    stores = {"v1": MemoryStore(spaces_for([V1])), "v2": MemoryStore(spaces_for([V2]))}
    for name, at, label in (("v1", 201, "counts"), ("v2", 101, V2.label)):  # v2 behind
        cp = Checkpoint(live=0, history=at, caught_up=True, partitions=1, tables=(label,))
        stores[name].write({META: {CHECKPOINT_KEY: cp.encode()}})
    return store, one, two, stores


async def test_a_share_cut_above_a_lanes_position_leaves_that_lane_where_it_stands(
    tmp_path: Path,
) -> None:
    """The store's followers apply a share cut at the position they stood at; a build
    that joined them meanwhile (below it) must not be moved past events it never had."""
    from streamapp.engine.stored import Share

    store, one, two, stores = await _v2_behind_v1(tmp_path)

    feed = StoreFeed(store)  # not started: the test hands the share itself
    task = feed_factory(feed).create(
        [one, two], 0, MemoryPort(), name="orders[0]", open_store=lambda a, s: stores[a.name]
    )
    lane1, lane2 = task.lanes
    task.start()
    try:
        await _accepting(task)
        task.replay.follow(True)  # the store is its live source (embedded)
        task.replay.lanes = [lane1, lane2]  # v2 joined the followers
        rows = await store.read_rows(201, 100)
        share = Share(rows, list(range(len(rows))), TOPIC.name, 0)
        assert await task.replay.apply_history(share, 301, 201)  # cut at v1's position
        assert (lane1.history_position(), lane2.history_position()) == (301, 101)
        assert lane2.tables is not None
        assert sum(v for _, v in lane2.tables.views[0].items()) == 0  # v2 got nothing
    finally:
        await task.close()
        await store.close()


class HeldReads:
    """The event store, with the read from ``held`` waiting at a gate (``reading`` is
    set once it started): a read in flight while a build joins the store's followers.
    Every other call goes to the store."""

    def __init__(self, store: Any, held: int) -> None:
        self.store, self.url, self.held = store, store.url, held
        self.reading, self.gate = asyncio.Event(), asyncio.Event()

    async def read_rows(self, start: int, limit: int) -> Any:
        rows = await self.store.read_rows(start, limit)
        if start == self.held and not self.gate.is_set():
            self.reading.set()
            await self.gate.wait()
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


async def test_a_build_joining_the_followers_during_their_read_gets_every_event(
    tmp_path: Path,
) -> None:
    """Embedded: the feed reads for the store's followers from v1's position (201); a
    build that catches up at a lower position (101) joins them while that read is in
    flight. The feed must not cut the follower's share from the read's start with the
    joined lane's position as its start: v2 would be moved to 301 without events
    101-200 (a v2 that ends keys events short, seen in test_table_versions_embedded)."""
    store, one, two, stores = await _v2_behind_v1(tmp_path)
    held = HeldReads(store, 201)
    feed = StoreFeed(held, poll_s=0.01)

    task = feed_factory(feed).create(
        [one, two], 0, MemoryPort(), name="orders[0]", open_store=lambda a, s: stores[a.name]
    )
    lane1, lane2 = task.lanes
    feed.start()
    task.start()
    try:
        await _accepting(task)
        task.replay.lanes = [lane1]  # the store's followers: v1 (embedded, as go_live sets)
        feed.follow(task.replay)
        await until(  # the followers' read from 201
            held.reading.is_set,
            what="the followers reading from 201",
            progress=lambda: (lane1.history_position(), lane2.history_position(), task.phase),
        )
        task.replay.lanes = [lane1, lane2]  # v2 joins them at 101 meanwhile
        held.gate.set()

        def positions() -> tuple[int, int]:
            return lane1.history_position(), lane2.history_position()

        await until(
            lambda: positions() == (301, 301),
            what="both lanes at the store's head",
            progress=positions,
            stalled_s=10,
            poll_s=0.005,
        )
        assert lane1.tables is not None
        assert lane2.tables is not None
        assert sum(v for _, v in lane1.tables.views[0].items()) == 100  # 201-300
        assert sum(v for _, v in lane2.tables.views[0].items()) == 200  # 101-300, none lost
    finally:
        held.gate.set()
        await task.close()
        await feed.stop()
        await store.close()
