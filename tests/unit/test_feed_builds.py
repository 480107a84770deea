"""The one event-store feed serves whole partitions before lanes that build beside live
ones: a partition catching up is released at the store's head without waiting for a
building lane's share, however slow that lane is."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamapp import Event
from streamapp.catchup.feed import StoreFeed
from streamapp.engine.attempts import Attempts
from streamapp.eventstore import Append, open_store
from streamapp.records import Delivery
from streamapp.topics import TopicSpec
from tests.support.waits import finished


class Member:
    """A partition (or a building lane) as the feed sees it: applies its share at once,
    or, given ``gate``, only once the gate opens."""

    def __init__(self, name: str, *, building: bool, gate: asyncio.Event | None = None):
        self.name, self.building, self._gate = name, building, gate
        self.topic, self.partition = TopicSpec("t", 1), 0
        self.position, self.replayed, self.catching_up = 1, 0, True
        self.live = self.stopped = False

    def history_position(self) -> int:
        return self.position

    async def apply_history(
        self, deliveries: Sequence[Delivery], next_position: int, start: int
    ) -> bool:
        if self._gate is not None:
            await self._gate.wait()
        self.replayed += len(deliveries)
        self.position = next_position
        return True

    def retry_pause_s(self) -> float:
        return 0.01

    def failing(self) -> list[Attempts]:
        return []

    def stuck(self, on: dict[str, object] | None) -> None:
        pass

    def follow(self, on: bool) -> None:
        pass


async def test_a_partition_is_released_before_a_building_lane_applies_its_share(
    tmp_path: Path,
) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    await store.append_many(
        [Append(f"s{i}", [Event.create("x", stream_id=f"s{i}")]) for i in range(50)]
    )
    feed = StoreFeed(store, poll_s=0.01)
    gate = asyncio.Event()
    building = Member("orders[0] (building v2)", building=True, gate=gate)
    whole = Member("orders[1]", building=False)
    feed.start()
    try:
        build = asyncio.create_task(feed.catch_up(building))  # joined first
        await asyncio.sleep(0)
        await finished(  # not held by the gated lane: it stands still if it is
            feed.catch_up(whole),
            what="orders[1] caught up",
            progress=lambda: (whole.replayed, whole.position),
        )
        assert whole.replayed == 50
        assert not build.done()
        assert building.replayed == 0
        gate.set()
        await finished(
            build,
            what="the build caught up",
            progress=lambda: (building.replayed, building.position),
        )
        assert building.replayed == 50
    finally:
        gate.set()
        await feed.stop()
        await store.close()


class FlakyReads:
    """The event store with reads 2 and 3 failing (the read ahead, then its retry), as a
    store that went away and came back; every other call goes to the store."""

    def __init__(self, store: Any) -> None:
        self.store, self.url, self.calls = store, store.url, 0

    async def read_rows(self, start: int, limit: int) -> Any:
        self.calls += 1
        if self.calls in (2, 3):
            raise ConnectionError("the store went away")
        return await self.store.read_rows(start, limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


async def test_failed_reads_are_tried_again_and_every_member_gets_every_event_once(
    tmp_path: Path,
) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    await store.append_many(
        [Append(f"s{i}", [Event.create("x", stream_id=f"s{i}")]) for i in range(45)]
    )
    flaky = FlakyReads(store)
    feed = StoreFeed(flaky, chunk=10, poll_s=0.01)
    members = [Member(f"orders[{p}]", building=False) for p in range(2)]
    feed.start()
    try:
        await finished(
            asyncio.gather(*(feed.catch_up(m) for m in members)),
            what="every member caught up",
            progress=lambda: (flaky.calls, *((m.replayed, m.position) for m in members)),
        )
        assert [(m.replayed, m.position) for m in members] == [(45, 46), (45, 46)]
        assert flaky.calls > 3  # the failed reads were made again
    finally:
        await feed.stop()
        await store.close()
